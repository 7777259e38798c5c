"""``slokit explain REQUEST_ID``: where one request's time went, and why."""

from __future__ import annotations

from typing import Any

import click

from slokit.cli._common import handle_errors, print_json
from slokit.cli._sources import SourceOptions, held_by_sidecar, open_reader, source_options


@click.command("explain")
@click.argument("request_id")
@click.option("--json", "as_json", is_flag=True, help="Print the explain document as JSON.")
@source_options("lake", "sidecar")
@click.option(
    "--slo",
    "slo_file",
    type=click.Path(dir_okay=False),
    envvar="SLOKIT_SLO",
    help="SLO spec: judge the request against its class.",
)
@handle_errors
def command(request_id: str, as_json: bool, slo_file: str | None, **source: Any) -> None:
    """Explain REQUEST_ID (either form: r24 or cmpl-r24-0).

    Exit 0 when answered, 3 when the request is not found.
    """
    from slokit.analysis.explain import render_text

    opts = SourceOptions.pop(source)
    sidecar = held_by_sidecar(opts)
    if sidecar is not None:
        from slokit.client import SidecarClient

        doc = SidecarClient(sidecar, token=opts.token).explain(request_id)
    else:
        import slokit

        spec = slokit.load_spec(slo_file) if slo_file else None
        with open_reader(opts) as reader:
            doc = slokit.explain(reader, request_id, slo=spec).to_dict()
    if as_json:
        print_json(doc)
    else:
        click.echo(render_text(doc))
