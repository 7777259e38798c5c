"""``slokit capacity``: replicas needed for a target arrival mix, from tokens."""

from __future__ import annotations

import click

from slokit.cli._common import db_option, handle_errors, print_json
from slokit.errors import BadInput


@click.command("capacity")
@click.option(
    "--slo",
    "slo_file",
    required=True,
    type=click.Path(dir_okay=False),
    envvar="SLOKIT_SLO",
    help="SLO spec: the objectives a sweep step must meet.",
)
@db_option
@click.option(
    "--model-config",
    type=click.Path(),
    help="The model's config.json (or its directory) for KV bytes per token.",
)
@click.option("--kv-dtype", help="KV cache dtype if not the model's (e.g. fp8).")
@click.option(
    "--kv-memory-gib",
    type=float,
    help="KV cache memory per replica, when the store has no cache_config_info.",
)
@click.option("--arrival-rps", type=float, help="Target arrival rate (requests/s).")
@click.option("--prompt-tokens", type=float, help="Mean prompt tokens of the target mix.")
@click.option("--output-tokens", type=float, help="Mean output tokens of the target mix.")
@click.option(
    "--sustainable-tokens-per-s",
    type=float,
    help="Tokens/s one replica sustains at the SLO (default: from the sweep).",
)
@click.option(
    "--rho",
    type=float,
    default=0.8,
    show_default=True,
    help="Utilisation headroom: plan to run replicas at this fraction.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@handle_errors
def command(
    slo_file: str,
    db: str,
    model_config: str | None,
    kv_dtype: str | None,
    kv_memory_gib: float | None,
    arrival_rps: float | None,
    prompt_tokens: float | None,
    output_tokens: float | None,
    sustainable_tokens_per_s: float | None,
    rho: float,
    as_json: bool,
) -> None:
    """KV bytes per token, resident tokens, sustainable work per replica at the SLO, and the
    replicas a target arrival rate needs (with N+1), each next to its assumptions."""
    # deferred: the analysis (PyYAML) and the store (DuckDB) load only when this command runs
    from slokit.analysis import capacity
    from slokit.analysis.slo_spec import load_spec
    from slokit.store.db import open_store

    spec = load_spec(slo_file)
    if (prompt_tokens is None) != (output_tokens is None):
        raise BadInput("give both --prompt-tokens and --output-tokens, or neither")
    shape = None
    if model_config:
        shape = capacity.kv_shape(
            capacity.load_model_config(model_config), kv_dtype=kv_dtype, where=model_config
        )
    with open_store(db, read_only=True) as store:
        reader = store.reader()
        cache = reader.cache_config()
        records = reader.requests(None, None)
    if prompt_tokens is not None and output_tokens is not None:
        mix: tuple[float, float] | None = (prompt_tokens, output_tokens)
        source = "given"
    else:
        mix, source = capacity.mean_mix(records), "mean of the stored requests"
    result = capacity.plan(
        shape=shape, cache=cache,
        kv_memory_bytes=kv_memory_gib * 2**30 if kv_memory_gib is not None else None,
        sustainable=capacity.sustainable_work(records, spec),
        sustainable_tokens_per_s=sustainable_tokens_per_s,
        mix=mix, mix_source=source, arrival_rps=arrival_rps, rho=rho,
    )  # fmt: skip
    if as_json:
        print_json(result.to_json())
    else:
        click.echo(capacity.render_text(result))
