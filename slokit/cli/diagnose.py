"""``slokit diagnose``: what is wrong with the fleet, with evidence and runbooks."""

from __future__ import annotations

import click

from slokit.cli._common import db_option, handle_errors, print_json, running_sidecar


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
@db_option
@click.option("--sidecar", metavar="URL", help="Ask a running sidecar's API instead of the file.")
@click.option("--token", envvar="SLOKIT_TOKEN", help="Bearer token for --sidecar.")
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
    db: str,
    sidecar: str | None,
    token: str | None,
    save: bool,
) -> None:
    """Diagnose the fleet over a window (default: all the data the store holds).

    Exit 0 when answered, 3 when there is no data in the window.
    """
    from slokit.analysis.diagnose import render_text

    if sidecar:
        from slokit.client import SidecarClient

        if save:
            from slokit.errors import BadInput

            raise BadInput("--save writes the database; the sidecar stores its own findings")
        doc = SidecarClient(sidecar, token=token).diagnose(since, until)
    else:
        import slokit
        from slokit.analysis.diagnose import store_findings
        from slokit.errors import StoreBusy
        from slokit.store.db import open_store

        try:
            store = open_store(db, read_only=not save)
        except StoreBusy:
            if save:
                raise
            from slokit.client import SidecarClient

            doc = SidecarClient(running_sidecar(db), token=token).diagnose(since, until)
        else:
            with store:
                result = slokit.diagnose(store, since, until, baseline=baseline)
                if save:
                    store_findings(store, result.findings, window=(result.since, result.until))
                doc = result.to_json()
    if as_json:
        print_json(doc)
    else:
        click.echo(render_text(doc))
