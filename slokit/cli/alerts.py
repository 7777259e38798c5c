"""``slokit alerts build``: write Prometheus rule files and an Alertmanager example."""

from __future__ import annotations

from pathlib import Path

import click

from slokit.cli._common import handle_errors
from slokit.cli._generate import generator_options


@click.group("alerts")
def command() -> None:
    """Prometheus alerting and recording rules generated from the SLO spec."""


@command.command("build")
@click.option(
    "--slo",
    "slo_file",
    required=True,
    type=click.Path(dir_okay=False),
    envvar="SLOKIT_SLO",
    help="SLO spec (YAML, slokit: v1).",
)
@click.option(
    "--out",
    "out_dir",
    default="alerts",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Directory to write the rule files into.",
)
@generator_options
@click.option(
    "--window-scale",
    default=1.0,
    show_default=True,
    type=float,
    help="Divide every window and 'for' duration by this (tests: 720 runs 1h as 5s).",
)
@click.option(
    "--evaluation-interval",
    default=None,
    help="Rule group evaluation interval (default: Prometheus' global one).",
)
@handle_errors
def build(
    slo_file: str,
    out_dir: str,
    runbook_base_url: str,
    replica_label: str,
    gpu_replica_label: str,
    window_scale: float,
    evaluation_interval: str | None,
) -> None:
    """Write <service>-slo.rules.yaml, symptoms.rules.yaml and alertmanager.example.yaml."""
    # deferred: the spec loader (PyYAML) and the generators load only when this command
    # runs (``slokit --help`` stays fast)
    from slokit.analysis.slo_spec import load_spec
    from slokit.generate.alerts import AlertOptions, write_alert_files
    from slokit.generate.promql import Labels

    opts = AlertOptions(
        runbook_base_url=runbook_base_url,
        scale=window_scale,
        labels=Labels(replica=replica_label, gpu_replica=gpu_replica_label),
        evaluation_interval=evaluation_interval,
    )
    for path in write_alert_files(load_spec(slo_file), Path(out_dir), opts):
        click.echo(str(path))
