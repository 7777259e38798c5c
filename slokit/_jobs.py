"""slokit's main jobs as library calls: what the CLI, the sidecar API and the demo run.

Each job takes its data as a *source*: a :class:`~slokit.store.reader.Reader`, an open
:class:`~slokit.store.db.Store`, or the path of a slokit DuckDB file (opened read-only for the
call and closed after it). Windows are resolved once, by
:func:`slokit.store.window.resolve_window`, from ISO 8601, Unix seconds or a duration back
from the newest data (``"15m"``). Results are typed; ``to_dict()`` gives the JSON document
the CLI prints with ``--json``.

Heavy modules (DuckDB, pandas, the rules) load on the first call, not on import: ``import
slokit`` stays cheap for the CLI.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from slokit.errors import BadInput, NotFound
from slokit.store.window import resolve_window
from slokit.timeutil import parse_duration

# The store (DuckDB, pyarrow), the analysis stack (pandas, PyYAML) and the run readers are
# imported inside each job: deferred so that ``import slokit`` and the CLI stay cheap.

if TYPE_CHECKING:
    from slokit.analysis.diagnose import Diagnosis
    from slokit.analysis.explain import ExplainOptions, Explanation
    from slokit.analysis.gate import GateResult
    from slokit.analysis.rules._context import DiagnoseOptions
    from slokit.analysis.slo_result import SloResult
    from slokit.analysis.slo_spec import SloSpec
    from slokit.store.db import Store
    from slokit.store.reader import Reader
    from slokit.store.window import Bound, Window

    #: Where a job reads its data.
    Source: TypeAlias = Reader | Store | str | os.PathLike[str]
    #: An SLO spec, or the path of its YAML file.
    Spec: TypeAlias = SloSpec | str | os.PathLike[str]

__all__ = [
    "HtmlReport",
    "diagnose",
    "explain",
    "gate",
    "html_report",
    "load_spec",
    "open_store",
    "reading",
    "slo_report",
    "window",
]


@contextmanager
def reading(source: Source) -> Iterator[Reader]:
    """A :class:`Reader` over ``source``; a path is opened read-only and closed afterwards."""
    from slokit.store.db import Store, open_store

    if isinstance(source, str | os.PathLike):
        with open_store(Path(source), read_only=True) as store:
            yield store.reader()
    elif isinstance(source, Store):
        yield source.reader()
    else:
        yield source


def open_store(path: str | os.PathLike[str], *, read_only: bool = True) -> Store:
    """Open (and, writable, create or migrate) a slokit DuckDB file. Use it as a context
    manager; ``store.reader()`` answers the jobs' questions."""
    from slokit.store.db import open_store as _open

    return _open(Path(path), read_only=read_only)


def load_spec(spec: Spec) -> SloSpec:
    """An SLO spec from its YAML file (validated, the gate section included)."""
    from slokit.analysis.slo_spec import SloSpec
    from slokit.analysis.slo_spec import load_spec as _load

    return spec if isinstance(spec, SloSpec) else _load(Path(spec))


def window(source: Source, since: Bound = None, until: Bound = None) -> Window:
    """``since``/``until`` resolved against ``source``'s data (durations count back from the
    newest time it holds)."""
    with reading(source) as reader:
        return resolve_window(reader, since, until)


def diagnose(
    source: Source,
    since: Bound = None,
    until: Bound = None,
    *,
    baseline: str | float = "1h",
    options: DiagnoseOptions | None = None,
) -> Diagnosis:
    """Run every rule over the window (default: all the data). ``baseline`` is how much
    history before ``since`` is "normal" (a duration such as ``"30m"`` or seconds).
    Raises :class:`~slokit.errors.NotFound` when the window holds no data."""
    from slokit.analysis.diagnose import DiagnoseOptions, run_diagnosis

    lookback = parse_duration(baseline) if isinstance(baseline, str) else float(baseline)
    opt = replace(options or DiagnoseOptions(), baseline_lookback_s=lookback)
    with reading(source) as reader:
        w = resolve_window(reader, since, until)
        return run_diagnosis(reader, w.since, w.until, options=opt)


def explain(
    source: Source,
    request_id: str,
    *,
    slo: Spec | None = None,
    options: ExplainOptions | None = None,
) -> Explanation:
    """Where one request's time went and why, against its peers, its replica's state and
    the active findings; judged by its SLO class when ``slo`` is given. Either form of the
    id works (``r24``, ``cmpl-r24-0``). Raises :class:`~slokit.errors.NotFound`."""
    from slokit.analysis.explain import explain as _explain

    spec = load_spec(slo) if slo is not None else None
    with reading(source) as reader:
        return _explain(reader, request_id, spec=spec, options=options)


