"""``slokit slo report``: attainment, burn rate, goodput, percentiles and cost per SLO class."""

from __future__ import annotations

from typing import Any

import click

import slokit
from slokit.cli._common import handle_errors, print_json
from slokit.cli._sources import SourceOptions, open_reader, source_options
from slokit.timeutil import parse_duration


@click.group("slo")
def command() -> None:
    """SLO reports from the store, judged against an SLO spec."""


@command.command("report")
@click.option(
    "--slo",
    "slo_file",
    required=True,
    type=click.Path(dir_okay=False),
    envvar="SLOKIT_SLO",
    help="SLO spec (YAML, slokit: v1).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@source_options("lake", "prometheus", "sidecar")
@click.option(
    "--since",
    metavar="T",
    help="Window start (ISO 8601, Unix s, or e.g. 15m back "
    "from the newest data); default: the oldest data.",
)
@click.option("--until", metavar="T", help="Window end; default: the newest data.")
@click.option(
    "--sweep-by",
    metavar="run|DURATION",
    help="Also compute the DistServe max goodput, one sweep step per load run "
    "('run') or per time window (e.g. 60s).",
)
@handle_errors
def report(
    slo_file: str,
    as_json: bool,
    since: str | None,
    until: str | None,
    sweep_by: str | None,
    **source: Any,
) -> None:
    """Per class and overall: attainment, burn rate, observed goodput, latency percentiles
    with 95% confidence intervals, and cost (when the spec prices GPUs)."""
    sweep: str | float | None = None
    if sweep_by is not None:
        sweep = "run" if sweep_by == "run" else parse_duration(sweep_by)
    spec = slokit.load_spec(slo_file)
    with open_reader(SourceOptions.pop(source)) as reader:
        result = slokit.slo_report(reader, spec, since, until, sweep=sweep)
    if as_json:
        print_json(result.to_dict())
    else:
        click.echo(result.render_text())
