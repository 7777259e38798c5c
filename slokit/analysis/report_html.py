"""``slokit report``: one self-contained HTML page about a run (no network needed to view it).

Plots are inline SVG drawn here (no JavaScript, no fonts or scripts fetched):

* output tokens/s vs concurrency, one point per load run (sweep step): concurrency is the
  mean number of requests in flight, sum of E2E / the step's span (Little's law);
* p95 TTFT and p95 TPOT vs offered arrival rate, per sweep step (where the knee shows);
* active sequences over time (vLLM ``running`` and ``waiting`` per replica, from the engine
  samples);
* a completion timeline of short vs long requests (finish time against E2E; short and
  long split at the median output length);
* the latency decomposition of the slowest requests (queue, prefill, decode, and the rest:
  network, client, unknown);
* the findings, the SLO attainment per class and the cost per successful task.

Every figure is a ``<figure data-plot="NAME">`` whose SVG carries one mark per data point
(``class="mark"``), so tests and readers can tell an empty plot from a drawn one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slokit.analysis.causality import analyse, from_stored
from slokit.analysis.cost import CostReport, money
from slokit.analysis.slo import SloReport, measurement, quantile, run_of, sweep_points
from slokit.analysis.slo_spec import SloSpec
from slokit.analysis.svg import PALETTE, Chart, Series, esc, svg_chart, svg_stacked_bars
from slokit.timeutil import iso

# --- data -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepStats:
    """One load run (sweep step): offered rate, throughput, concurrency, tail latency."""

    label: str
    offered_rps: float
    output_tokens_per_s: float
    mean_concurrency: float
    ttft_p95_s: float | None
    tpot_p95_s: float | None


def step_stats(records: Sequence[Mapping[str, Any]], spec: SloSpec) -> list[StepStats]:
    """Per load run (see :func:`slokit.analysis.slo.sweep_points`, ``by="run"``)."""
    points = sweep_points(records, spec, by="run")
    by_run: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        by_run.setdefault(run_of(r.get("request_id")), []).append(r)
    out = []
    for p in points:
        rs = by_run.get(p.label, [])
        arrivals = [a for r in rs if (a := r.get("arrival_ts")) is not None]
        finishes = [f for r in rs if (f := r.get("finish_ts")) is not None]
        if not arrivals or not finishes:
            continue
        span = max(finishes) - min(arrivals)
        if span <= 0:
            continue
        ok = [r for r in rs if r.get("status") == "ok"]
        tokens = sum(int(r.get("output_tokens") or 0) for r in ok)
        busy = sum(e for r in rs if (e := measurement(r, "e2e")) is not None)
        ttfts = sorted(v for r in ok if (v := measurement(r, "ttft")) is not None)
        tpots = sorted(v for r in ok if (v := measurement(r, "tpot")) is not None)
        out.append(
            StepStats(
                p.label,
                p.offered_rps,
                tokens / span,
                busy / span,
                quantile(ttfts, 0.95) if ttfts else None,
                quantile(tpots, 0.95) if tpots else None,
            )
        )
    return out


# --- page -----------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;
color:#222;max-width:1360px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.sub{color:#666;font-size:13px}
.grid-2{display:grid;grid-template-columns:repeat(auto-fit,minmax(640px,1fr));gap:16px}
figure{margin:0;border:1px solid #ddd;border-radius:6px;padding:8px;background:#fff}
figcaption{font-weight:600;font-size:14px;margin-bottom:4px}
figure p.note{color:#666;font-size:12px;margin:4px 0 0}
svg text{font-size:11px;fill:#333}svg text.axis{font-size:12px;fill:#555}
svg text.empty{font-size:14px;fill:#999}
svg rect.plot{fill:#fafafa;stroke:#ccc}svg line.grid{stroke:#e6e6e6}
table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}
.bad{color:#b00020;font-weight:600}.good{color:#1b7f2a;font-weight:600}
"""


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.2f}%"


def _slo_table(report: SloReport) -> str:
    rows = [
        "<table><tr><th class='l'>class</th><th>requests</th><th>good</th><th>slow</th>"
        "<th>error</th><th>quality fail</th><th>attainment</th><th>objective</th>"
        "<th>burn rate</th><th>good req/s</th><th>good tokens/s</th></tr>"
    ]
    for g in [*report.classes, report.overall]:
        ok = None if g.objective is None or g.attainment is None else g.attainment >= g.objective
        cls = {True: "good", False: "bad", None: ""}[ok]
        o = g.outcomes
        br = "-" if g.burn_rate is None else f"{g.burn_rate:.2f}"
        gr = "-" if g.good_rps is None else f"{g.good_rps:.3f}"
        gt = "-" if g.good_output_tokens_per_s is None else f"{g.good_output_tokens_per_s:.1f}"
        rows.append(
            f"<tr><td class='l'>{esc(g.name)}</td><td>{g.requests}</td><td>{o['good']}</td>"
            f"<td>{o['slow']}</td><td>{o['error']}</td><td>{o['quality_fail']}</td>"
            f"<td class='{cls}'>{_pct(g.attainment)}</td><td>{_pct(g.objective)}</td>"
            f"<td>{br}</td><td>{gr}</td><td>{gt}</td></tr>"
        )
    rows.append("</table>")
    if report.max_goodput is not None and report.max_goodput.rate_rps is not None:
        mg = report.max_goodput
        bound = "" if mg.bounded else "at least "
        rows.append(
            f"<p>Max goodput (DistServe: highest offered rate meeting every objective): "
            f"<b>{bound}{mg.rate_rps:.2f} req/s</b>.</p>"
        )
    return "".join(rows)


