"""``slokit sim``: run N simulated vLLM replicas (with DCGM exporters) in this process."""

from __future__ import annotations

import asyncio

import click

from slokit.cli._common import handle_errors
from slokit.errors import BadInput


@click.command("sim")
@click.option("--replicas", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=8000,
    show_default=True,
    help="Replica i serves the OpenAI API on PORT+i.",
)
@click.option(
    "--dcgm-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Replica i's GPU exporter serves /metrics on DCGM_PORT+i (default: none).",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--otlp-endpoint", default=None, help="Send llm_request spans here (OTLP).")
@click.option(
    "--otlp-protocol",
    type=click.Choice(["grpc", "http/protobuf"]),
    default="grpc",
    show_default=True,
)
@click.option(
    "--scenario",
    default="healthy",
    show_default=True,
    help="Fault preset (see slokit.lab.sim.faults), e.g. kv_pressure, gpu_throttle.",
)
@click.option("--model", type=click.Choice(["7b", "32b"]), default="7b", show_default=True)
@click.option(
    "--gpu", type=click.Choice(["h100", "h200", "a100", "l4"]), default="h100", show_default=True
)
@click.option("--served-model-name", default=None)
@click.option("--max-model-len", type=click.IntRange(16, 1 << 20), default=4096, show_default=True)
@click.option("--max-num-seqs", type=click.IntRange(1, 1 << 16), default=None)
@click.option("--max-num-batched-tokens", type=click.IntRange(1, 1 << 20), default=None)
@click.option("--num-gpu-blocks", type=click.IntRange(1, 1 << 24), default=None)
@click.option(
    "--speed",
    type=click.FloatRange(0.01, 1000.0),
    default=1.0,
    show_default=True,
    help="Simulated seconds per wall second.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--max-lag",
    type=click.FloatRange(0.0, 10.0),
    default=0.005,
    show_default=True,
    help="Seconds the engine timeline may trail wall time before resyncing "
    "(raise on a busy host to keep roofline step times; tokens then arrive in bursts).",
)
@handle_errors
def command(
    replicas: int,
    port: int,
    dcgm_port: int | None,
    host: str,
    otlp_endpoint: str | None,
    otlp_protocol: str,
    scenario: str,
    model: str,
    gpu: str,
    served_model_name: str | None,
    max_model_len: int,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    num_gpu_blocks: int | None,
    speed: float,
    seed: int,
    max_lag: float,
) -> None:
    """vLLM-compatible simulator: OpenAI API, /metrics, OTLP spans, DCGM, faults."""
    # deferred: the simulator (aiohttp, prometheus_client) loads only when this command runs
    from slokit.lab.sim.faults import FaultError
    from slokit.lab.sim.server import SimCluster, SimSettings, serve_forever

    try:
        settings = SimSettings.for_scenario(
            scenario,
            model=model,
            gpu=gpu,
            served_model_name=served_model_name,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            num_gpu_blocks=num_gpu_blocks,
            speed=speed,
            otlp_endpoint=otlp_endpoint,
            otlp_protocol=otlp_protocol,
            seed=seed,
            max_lag_s=max_lag,
        )
    except FaultError as exc:
        raise BadInput(str(exc)) from exc
    try:
        cfg = settings.engine_config()
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
    if cfg.num_gpu_blocks * cfg.block_size < max_model_len:
        raise BadInput(
            f"{cfg.num_gpu_blocks} KV blocks of {cfg.block_size} tokens cannot hold one "
            f"sequence of max_model_len={max_model_len}"
        )
    cluster = SimCluster(settings, replicas, port, dcgm_port, host=host)

    def ready(c: SimCluster) -> None:
        for r in c.replicas:
            gpu_url = f" dcgm=http://{r.host}:{r.dcgm_port}/metrics" if r.dcgm_port else ""
            click.echo(f"{r.name}: http://{r.host}:{r.port}{gpu_url}", err=True)
        click.echo(
            f"slokit sim: {replicas} replica(s) of {settings.model_name} on {gpu}, "
            f"{cfg.num_gpu_blocks} KV blocks, scenario {scenario}",
            err=True,
        )

    try:
        asyncio.run(serve_forever(cluster, ready))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        raise BadInput(f"cannot serve: {exc}") from exc
