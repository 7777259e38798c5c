"""``slokit diagnose``: what is wrong with the fleet, with evidence and runbooks."""

from __future__ import annotations

from typing import Any

import click

import slokit
from slokit.cli._common import default_db, handle_errors, print_json
from slokit.cli._sources import SourceOptions, held_by_sidecar, open_reader, source_options
from slokit.errors import BadInput


@click.command("diagnose")
@click.option(
    "--since",
    metavar="T",
    help="Window start: ISO 8601, Unix seconds, or e.g. 15m back from the newest data.",
)
@click.option("--until", metavar="T", help="Window end (same forms); default the newest data.")
@click.option(
    "--baseline",
    "baseline",
    metavar="DURATION",
    default="1h",
    show_default=True,
    help="How much history before --since is the baseline (e.g. 30m).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis document as JSON.")
@source_options("lake", "prometheus", "sidecar")
@click.option(
    "--save",
    is_flag=True,
    help="Store the findings in the database (for explain); needs write access.",
)
@handle_errors
def command(
    since: str | None,
    until: str | None,
    baseline: str,
    as_json: bool,
    save: bool,
    **source: Any,
) -> None:
    """Diagnose the fleet over a window (default: all the data the source holds).

    Exit 0 when answered, 3 when there is no data in the window.
    """
    # deferred: the rules (pandas), the store and the sidecar client (httpx) load only when
    # this command runs
    from slokit.analysis.diagnose import render_text

    opts = SourceOptions.pop(source)
    if save and opts.chosen() != "db":
        raise BadInput("--save writes the database; a sidecar stores its own findings")
    sidecar = None if save else held_by_sidecar(opts)
    if sidecar is not None:
        from slokit.client import SidecarClient

        doc = SidecarClient(sidecar, token=opts.token).diagnose(since, until)
    elif save:
        from slokit.analysis.diagnose import store_findings

        with slokit.open_store(opts.db or default_db(), read_only=False) as store:
            result = slokit.diagnose(store, since, until, baseline=baseline)
            store_findings(store, result.findings, window=(result.since, result.until))
        doc = result.to_dict()
    else:
        with open_reader(opts) as reader:
            doc = slokit.diagnose(reader, since, until, baseline=baseline).to_dict()
    if as_json:
        print_json(doc)
    else:
        click.echo(render_text(doc))
