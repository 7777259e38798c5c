"""``slokit explain REQUEST_ID``: where one request's time went, and why."""

from __future__ import annotations

from typing import Any

import click

import slokit
from slokit.cli._common import handle_errors, print_json
from slokit.cli._sources import SourceOptions, held_by_sidecar, open_reader, source_options
from slokit.errors import BadInput


@click.command("explain")
@click.argument("request_id")
@click.option("--json", "as_json", is_flag=True, help="Print the explain document as JSON.")
@source_options("lake", "sidecar")
@click.option(
    "--fleet",
    "fleet_spec",
    metavar="SPEC",
    help="Ask every pod's sidecar (--token): URL,URL,..., dns://NAME:PORT (a headless "
    "Service) or k8s://NAMESPACE/LABEL-SELECTOR[?port=9464]. See docs/fleet.md.",
)
@click.option(
    "--fleet-timeout",
    type=float,
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="With --fleet: how long one sidecar may take to answer before it is unreachable.",
)
@click.option(
    "--slo",
    "slo_file",
    type=click.Path(dir_okay=False),
    envvar="SLOKIT_SLO",
    help="SLO spec: judge the request against its class.",
)
@handle_errors
def command(
    request_id: str,
    as_json: bool,
    fleet_spec: str | None,
    fleet_timeout: float,
    slo_file: str | None,
    **source: Any,
) -> None:
    """Explain REQUEST_ID (either form: r24 or cmpl-r24-0).

    Exit 0 when answered, 3 when the request is not found (with --fleet: on any sidecar that
    answered), 2 on a bad id or SPEC.
    """
    # deferred: explain (DuckDB) and the sidecar client (httpx) load only when this command runs
    from slokit.analysis.explain import render_text

    opts = SourceOptions.pop(source)
    if fleet_spec is not None:
        _explain_fleet(request_id, fleet_spec, opts, as_json, fleet_timeout)
        return
    sidecar = held_by_sidecar(opts)
    if sidecar is not None:
        from slokit.client import SidecarClient

        doc = SidecarClient(sidecar, token=opts.token).explain(request_id)
    else:
        spec = slokit.load_spec(slo_file) if slo_file else None
        with open_reader(opts) as reader:
            doc = slokit.explain(reader, request_id, slo=spec).to_dict()
    if as_json:
        print_json(doc)
    else:
        click.echo(render_text(doc))


def _explain_fleet(
    request_id: str, spec: str, opts: SourceOptions, as_json: bool, timeout_s: float
) -> None:
    """``--fleet SPEC``: ask every sidecar SPEC names (slokit.fleet)."""
    # deferred like the other backends: explain loads DuckDB, the fleet client httpx
    from slokit.analysis.explain import render_text
    from slokit.fleet import explain_fleet, resolve_fleet

    if opts.db or opts.lake or opts.sidecar:
        raise BadInput("--fleet asks the sidecars: give it without --db, --lake or --sidecar")
    if not timeout_s > 0:
        raise BadInput(f"--fleet-timeout must be positive, got {timeout_s}")
    found = explain_fleet(request_id, resolve_fleet(spec), token=opts.token, timeout_s=timeout_s)
    if as_json:
        print_json(found.to_dict())
    else:
        click.echo("\n".join([render_text(found.doc), "", *found.fleet_lines()]))