def _cost_table(cost: CostReport | None) -> str:
    if cost is None:
        return "<p class='sub'>No cost: the SLO spec has no <code>cost.gpu_hour_usd</code>.</p>"

    rows = [
        ("GPU cost of the window", money(cost.total_usd)),
        (
            "per successful task",
            f"{money(cost.usd_per_successful_task)} "
            f"({cost.tasks.successful} of {cost.tasks.tasks} tasks succeeded)",
        ),
        ("per good request", f"{money(cost.usd_per_good_request)} ({cost.good_requests} good)"),
        ("per 1M input tokens", money(cost.usd_per_1m_input_tokens)),
        ("per 1M output tokens", money(cost.usd_per_1m_output_tokens)),
    ]
    if cost.j_per_output_token is not None:
        rows.append(("energy per output token", f"{cost.j_per_output_token:.3f} J"))
    body = "".join(f"<tr><td class='l'>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in rows)
    notes = "".join(f"<li>{esc(a)}</li>" for a in cost.assumptions)
    return f"<table>{body}</table><ul class='sub'>{notes}</ul>"


def _findings_table(findings: Sequence[Mapping[str, Any]]) -> str:
    """The stored findings: the root causes first, each with its consequences under it
    (links recomputed by :mod:`slokit.analysis.causality`: the store keeps none), then the
    independent findings."""
    if not findings:
        return "<p class='sub'>No findings stored for this window (run <code>slokit diagnose"
        "</code>).</p>"
    linked = analyse([from_stored(f) for f in findings], strict=False)
    by_id = {f.id: (f, row) for f, row in zip(linked.findings, findings, strict=True)}
    rows = [
        "<table><tr><th class='l'>rule</th><th class='l'>severity</th><th>confidence</th>"
        "<th class='l'>replica</th><th class='l'>from</th><th class='l'>to</th>"
        "<th class='l'>summary</th><th class='l'>runbook</th></tr>"
    ]
    shown: set[str] = set()

    def emit(fid: str, depth: int, reason: str | None) -> None:
        shown.add(fid)
        f, row = by_id[fid]
        rule = esc(row["rule"])
        if fid in linked.root_causes:
            rule = f"<b>{rule}</b> (root cause)"
        elif depth:
            rule = f"{'&nbsp;' * 4 * depth}&#8627; {rule}"
        title = f" title='caused by: {esc(reason)}'" if reason else ""
        rows.append(
            f"<tr{title}><td class='l'>{rule}</td><td class='l'>{esc(row['severity'])}</td>"
            f"<td>{float(row['confidence']):.2f}</td><td class='l'>{esc(row['replica'] or 'fleet')}"
            f"</td><td class='l'>{esc(iso(row['start']))}</td><td class='l'>{esc(iso(row['end']))}"
            f"</td><td class='l'>{esc(row['summary'])}</td><td class='l'>{esc(row['runbook'])}</td>"
            "</tr>"
        )
        for child in f.explains:
            if child not in shown:
                why = next(c["reason"] for c in by_id[child][0].caused_by if c["id"] == fid)
                emit(child, depth + 1, why)

    for fid in [*linked.root_causes, *(f.id or "" for f in linked.findings if not f.caused_by)]:
        if fid not in shown:
            emit(fid, 0, None)
    rows.append("</table>")
    return "".join(rows)


def _figure(name: str, title: str, svg: str, note: str = "") -> str:
    n = f"<p class='note'>{esc(note)}</p>" if note else ""
    return f"<figure data-plot='{esc(name)}'><figcaption>{esc(title)}</figcaption>{svg}{n}</figure>"


def build_charts(
    records: Sequence[Mapping[str, Any]],
    spec: SloSpec,
    engine: Mapping[str, Sequence[tuple[float, float | None, float | None]]],
) -> list[str]:
    """The figures of the page, in order."""
    steps = step_stats(records, spec)
    figs = []
    thr = Chart(
        "throughput_vs_concurrency",
        "Output tokens/s vs concurrency",
        "mean requests in flight",
        "output tokens/s",
        [Series("per load run", [(s.mean_concurrency, s.output_tokens_per_s) for s in steps])],
    )
    figs.append(
        _figure(
            thr.name,
            thr.title,
            svg_chart(thr),
            "one point per load run (sweep step); concurrency by Little's law",
        )
    )
    knee = Chart(
        "latency_vs_rate",
        "p95 TTFT and TPOT vs arrival rate",
        "offered req/s",
        "ms",
        [
            Series(
                "TTFT p95",
                [(s.offered_rps, s.ttft_p95_s * 1000) for s in steps if s.ttft_p95_s is not None],
                PALETTE[0],
            ),
            Series(
                "TPOT p95",
                [(s.offered_rps, s.tpot_p95_s * 1000) for s in steps if s.tpot_p95_s is not None],
                PALETTE[1],
            ),
        ],
    )
    figs.append(
        _figure(
            knee.name,
            knee.title,
            svg_chart(knee),
            "the knee: where tail latency turns up as the rate grows",
        )
    )
    active = Chart(
        "active_sequences", "Active sequences over time", "time (UTC)", "sequences", x_time=True
    )
    for i, (replica, pts) in enumerate(sorted(engine.items())):
        active.series.append(
            Series(
                f"{replica} running",
                [(t, r) for t, r, _ in pts if r is not None],
                PALETTE[(2 * i) % len(PALETTE)],
            )
        )
        active.series.append(
            Series(
                f"{replica} waiting",
                [(t, w) for t, _, w in pts if w is not None],
                PALETTE[(2 * i + 1) % len(PALETTE)],
            )
        )
    figs.append(
        _figure(
            active.name,
            active.title,
            svg_chart(active),
            "vLLM num_requests_running / waiting from the engine samples",
        )
    )
    done = [
        r
        for r in records
        if r.get("finish_ts") is not None
        and measurement(r, "e2e") is not None
        and r.get("output_tokens") is not None
    ]
    lengths = sorted(int(r["output_tokens"]) for r in done)
    cut = quantile([float(v) for v in lengths], 0.5) if lengths else 0.0
    timeline = Chart(
        "completion_timeline",
        "Completion timeline: short vs long requests",
        "finish time (UTC)",
        "E2E s",
        x_time=True,
        series=[
            Series(f"short (<= {cut:.0f} tokens)", [], PALETTE[0], line=False),
            Series(f"long (> {cut:.0f} tokens)", [], PALETTE[1], line=False),
        ],
    )
    for r in done:
        e2e = measurement(r, "e2e")
        assert e2e is not None
        timeline.series[0 if int(r["output_tokens"]) <= cut else 1].points.append(
            (float(r["finish_ts"]), e2e)
        )
    figs.append(
        _figure(
            timeline.name, timeline.title, svg_chart(timeline), "split at the median output length"
        )
    )
    slowest = sorted(done, key=lambda r: measurement(r, "e2e") or 0.0, reverse=True)[:12]
    rows = []
    for r in slowest:
        e2e = measurement(r, "e2e") or 0.0
        comp = {k: float(r.get(f"{k}_s") or 0.0) for k in ("queue", "prefill", "decode")}
        comp["other"] = max(0.0, e2e - sum(comp.values()))
        rows.append((str(r.get("request_id")), comp))
    figs.append(
        _figure(
            "slowest_decomposition",
            "Latency decomposition of the slowest requests",
            svg_stacked_bars(rows, ("queue", "prefill", "decode", "other")),
            "other = E2E not covered by server phases (network, client, unknown)",
        )
    )
    return figs


def render_html(
    *,
    service: str,
    report: SloReport,
    cost: CostReport | None,
    records: Sequence[Mapping[str, Any]],
    spec: SloSpec,
    engine: Mapping[str, Sequence[tuple[float, float | None, float | None]]],
    findings: Sequence[Mapping[str, Any]],
) -> str:
    """The whole page as one string (UTF-8, inline CSS and SVG, nothing fetched)."""
    w = report.window
    figs = build_charts(records, spec, engine)
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>slokit report: {esc(service)}</title><style>{_CSS}</style></head><body>"
        f"<h1>slokit report: {esc(service)}</h1>"
        f"<p class='sub'>{esc(iso(w.since) or '?')} .. {esc(iso(w.until) or '?')}"
        f" ({'-' if w.duration_s is None else f'{w.duration_s:.1f} s'}),"
        f" {report.overall.requests} requests in SLO classes</p>"
        "<h2>SLO attainment</h2>"
        + _slo_table(report)
        + "<h2>Cost</h2>"
        + _cost_table(cost)
        + "<h2>Plots</h2><div class='grid-2'>"
        + "".join(figs)
        + "</div>"
        + "<h2>Findings</h2>"
        + _findings_table(findings)
        + "</body></html>\n"
    )
