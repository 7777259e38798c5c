"""``slokit load``: open- or closed-loop streaming load against an OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click

from slokit.cli._common import handle_errors
from slokit.errors import BadInput
from slokit.timeutil import parse_duration


def _seconds(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_duration(text)
    except BadInput as exc:
        raise BadInput(f"{what}: {exc}") from exc


def _rates(text: str) -> list[float]:
    try:
        rates = [float(r) for r in text.split(",") if r.strip()]
    except ValueError as exc:
        raise BadInput(
            f"--sweep: expected comma-separated rates such as 5,10,20, got {text!r}"
        ) from exc
    if not rates or any(not r > 0 for r in rates):
        raise BadInput(f"--sweep: rates must be positive numbers, got {text!r}")
    return rates


def _headers(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"--header: expected K=V, got {pair!r}")
        out[key.strip()] = value
    return out


@click.command("load")
@click.option(
    "--url",
    "urls",
    required=True,
    multiple=True,
    help="Server base URL, e.g. http://127.0.0.1:8000; repeat it to send round-robin to "
    "several replicas (a cache-unaware gateway).",
)
@click.option("--rate", type=float, help="Open loop: requests per second.")
@click.option("--users", type=int, help="Closed loop: concurrent users sending back-to-back.")
@click.option("--duration", required=True, help="How long to send, e.g. 60, 60s, 5m.")
@click.option(
    "--workload",
    type=click.Path(dir_okay=False),
    help="Workload YAML (classes) or JSONL of prompts; default 128 in / 64 out tokens.",
)
@click.option("--out", type=click.Path(dir_okay=False), help="Client records JSONL to write.")
@click.option(
    "--arrival", type=click.Choice(["poisson", "constant"]), default="poisson", show_default=True
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds schedule and prompts.")
@click.option("--model", help="Model name; default: the workload's, else the server's first.")
@click.option(
    "--endpoint",
    type=click.Choice(["completions", "chat"]),
    default="completions",
    show_default=True,
)
@click.option("--otlp-endpoint", help="Export a client span per request (OTLP http/protobuf).")
@click.option("--sweep", help="Run the open loop at each rate in turn, e.g. 5,10,20.")
@click.option("--timeout", "timeout", default="300", show_default=True, help="Per-request limit.")
@click.option(
    "--drain",
    default="30",
    show_default=True,
    help="At the end, how long requests in flight may still finish; the rest are recorded "
    "incomplete (not errors). 'inf' waits for every answer (each bounded by --timeout).",
)
@click.option("--no-progress", is_flag=True, help="No progress line on stderr.")
@click.option("--header", "header", multiple=True, help="Extra request header K=V (repeatable).")
@click.option("--run-id", help="Prefix of request ids (<run-id>-<seq>); default random.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@handle_errors
def command(
    urls: tuple[str, ...],
    rate: float | None,
    users: int | None,
    duration: str,
    workload: str | None,
    out: str | None,
    arrival: str,
    seed: int,
    model: str | None,
    endpoint: str,
    otlp_endpoint: str | None,
    sweep: str | None,
    timeout: str,
    drain: str,
    no_progress: bool,
    header: tuple[str, ...],
    run_id: str | None,
    as_json: bool,
) -> None:
    """Drive streaming load and record TTFT, ITLs and E2E per request.

    Open loop (--rate, Poisson or constant arrivals; the schedule is kept even when the
    server is slow) or closed loop (--users). Every request carries X-Request-Id and a W3C
    traceparent so its record joins the server's spans. At the end, requests in flight get
    --drain to finish; the rest are recorded incomplete, apart from errors and timeouts.
    """
    # deferred: the load generator (aiohttp, PyYAML) loads only when this command runs
    from slokit.lab.load import (
        LoadConfig,
        Progress,
        format_progress,
        format_summary,
        format_sweep_table,
        run_load,
        run_sweep,
    )
    from slokit.lab.workload import DEFAULT_WORKLOAD, load_workload

    rates = _rates(sweep) if sweep else None
    if rates is not None and users is not None:
        raise BadInput("--sweep runs the open loop; it cannot be combined with --users")
    if rates is not None and rate is not None:
        raise BadInput("give either --rate or --sweep, not both")
    if rates is not None:
        rate = rates[0]
    config = LoadConfig(
        url=urls[0],
        more_urls=urls[1:],
        duration_s=_seconds(duration, "--duration"),
        rate=rate,
        users=users,
        workload=load_workload(workload) if workload else DEFAULT_WORKLOAD,
        arrival=arrival,  # type: ignore[arg-type]
        seed=seed,
        model=model,
        endpoint=endpoint,  # type: ignore[arg-type]
        timeout_s=_seconds(timeout, "--timeout"),
        drain_s=_seconds(drain, "--drain"),
        headers=_headers(header),
        run_id=run_id,
        otlp_endpoint=otlp_endpoint,
        out=Path(out) if out else None,
        keep_records=False,
    )
    config.validate()

    show = not no_progress and sys.stderr.isatty()

    def progress(p: Progress) -> None:
        click.echo("\r" + format_progress(p).ljust(100), nl=False, err=True)

    def end_progress_line(_: Any = None) -> None:
        if show:
            click.echo("\r" + " " * 100 + "\r", nl=False, err=True)

    try:
        if rates is None:
            result = asyncio.run(run_load(config, on_progress=progress if show else None))
            end_progress_line()
            if as_json:
                click.echo(json.dumps(result.summary.as_dict(), indent=2))
            else:
                click.echo(format_summary(result.summary))
            return

        def step_done(summary: Any) -> None:
            end_progress_line()
            if not as_json:
                click.echo(format_summary(summary))

        results = asyncio.run(
            run_sweep(config, rates, on_progress=progress if show else None, on_step=step_done)
        )
    except KeyboardInterrupt:
        end_progress_line()
        click.echo("slokit: interrupted; records written so far are kept", err=True)
        sys.exit(130)
    summaries = [r.summary for r in results]
    if as_json:
        click.echo(json.dumps([s.as_dict() for s in summaries], indent=2))
    else:
        click.echo("\nsweep")
        click.echo(format_sweep_table(summaries))
