"""``python -m slokit`` runs the command line."""

from slokit.cli import main

main()
