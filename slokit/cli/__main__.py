"""``python -m slokit.cli`` runs the command line."""

from slokit.cli import main

main()
