"""``slokit slo report``: attainment, burn rate, goodput, percentiles and cost per SLO class."""

from __future__ import annotations

import click

from slokit.cli._common import db_option, handle_errors, print_json


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
@db_option
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
    db: str,
    since: str | None,
    until: str | None,
    sweep_by: str | None,
) -> None:
    """Per class and overall: attainment, burn rate, observed goodput, latency percentiles
    with 95% confidence intervals, and cost (when the spec prices GPUs)."""
    from slokit.analysis import cost as cost_mod
    from slokit.analysis import slo
    from slokit.analysis.slo_spec import load_spec
    from slokit.store.db import open_store
    from slokit.timeutil import parse_duration, parse_time

    spec = load_spec(slo_file)
    sweep: str | float | None = None
    if sweep_by is not None:
        sweep = "run" if sweep_by == "run" else parse_duration(sweep_by)
    with open_store(db, read_only=True) as store:
        _, newest = slo.store_span(store.con)
        t0 = parse_time(since, newest) if since else None
        t1 = parse_time(until, newest) if until else None
        records = slo.load_records(store.con, t0, t1)
        rep = slo.evaluate(records, spec, since=t0, until=t1, sweep=sweep)
        w = rep.window
        energy = cost_mod.energy_increase(store.con, w.since, w.until)
    cost = cost_mod.compute_cost(records, spec, duration_s=w.duration_s, energy_j=energy)
    if as_json:
        doc = rep.to_json()
        doc["cost"] = cost.to_json() if cost else None
        print_json(doc)
        return
    click.echo(slo.render_text(rep))
    if cost is not None:
        click.echo("")
        click.echo(cost_mod.render_text(cost))
