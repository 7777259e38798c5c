"""``slokit report --out report.html``: one self-contained HTML page about a run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

import slokit
from slokit.cli._common import handle_errors
from slokit.cli._sources import SourceOptions, open_reader, source_options
from slokit.errors import BadInput


@click.command("report")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="HTML file to write.")
@click.option(
    "--slo",
    "slo_file",
    required=True,
    type=click.Path(dir_okay=False),
    envvar="SLOKIT_SLO",
    help="SLO spec (YAML): classes, objectives, cost.",
)
@source_options("lake", "sidecar")
@click.option("--since", metavar="T", help="Window start; default: the oldest data.")
@click.option("--until", metavar="T", help="Window end; default: the newest data.")
@handle_errors
def command(out: str, slo_file: str, since: str | None, until: str | None, **source: Any) -> None:
    """Write an HTML report (plots, SLO attainment, cost, findings); no network needed to
    view it."""
    spec = slokit.load_spec(slo_file)
    with open_reader(SourceOptions.pop(source)) as reader:
        result = slokit.html_report(reader, spec, since, until)
    page = result.html
    try:
        Path(out).write_text(page, encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot write {out}: {exc.strerror or exc}") from exc
    requests = result.slo.report.overall.requests
    click.echo(f"wrote {out} ({len(page) // 1024} KiB, {requests} requests)")
