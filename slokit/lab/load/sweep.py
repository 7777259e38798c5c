"""Rate sweeps: the open-loop schedule at each rate in turn, one records file per rate."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from slokit.errors import BadInput
from slokit.lab.load.clock import Clock
from slokit.lab.load.config import LoadConfig
from slokit.lab.load.run import run_load
from slokit.lab.load.stats import LoadResult, LoadSummary, ProgressCallback

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter


def sweep_out_path(out: Path, rate: float) -> Path:
    """``load.jsonl`` at rate 5 -> ``load.rate5.jsonl`` (one file per rate)."""
    label = f"{rate:g}"
    suffix = out.suffix or ".jsonl"
    return out.with_name(f"{out.stem}.rate{label}{suffix}")


async def run_sweep(
    config: LoadConfig,
    rates: Sequence[float],
    *,
    connector: aiohttp.BaseConnector | None = None,
    clock: Clock | None = None,
    span_exporter: SpanExporter | None = None,
    on_progress: ProgressCallback | None = None,
    on_step: Callable[[LoadSummary], Awaitable[None] | None] | None = None,
) -> list[LoadResult]:
    """Run the open-loop schedule at each rate in turn, one records file per rate.

    Step ``i`` (from 1) uses run id ``<run>-s<i>`` (request ids stay unique across files)
    and seed ``seed + i - 1``; each step drains (at most ``drain_s``, the rest recorded
    ``incomplete``) before the next starts.
    """
    if config.users is not None:
        raise BadInput("--sweep runs the open loop; use it with rates, not --users")
    if not rates:
        raise BadInput("--sweep needs at least one rate")
    base_id = config.run_id or f"load-{secrets.token_hex(3)}"
    results: list[LoadResult] = []
    for i, rate in enumerate(rates):
        step = replace(
            config,
            rate=rate,
            run_id=f"{base_id}-s{i + 1}",
            out=sweep_out_path(config.out, rate) if config.out is not None else None,
            seed=config.seed + i,
        )
        res = await run_load(
            step,
            connector=connector,
            clock=clock,
            span_exporter=span_exporter,
            on_progress=on_progress,
        )
        results.append(res)
        if on_step is not None:
            maybe = on_step(res.summary)
            if maybe is not None:
                await maybe
    return results
