"""``slokit gate``: fail a CI job when a load test breaches its SLO (exit 0 pass, 1 breach,
2 bad input)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

import slokit
from slokit.cli._common import handle_errors, print_json
from slokit.cli._sources import SourceOptions, open_reader, source_options
from slokit.errors import BadInput


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from exc


@click.command("gate")
@click.option(
    "--slo",
    "slo_file",
    required=True,
    type=click.Path(dir_okay=False),
    envvar="SLOKIT_SLO",
    help="SLO spec (YAML) with an optional gate section.",
)
@source_options("lake", "sidecar")
@click.option(
    "--run",
    "--records",
    "records_file",
    type=click.Path(dir_okay=False),
    help="Gate on a load test's per-request results, told apart by content: slokit load "
    "JSONL, AIPerf profile_export.jsonl, a GuideLLM report (JSON or YAML), inference-perf's "
    "per-request file, a vllm bench --save-detailed JSON.",
)
@click.option(
    "--vllm-bench",
    "bench_file",
    type=click.Path(dir_okay=False),
    help="Gate on a `vllm bench serve --save-result --save-detailed` JSON file.",
)
@click.option(
    "--baseline",
    type=click.Path(dir_okay=False),
    help="An earlier run (records file or `slokit slo report --json`): flag "
    "regressions beyond the noise.",
)
@click.option("--junit", type=click.Path(dir_okay=False), help="Write JUnit XML here.")
@click.option(
    "--markdown",
    type=click.Path(dir_okay=False),
    help="Write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@handle_errors
def command(
    slo_file: str,
    records_file: str | None,
    bench_file: str | None,
    baseline: str | None,
    junit: str | None,
    markdown: str | None,
    as_json: bool,
    **source: Any,
) -> None:
    """Check attainment, burn rate and percentile bounds per SLO class against the spec's
    gate section; input from the store (default), a load test's results (--run) or a vLLM bench JSON.

    Exit 0 pass, 1 SLO breach or regression, 2 bad input.
    """
    from slokit.analysis import gate  # deferred: PyYAML, the SLO stack (``--help`` stays fast)

    opts = SourceOptions.pop(source)
    files = [f for f, x in (("--run", records_file), ("--vllm-bench", bench_file)) if x]
    stores = [f"--{b}" for b in ("db", "lake", "sidecar") if getattr(opts, b)]
    if len(files) + len(stores) > 1:
        raise BadInput(f"give one input: {' or '.join(files + stores)}")
    if files:
        result = slokit.gate(
            slo_file, records=records_file, vllm_bench=bench_file, baseline=baseline
        )
    else:
        with open_reader(opts) as reader:
            result = slokit.gate(slo_file, source=reader, baseline=baseline)
    if junit:
        _write(junit, gate.junit_xml(result))
    md = gate.markdown_summary(result)
    if markdown:
        _write(markdown, md)
    if as_json:
        print_json(result.to_json())
    else:
        click.echo(md, nl=False)
    sys.exit(result.exit_code)
