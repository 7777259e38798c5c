"""``slokit report --out report.html``: one self-contained HTML page about a run."""

from __future__ import annotations

from pathlib import Path

import click

from slokit.cli._common import db_option, handle_errors
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
@db_option
@click.option("--since", metavar="T", help="Window start; default: the oldest data.")
@click.option("--until", metavar="T", help="Window end; default: the newest data.")
@handle_errors
def command(out: str, slo_file: str, db: str, since: str | None, until: str | None) -> None:
    """Write an HTML report (plots, SLO attainment, cost, findings); no network needed to
    view it."""
    from slokit.analysis import cost as cost_mod
    from slokit.analysis import report_html, slo
    from slokit.analysis.slo_spec import load_spec
    from slokit.store.db import open_store
    from slokit.timeutil import parse_time

    spec = load_spec(slo_file)
    with open_store(db, read_only=True) as store:
        _, newest = slo.store_span(store.con)
        t0 = parse_time(since, newest) if since else None
        t1 = parse_time(until, newest) if until else None
        records = slo.load_records(store.con, t0, t1)
        rep = slo.evaluate(records, spec, since=t0, until=t1, sweep="run")
        w = rep.window
        energy = cost_mod.energy_increase(store.con, w.since, w.until)
        engine = report_html.engine_series(store.con, w.since, w.until)
        findings = report_html.stored_findings(store.con, w.since, w.until)
    cost = cost_mod.compute_cost(records, spec, duration_s=w.duration_s, energy_j=energy)
    page = report_html.render_html(
        service=spec.service,
        report=rep,
        cost=cost,
        records=records,
        spec=spec,
        engine=engine,
        findings=findings,
    )
    try:
        Path(out).write_text(page, encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot write {out}: {exc.strerror or exc}") from exc
    click.echo(f"wrote {out} ({len(page) // 1024} KiB, {rep.overall.requests} requests)")
