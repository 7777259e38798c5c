"""``slokit explain REQUEST_ID``: where one request's time went, and why."""

from __future__ import annotations

import click

from slokit.cli._common import db_option, handle_errors, print_json, running_sidecar


@click.command("explain")
@click.argument("request_id")
@click.option("--json", "as_json", is_flag=True, help="Print the explain document as JSON.")
@db_option
@click.option("--sidecar", metavar="URL", help="Ask a running sidecar's API instead of the file.")
@click.option(
    "--slo",
    "slo_file",
    type=click.Path(dir_okay=False),
    envvar="SLOKIT_SLO",
    help="SLO spec: judge the request against its class.",
)
@click.option("--token", envvar="SLOKIT_TOKEN", help="Bearer token for --sidecar.")
@handle_errors
def command(
    request_id: str,
    as_json: bool,
    db: str,
    sidecar: str | None,
    slo_file: str | None,
    token: str | None,
) -> None:
    """Explain REQUEST_ID (either form: r24 or cmpl-r24-0).

    Exit 0 when answered, 3 when the request is not found.
    """
    from slokit.analysis.explain import explain_request, render_text

    if sidecar:
        from slokit.client import SidecarClient

        doc = SidecarClient(sidecar, token=token).explain(request_id)
    else:
        from slokit.analysis.slo_spec import load_spec
        from slokit.errors import StoreBusy
        from slokit.store.db import open_store

        spec = load_spec(slo_file) if slo_file else None
        try:
            with open_store(db, read_only=True) as store:
                doc = explain_request(store.reader(), request_id, spec=spec)
        except StoreBusy:
            from slokit.client import SidecarClient

            doc = SidecarClient(running_sidecar(db), token=token).explain(request_id)
    if as_json:
        print_json(doc)
    else:
        click.echo(render_text(doc))
