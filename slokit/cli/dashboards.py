"""``slokit dashboards build``: write the Grafana dashboards (JSON) into a directory."""

from __future__ import annotations

from pathlib import Path

import click

from slokit.cli._common import handle_errors
from slokit.cli._generate import generator_options


@click.group("dashboards")
def command() -> None:
    """Grafana dashboards generated from the SLO spec and slokit's metric names."""


@command.command("build")
@click.option(
    "--out",
    "out_dir",
    default="dashboards",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Directory to write the dashboard JSON files into.",
)
@click.option(
    "--slo",
    "slo_file",
    type=click.Path(dir_okay=False),
    envvar="SLOKIT_SLO",
    help="SLO spec: per-class attainment panels and SLO bound thresholds.",
)
@generator_options
@handle_errors
def build(
    out_dir: str,
    slo_file: str | None,
    runbook_base_url: str,
    replica_label: str,
    gpu_replica_label: str,
) -> None:
    """Write slokit-{overview,latency,capacity,gpu}.json into --out."""
    # deferred: the spec loader (PyYAML) and the generators load only when this command
    # runs (``slokit --help`` stays fast)
    from slokit.analysis.slo_spec import load_spec
    from slokit.generate.dashboards import DashboardOptions, write_dashboards
    from slokit.generate.promql import Labels

    opts = DashboardOptions(
        labels=Labels(replica=replica_label, gpu_replica=gpu_replica_label),
        runbook_base_url=runbook_base_url,
        spec=load_spec(slo_file) if slo_file else None,
    )
    for path in write_dashboards(Path(out_dir), opts):
        click.echo(str(path))
