"""``slokit demo``: simulated replicas, sidecar, load, incident, findings, explain."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from slokit.cli._common import handle_errors


@click.command("demo")
@click.option(
    "--engine",
    type=click.Choice(["sim", "vllm"]),
    default="sim",
    show_default=True,
    help="Simulated replicas, or real vLLM on the CPU (needs .venv-vllm).",
)
@click.option(
    "--out",
    "out_dir",
    default="demo-out",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the DuckDB file, logs and report go.",
)
@click.option(
    "--scale",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.05, 10),
    help="Multiply the load phases' durations (0.3 for a quick smoke run).",
)
@handle_errors
def command(engine: str, out_dir: str, scale: float) -> None:
    """Run the whole job on one machine and print what an on-call engineer would see."""
    from slokit.lab.demo import DemoConfig, run_demo  # deferred: the lab (aiohttp, DuckDB)

    sys.exit(
        run_demo(
            DemoConfig(out_dir=Path(out_dir), engine=engine, scale=scale),
            echo=lambda s: click.echo(s),
        )
    )
