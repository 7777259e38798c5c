"""``slokit ingest``: load recorded telemetry files into the store."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from slokit.cli._common import db_option, handle_errors
from slokit.errors import BadInput
from slokit.timeutil import parse_time

if TYPE_CHECKING:
    from slokit.ingest import IngestReport

# slokit.ingest and the store (DuckDB, pyarrow, the OTLP decoder) are imported inside each
# subcommand: deferred so that ``slokit --help`` stays fast.


def _report(rep: IngestReport) -> None:
    parts = [f"{rep.files} file(s)"]
    if rep.fragments:
        parts.append(
            f"{rep.fragments} fragments ({rep.new_fragments} new) -> {rep.requests} requests"
        )
    if rep.skipped_spans:
        parts.append(f"{rep.skipped_spans} spans skipped (not request spans)")
    if rep.rejected_spans:
        why = ", ".join(f"{n} {r}" for r, n in sorted(rep.rejection_reasons.items()))
        parts.append(f"{rep.rejected_spans} spans rejected ({why})")
    if rep.engine_samples or rep.gpu_samples:
        parts.append(f"{rep.engine_samples} engine samples, {rep.gpu_samples} GPU samples")
    click.echo("ingested " + ", ".join(parts))
    for path, msg in rep.bad_files:
        click.echo(f"slokit: rejected {path}: {msg}", err=True)
    if rep.bad_files:
        sys.exit(2)


@click.group("ingest")
@click.pass_context
def command(ctx: click.Context) -> None:
    """Load OTLP exports, metric files, client records or quality results into the store."""
    from slokit._arrow import defer_pandas
    from slokit._gc import restore_gc, tune_gc

    defer_pandas()  # the store converts lists with pyarrow, which would import pandas (~1 s)
    # A file's records live until its batch is stored and make no cycles: the sidecar's
    # collector schedule (slokit._gc) spares an ingest the young collections that walk them
    # (about 4% of `ingest otlp`'s time), and is put back when the command ends.
    schedule = tune_gc()
    ctx.call_on_close(lambda: restore_gc(schedule))


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from slokit.ingest import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except BadInput as exc:
        raise click.BadParameter(str(exc)) from None


@command.command("otlp")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--replica", help="Replica name for spans whose resource has no k8s.pod.name.")
@click.option(
    "--max-bytes",
    metavar="SIZE",
    envvar="SLOKIT_INGEST_MAX_BYTES",
    callback=_size,
    help="Largest file accepted, decompressed (e.g. 200M, 1G; powers of 1024); bigger ones "
    "are refused before they fill memory. [default: 64M]",
)
@db_option
@handle_errors
def otlp(paths: tuple[str, ...], replica: str | None, max_bytes: int | None, db: str) -> None:
    """OTLP ExportTraceServiceRequest files (.pb or OTLP JSON, gzip or not) or directories."""
    from slokit.ingest import DEFAULT_MAX_BYTES, ingest_otlp
    from slokit.store.db import open_store

    with open_store(db) as store:
        _report(
            ingest_otlp(store, paths, replica=replica, max_bytes=max_bytes or DEFAULT_MAX_BYTES)
        )


@command.command("metrics")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--instance", help="Replica name for samples without an `instance` label.")
@click.option(
    "--ts",
    "ts",
    metavar="T",
    help="Time of samples that carry no timestamp (default: the file's mtime).",
)
@db_option
@handle_errors
def metrics(paths: tuple[str, ...], instance: str | None, ts: str | None, db: str) -> None:
    """Prometheus text / OpenMetrics files (vLLM and dcgm-exporter series)."""
    from slokit.ingest import ingest_metrics
    from slokit.store.db import open_store

    default_ts = parse_time(ts) if ts else None
    with open_store(db) as store:
        _report(ingest_metrics(store, paths, instance=instance, default_ts=default_ts))


@command.command("requests")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@db_option
@handle_errors
def requests_(paths: tuple[str, ...], db: str) -> None:
    """Client records: slokit load JSONL or `vllm bench serve --save-detailed` JSON."""
    from slokit.ingest import ingest_requests
    from slokit.store.db import open_store

    with open_store(db) as store:
        _report(ingest_requests(store, paths))


@command.command("quality")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@db_option
@handle_errors
def quality(paths: tuple[str, ...], db: str) -> None:
    """Quality results: request_id,quality_pass rows (CSV with a header, or JSONL)."""
    from slokit.ingest import ingest_quality
    from slokit.store.db import open_store

    with open_store(db) as store:
        _report(ingest_quality(store, paths))