def _slo_result(reader: Reader, spec: SloSpec, w: Window, sweep: str | float | None) -> SloResult:
    from slokit.analysis import cost, slo
    from slokit.analysis.slo_result import SloResult

    records = reader.requests(w.since, w.until)
    rep = slo.evaluate(records, spec, since=w.since, until=w.until, sweep=sweep)
    energy = reader.energy_increase(rep.window.since, rep.window.until)
    c = cost.compute_cost(records, spec, duration_s=rep.window.duration_s, energy_j=energy)
    return SloResult(rep, c, records)


def slo_report(
    source: Source,
    slo: Spec,
    since: Bound = None,
    until: Bound = None,
    *,
    sweep: str | float | None = None,
) -> SloResult:
    """Attainment, burn rate, goodput, latency percentiles with confidence intervals and cost
    per class over the window. ``sweep``: ``"run"`` or a window in seconds adds the DistServe
    max goodput."""
    spec = load_spec(slo)
    with reading(source) as reader:
        w = resolve_window(reader, since, until)
        if reader.basis == "histograms":  # Prometheus: counts of slokit_requests_total
            from slokit.analysis.slo_counts import counts_result

            lo, hi = reader.bounds()
            start = w.since if w.since is not None else lo
            end = w.until if w.until is not None else hi
            counts_of = getattr(reader, "sli_counts", None)
            if start is None or end is None or counts_of is None:
                raise NotFound("the source holds no slokit_requests_total series")
            return counts_result(spec, counts_of, start, end)
        return _slo_result(reader, spec, w, sweep)


def gate(
    slo: Spec,
    *,
    source: Source | None = None,
    records: str | os.PathLike[str] | None = None,
    vllm_bench: str | os.PathLike[str] | None = None,
    baseline: str | os.PathLike[str] | None = None,
) -> GateResult:
    """Judge one load-test run against the spec's gate section: attainment, burn rate and
    percentile bounds per class, and regressions beyond the noise against ``baseline`` (an
    earlier run's records or ``slokit slo report --json``). The run is ``source`` (a store),
    a ``slokit load`` JSONL (``records``) or a ``vllm bench serve --save-detailed`` JSON
    (``vllm_bench``): exactly one. ``result.exit_code`` is 0 on pass, 1 on a breach."""
    from slokit.analysis import gate as gate_mod
    from slokit.analysis import slo as slo_mod
    from slokit.sources import runs

    given = [x for x in (source, records, vllm_bench) if x is not None]
    if len(given) != 1:
        raise BadInput("give one input: a store, a records file or a vLLM bench file")
    spec = load_spec(slo)

    def judge(run: runs.RunInput) -> GateResult:
        base = runs.load_baseline(str(baseline)) if baseline is not None else None
        report = slo_mod.evaluate(run.records, spec, duration_s=run.duration_s)
        return gate_mod.evaluate_gate(
            report, spec, config=gate_mod.gate_config(spec), current_records=run.records,
            baseline=base,
        )  # fmt: skip

    if records is not None:
        return judge(runs.load_run_file(str(records), "records"))
    if vllm_bench is not None:
        return judge(runs.load_run_file(str(vllm_bench), "vllm-bench"))
    assert source is not None
    with reading(source) as reader:
        run = runs.RunInput(reader.requests(None, None))
        result = judge(run)
        if result.passed:
            return result
        # Why it failed: the same diagnosis over the run's window, from its telemetry.
        from slokit.analysis.causality import chain_text
        from slokit.analysis.diagnose import run_diagnosis
        from slokit.analysis.gate._checks import RootCause

        times = [
            t for r in run.records for t in (r.get("arrival_ts"), r.get("finish_ts")) if t is not None
        ]  # fmt: skip
        try:
            diag = run_diagnosis(reader, min(times), max(times)) if times else None
        except (NotFound, BadInput):
            diag = None
    if diag is not None:
        explains = {f.id or "": f.explains for f in diag.findings}
        rules = {f.id or "": f.rule for f in diag.findings}
        result.root_causes = [
            RootCause(
                f.id or f.rule,
                f.rule,
                f.replica,
                f.summary,
                f.runbook,
                chain_text([f.id or ""], explains, rules),
            )
            for f in diag.root_findings()
        ]
    return result


@dataclass(frozen=True)
class HtmlReport:
    """A self-contained HTML page (inline CSS and SVG) about a window, and what it shows."""

    html: str
    slo: SloResult


def html_report(source: Source, slo: Spec, since: Bound = None, until: Bound = None) -> HtmlReport:
    """The ``slokit report`` page: plots, SLO attainment per load run, cost, stored findings."""
    from slokit.analysis import report_html

    spec = load_spec(slo)
    with reading(source) as reader:
        result = _slo_result(reader, spec, resolve_window(reader, since, until), "run")
        w = result.report.window
        engine = reader.engine_series(w.since, w.until)
        findings = reader.findings(w.since, w.until)
    page = report_html.render_html(
        service=spec.service,
        report=result.report,
        cost=result.cost,
        records=result.records,
        spec=spec,
        engine=engine,
        findings=findings,
    )
    return HtmlReport(page, result)
