"""``python -m slokit.sidecar ...`` = ``slokit sidecar ...`` (easy to start as a subprocess)."""

from slokit.cli.sidecar import command

if __name__ == "__main__":
    command(prog_name="slokit sidecar")
