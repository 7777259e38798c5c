"""``slokit backfill``: pull vLLM and DCGM series of a window from Prometheus into the store."""

from __future__ import annotations

import math

import click

from slokit.cli._common import db_option, handle_errors
from slokit.errors import BadInput
from slokit.store.window import MAX_TS
from slokit.timeutil import parse_duration, parse_time

#: The most steps per series a backfill asks (about 9,000 range queries): 1 year at 1 s is
#: a third of it.
MAX_STEPS = 100_000_000


def _time(option: str, text: str, now: float) -> float:
    """``--start``/``--end`` as epoch seconds: BadInput unless finite and in 1970..9999."""
    if len(text) > 64:
        raise BadInput(f"{option}: not a time ({len(text)} characters)")
    ts = parse_time(text, reference_ts=now)
    if not math.isfinite(ts) or not 0 <= ts <= MAX_TS:
        raise BadInput(
            f"{option}={text!r} is out of range: expected ISO 8601, Unix seconds from 1970 to "
            "9999, or a duration back from Prometheus' now such as 2h"
        )
    return ts


@click.command("backfill")
@click.option(
    "--prometheus",
    "url",
    required=True,
    metavar="URL",
    help="Prometheus base URL, e.g. http://prometheus:9090.",
)
@click.option(
    "--start",
    required=True,
    metavar="T",
    help="Window start: ISO 8601, Unix seconds, or a duration back from Prometheus' now (2h).",
)
@click.option(
    "--end", required=True, metavar="T", help="Window end (same forms; 0s is Prometheus' now)."
)
@click.option(
    "--step", default="15s", show_default=True, help="Resolution of the samples (query_range step)."
)
@click.option(
    "--replica-label",
    default="pod",
    show_default=True,
    help="Label naming the replica on vLLM series (else `instance`).",
)
@click.option(
    "--match",
    "match",
    default=None,
    help="Series selector (default: every vllm:* and DCGM_FI_* series).",
)
@db_option
@handle_errors
def command(
    url: str, start: str, end: str, step: str, replica_label: str, match: str | None, db: str
) -> None:
    """Backfill the store from Prometheus' HTTP API (query_range, chunked).

    Afterwards `diagnose` and `explain` work on that window without a sidecar.
    """
    # deferred: httpx and the store (DuckDB) load only when this command runs
    from slokit.sources.prometheus import (
        DEFAULT_MATCH,
        MIN_STEP_S,
        PrometheusClient,
        backfill_samples,
    )
    from slokit.store.db import open_store

    step_s = parse_duration(step)
    if not MIN_STEP_S <= step_s <= MAX_TS:
        raise BadInput(f"--step {step!r} is out of range: expected 1ms or more, e.g. 15s")
    client = PrometheusClient(url)
    now = client.server_time()
    t0, t1 = _time("--start", start, now), _time("--end", end, now)
    if t1 <= t0:
        raise BadInput(f"--end ({end}) must be after --start ({start})")
    if (t1 - t0) / step_s > MAX_STEPS:
        raise BadInput(
            f"--start {start} .. --end {end} at --step {step} is {(t1 - t0) / step_s:.3g} steps "
            f"per series, over {MAX_STEPS:.0e}: raise --step or narrow the window"
        )
    engine_n = gpu_n = series_n = points_n = chunks_n = 0
    with open_store(db) as store:
        for engine, gpu, series, points in backfill_samples(
            client, t0, t1, step_s, match=match or DEFAULT_MATCH, replica_label=replica_label
        ):
            engine_n += store.append_engine_samples(engine)
            gpu_n += store.append_gpu_samples(gpu)
            series_n, points_n, chunks_n = max(series_n, series), points_n + points, chunks_n + 1
    if not engine_n and not gpu_n:
        raise BadInput(f"no vLLM or DCGM series in Prometheus between {start} and {end}")
    click.echo(
        f"backfilled {engine_n} engine samples, {gpu_n} GPU samples "
        f"({series_n} series, {points_n} points, {chunks_n} range queries)"
    )
