"""``slokit sidecar``: the long-running collector beside vLLM (scrape, OTLP, API)."""

from __future__ import annotations

import logging
from typing import Any

import click

from slokit.cli._common import handle_errors


@click.command("sidecar")
@click.option(
    "--vllm-url",
    "vllm_urls",
    multiple=True,
    metavar="[NAME=]URL",
    help="vLLM /metrics URL to scrape (repeatable; NAME= names its replica).",
)
@click.option(
    "--dcgm-url",
    "dcgm_urls",
    multiple=True,
    metavar="[NAME=]URL",
    help="dcgm-exporter /metrics URL to scrape (repeatable).",
)
@click.option(
    "--router-url",
    "router_urls",
    multiple=True,
    metavar="[NAME=]URL",
    help="Gateway router (llm-d router / Inference Extension EPP) /metrics URL to scrape "
    "(repeatable or a comma list; NAME= names the router).",
)
@click.option("--nvml/--no-nvml", default=None, help="Poll local GPUs through NVML.")
@click.option(
    "--otlp-http",
    metavar="HOST:PORT",
    help="OTLP/HTTP receiver address ('' to disable). [default: 127.0.0.1:4318]",
)
@click.option(
    "--otlp-grpc",
    metavar="HOST:PORT",
    help="OTLP/gRPC receiver address ('' to disable). [default: 127.0.0.1:4317]",
)
@click.option(
    "--listen", metavar="HOST:PORT", help="API and /metrics address. [default: 127.0.0.1:9464]"
)
@click.option(
    "--db",
    type=click.Path(dir_okay=False),
    help="DuckDB file. [default: $SLOKIT_DB or ./slokit.duckdb]",
)
@click.option("--slo", type=click.Path(dir_okay=False), help="SLO spec for the SLI counters.")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="YAML config (flags > SLOKIT_* env > file).",
)
@click.option("--replica", help="Replica name for spans and samples. [default: $POD_NAME or host]")
@click.option(
    "--scrape-interval",
    "scrape_interval_s",
    type=float,
    help="Seconds between scrapes. [default: 1]",
)
@click.option("--token", help="Bearer token required by every endpoint but the probes "
              "(required when listening beyond loopback).")  # fmt: skip
@click.option("--forward-otlp", metavar="URL", help="Forward received spans to this OTLP/HTTP URL.")
@click.option("--forward-content/--no-forward-content", default=None,
              help="Forward prompt/completion content too (stripped by default; never "
              "stored).")  # fmt: skip
@click.option(
    "--parquet-dir",
    metavar="DIR",
    help="Export closed minutes as hive Parquet here (the lake: docs/lake.md).",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@handle_errors
def command(config_file: str | None, log_level: str, **flags: Any) -> None:
    """Run the sidecar: scrape vLLM/DCGM, receive OTLP traces, serve /metrics and the API.

    Binds 127.0.0.1 by default; any other address needs --token.
    """
    from slokit._malloc import SIDECAR_ARENAS, cap_malloc_arenas
    from slokit._native_threads import bound_native_threads
    from slokit.sidecar import lograte
    from slokit.sidecar.config import load_config

    config = load_config(config_file, flags=flags).validate()  # a bad value: exit 2, one line
    # before the runner imports numpy and pyarrow (their pools are sized when they load) and
    # before any thread starts (an arena, once made, stays)
    bound_native_threads(config.native_threads)
    cap_malloc_arenas(SIDECAR_ARENAS)
    from slokit.sidecar.runner import run

    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    # A line repeated by a flood (bad requests, accept() errors) is logged a few times per
    # window, then counted: nothing a client does can fill the disk.
    lograte.install(logging.getLogger().handlers)
    # httpx logs every scrape at INFO: one line per target per second drowns the sidecar's own.
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("httpx").setLevel(logging.WARNING)
    run(config)
