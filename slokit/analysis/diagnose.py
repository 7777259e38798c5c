"""Diagnose the fleet: run every rule over a window of the store and say what is wrong.

:func:`diagnose` returns the document of docs/schema/diagnose.schema.json::

    {"window": {...}, "findings": [{"rule", "severity", "confidence", "replica", "start",
     "end", "summary", "evidence", "runbook"}], "coverage": {...}}

The window defaults to the data the store holds (never wall-clock now). The data is read
and bucketed once (:mod:`slokit.analysis.rules._context`); each rule whose sources are
present then runs on it. A rule whose source is missing is *withheld* and the coverage
says why (and ``telemetry_gap`` reports the gap as a finding), instead of a guess.

A rule that raises is a bug, not a verdict: the others still run, and the failure is never
silent. It is logged on one line (the traceback at debug level), listed under
``coverage.failed`` (``rule -> reason``), and the text report opens with it, since that
rule's findings are missing from the diagnosis.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from slokit.analysis.causality import analyse, chain_text, label
from slokit.analysis.rules import NotApplicable, Rule, all_rules
from slokit.analysis.rules._context import DiagnoseContext, DiagnoseOptions, build_context
from slokit.analysis.rules._util import SEVERITY_ORDER
from slokit.errors import BadInput, NotFound
from slokit.records import Finding
from slokit.store.db import Store
from slokit.store.reader import Reader
from slokit.timeutil import iso

log = logging.getLogger(__name__)

__all__ = [
    "DiagnoseOptions",
    "Diagnosis",
    "diagnose",
    "render_text",
    "run_diagnosis",
    "store_findings",
]


@dataclass
class Diagnosis:
    window: dict[str, Any]
    findings: list[Finding]
    coverage: dict[str, Any]
    since: float
    until: float
    #: The ids of the root causes (:mod:`slokit.analysis.causality`), most important first.
    root_causes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The ``slokit diagnose --json`` document (docs/schema/diagnose.schema.json)."""
        return self.to_json()

    def to_json(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "root_causes": list(self.root_causes),
            "findings": [f.to_json() for f in self.findings],
            "coverage": self.coverage,
        }

    def root_findings(self) -> list[Finding]:
        """The root-cause findings, in :attr:`root_causes` order."""
        by_id = {f.id: f for f in self.findings}
        return [by_id[i] for i in self.root_causes if i in by_id]

    def chain(self) -> str | None:
        """The causal chain from the root causes, as the text report's second line."""
        return chain_text(
            self.root_causes,
            {f.id or "": f.explains for f in self.findings},
            {f.id or "": f.rule for f in self.findings},
        )


def run_diagnosis(
    reader: Reader,
    since: float | None = None,
    until: float | None = None,
    *,
    options: DiagnoseOptions | None = None,
    rules: Sequence[Rule] | None = None,
    requests_from: float | None = None,
) -> Diagnosis:
    """Run the rules over [since, until]; NotFound when the store holds no data there.

    ``requests_from`` (default: the reader's, where it has one): the store's requests are
    whole only from then on (retention deleted the older ones, while the time series it also
    holds may go back further): the window and its baseline start no earlier, so that no
    rule compares the window's requests with a baseline that lost its own."""
    opt = options or DiagnoseOptions()
    if requests_from is None:  # a LocalReader of a sidecar's store has one
        requests_from = getattr(reader, "requests_from", None)
    lo, hi = reader.bounds()
    if lo is None or hi is None:
        raise NotFound("the store holds no requests, engine or GPU samples")
    # (a window that ends before it is read as it is: the time series are whole there)
    clamped = False
    if (
        requests_from is not None
        and lo < requests_from < hi
        and (hi if until is None else until) > requests_from
    ):
        lo, clamped = requests_from, True
    if since is not None and until is not None and until <= since:
        raise BadInput(f"empty window: since {iso(since)} is not before until {iso(until)}")
    if (since is not None and since > hi) or (until is not None and until < lo):
        asked = " ".join(f"{k} {iso(v)}" for k, v in (("since", since), ("until", until))
                         if v is not None)  # fmt: skip
        raise NotFound(f"no data in the window ({asked}): the store holds {iso(lo)} .. {iso(hi)}")
    # Beyond the data a window holds nothing, yet bucketing 50 empty years would take minutes:
    # the window is kept to the data.
    start = lo if since is None else max(since, lo)
    end = hi if until is None else min(until, hi)
    if end <= start:  # the window asked for was not empty: the data in it is one instant
        raise NotFound(f"the data in the window is a single instant ({iso(start)}): "
                       "nothing to compare over time")  # fmt: skip
    ctx = build_context(reader, start, end, opt, data_start=lo)
    if not any(s.present for s in ctx.sources.values()):
        raise NotFound(f"no data between {iso(start)} and {iso(end)}")
    selected = list(rules) if rules is not None else all_rules()
    for rule in selected:
        missing = [s for s in rule.needs if not ctx.has(s)]
        if missing:
            ctx.withheld[rule.id] = "missing source: " + ", ".join(missing)
    status: dict[str, dict[str, Any]] = {}
    findings: list[Finding] = []
    for rule in selected:
        if rule.id in ctx.withheld:
            status[rule.id] = {"status": "withheld", "reason": ctx.withheld[rule.id]}
            continue
        try:
            got = rule.evaluate(ctx)
        except NotApplicable as exc:
            status[rule.id] = {"status": "not_applicable", "reason": str(exc)}
            continue
        except Exception as exc:  # one broken rule must not blind the others
            reason = f"{type(exc).__name__}: {exc}"
            log.error("rule %s failed, its findings are missing: %s", rule.id, reason)
            log.debug("rule %s failed", rule.id, exc_info=True)
            status[rule.id] = {"status": "failed", "reason": reason}
            continue
        status[rule.id] = {"status": "ran", "findings": len(got)}
        findings.extend(got)
    for rule_id, notes in ctx.notes.items():
        if rule_id in status:
            status[rule_id]["notes"] = notes
    linked = analyse(findings, tolerance_s=opt.bucket_s)  # links, capped severities, roots
    findings = linked.findings
    findings.sort(key=lambda f: (SEVERITY_ORDER.get(f.severity, 3), -f.confidence, f.start_ts))
    window = {
        "since": iso(start),
        "until": iso(end),
        "bucket_s": opt.bucket_s,
        "baseline": {
            "since": iso(ctx.base_since),
            "until": iso(ctx.base_until),
            "from": ctx.baseline_source,
        },
    }
    if clamped:
        window["requests_from"] = iso(lo)
    coverage: dict[str, Any] = {
        "sources": {name: s.to_json() for name, s in ctx.sources.items()},
        "rules": status,
        "ran": [r for r, s in status.items() if s["status"] == "ran"],
        "withheld": {r: s["reason"] for r, s in status.items() if s["status"] == "withheld"},
        "failed": {r: s["reason"] for r, s in status.items() if s["status"] == "failed"},
    }
    if earlier := _baseline_findings(reader, ctx):
        coverage["baseline_findings"] = earlier
    unjoined = getattr(reader, "unjoined", None)  # LocalReader: spans joined by trace id
    if unjoined is not None and (spans := unjoined(start, end)):
        coverage["unjoined_spans"] = spans
    if reader.basis == "histograms":
        _histogram_coverage(coverage, status, selected)
    return Diagnosis(window, findings, coverage, start, end, linked.root_causes)


#: The most stored findings a diagnosis names in its baseline (one per rule and replica).
MAX_BASELINE_FINDINGS = 20


def _baseline_findings(reader: Reader, ctx: DiagnoseContext) -> list[dict[str, Any]]:
    """Stored findings (an earlier diagnosis's, the sidecar's) that lie at least a bucket
    inside this diagnosis's baseline, one per rule and replica, earliest first: what the
    rules took for normal may have been an incident (``diagnose --since 15m`` 40 minutes into
    one judges it against itself and finds nothing)."""
    lo, hi = ctx.base_since, ctx.base_until - ctx.options.bucket_s
    if hi <= lo:
        return []
    spans: dict[tuple[str, str | None], list[float]] = {}
    for f in reader.findings(lo, hi, limit=1000):
        start, end = float(f["start"]), float(f["end"])
        if start >= hi or end <= lo:
            continue
        span = spans.setdefault((f["rule"], f["replica"]), [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)
    ordered = sorted(spans.items(), key=lambda kv: (kv[1][0], kv[0][0], kv[0][1] or ""))
    return [
        {"rule": rule, "replica": replica, "since": iso(a), "until": iso(b)}
        for (rule, replica), (a, b) in ordered[:MAX_BASELINE_FINDINGS]
    ]


#: Sources whose facts a histogram backend builds from aggregates instead of records.
_REQUEST_SOURCES = ("requests", "spans")


def _histogram_coverage(
    coverage: dict[str, Any], status: dict[str, dict[str, Any]], rules: Sequence[Rule]
) -> None:
    """Say which rules judged requests from vLLM's histograms rather than records."""
    on_hist = [r.id for r in rules if set(r.needs) & set(_REQUEST_SOURCES)]
    coverage["basis"] = "histograms"
    coverage["histogram_rules"] = [r for r in on_hist if status[r]["status"] == "ran"]
    for rule_id in on_hist:
        status[rule_id].setdefault("notes", []).append(
            "request facts from vLLM's histograms and counters per pod and bucket, not "
            "per-request records (percentiles interpolated within histogram buckets)"
        )


def diagnose(
    reader: Reader,
    since: float | None = None,
    until: float | None = None,
    *,
    options: DiagnoseOptions | None = None,
) -> dict[str, Any]:
    """The ``diagnose --json`` document for [since, until] (default: all the data)."""
    return run_diagnosis(reader, since, until, options=options).to_json()


def store_findings(
    store: Store,
    findings: Sequence[Finding],
    *,
    window: tuple[float, float] | None = None,
) -> int:
    """Persist findings (for ``explain`` and the exporter). With ``window``, findings that
    an earlier run stored for a span inside that window are replaced, so re-running a
    diagnosis over the same data does not duplicate them."""
    return store.replace_findings(findings, window)


def render_text(doc: dict[str, Any]) -> str:
    """The diagnosis for people: the root cause and its causal chain, then one line per
    finding (each consequence indented under its cause, then the independent findings),
    then what was (not) looked at."""
    w = doc["window"]
    base = w["baseline"]
    lines = _headline(doc)
    lines += [
        f"window {w['since']} .. {w['until']}  (baseline {base['since']} .. {base['until']},"
        f" from {base['from']})",
        "",
    ]
    failed = doc["coverage"].get("failed", {})
    for rule, reason in failed.items():
        lines.append(f"RULE FAILED {rule}: {reason} (its findings are missing)")
    if failed:
        lines.append("")
    if not doc["findings"]:
        lines.append(
            "no findings: nothing stands out against the baseline"
            if not failed
            else "no findings from the rules that ran"
        )
    lines += _finding_tree(doc)
    cov = doc["coverage"]
    if earlier := cov.get("baseline_findings"):
        lines += [
            "",
            "the baseline holds findings stored earlier: what it counts as normal may be an "
            "incident (--since before them judges it against the hour before it):",
        ]
        lines += [
            f"  {f['rule']} on {f['replica'] or 'fleet'} {f['since']} .. {f['until']}"
            for f in earlier
        ]
    lines += ["", "coverage:"]
    for name, s in cov["sources"].items():
        state = (
            f"{s['rows']} rows, replicas {', '.join(s['replicas']) or '-'}"
            if s["present"]
            else "absent"
        )
        lines.append(f"  source {name:<9} {state}")
    lines.append(f"  ran:      {', '.join(cov['ran']) or '-'}")
    for rule, st in cov["rules"].items():
        if st["status"] != "ran":
            lines.append(f"  {st['status']:<15} {rule}: {st['reason']}")
        for note in st.get("notes", []):
            lines.append(f"  note {rule}: {note}")
    return "\n".join(lines)


def _headline(doc: dict[str, Any]) -> list[str]:
    """``Root cause: <rule> on <replica>: <summary>`` (or ``A + B``) and the causal chain;
    nothing for a document from before root causes (an older sidecar)."""
    if "root_causes" not in doc:
        return []
    by_id = {f.get("id"): f for f in doc["findings"]}
    roots = [by_id[i] for i in doc["root_causes"] if i in by_id]
    if not roots:
        return ["Root cause: none (no finding at warning or above)", ""]
    if len(roots) == 1:
        head = f"Root cause: {label(roots[0]['rule'], roots[0]['replica'])}: {roots[0]['summary']}"
    else:
        head = "Root cause: " + " + ".join(label(f["rule"], f["replica"]) for f in roots)
    chain = chain_text(
        [f["id"] for f in roots],
        {f.get("id") or "": f.get("explains", []) for f in doc["findings"]},
        {f.get("id") or "": f["rule"] for f in doc["findings"]},
    )
    return [head, *([chain] if chain else []), ""]


def _finding_line(f: dict[str, Any]) -> str:
    return (
        f"{f['severity'].upper():<8} {f['rule']:<26} {f['replica'] or 'fleet':<12} "
        f"{f['summary']}  [{f['confidence']:.2f}] -> {f['runbook']}"
    )


def _finding_tree(doc: dict[str, Any]) -> list[str]:
    """The root causes with their consequences indented under them, then the independent
    findings (with theirs); a document without ids is listed flat."""
    findings = doc["findings"]
    by_id = {f["id"]: f for f in findings if f.get("id")}
    if len(by_id) != len(findings):
        return [_finding_line(f) for f in findings]
    roots = [i for i in doc.get("root_causes", []) if i in by_id]
    others = [f["id"] for f in findings if not f.get("caused_by") and f["id"] not in roots]
    lines: list[str] = []
    shown: set[str] = set()

    def emit(fid: str, depth: int, cause: str | None) -> None:
        shown.add(fid)
        f = by_id[fid]
        pad = "    " * depth
        lines.append(pad + _finding_line(f))
        for c in f.get("caused_by", []):
            if c["id"] == cause:
                lines.append(f"{pad}    caused by {cause}: {c['reason']}")
        for child in f.get("explains", []):
            if child in by_id and child not in shown:
                emit(child, depth + 1, fid)

    for fid in roots:
        emit(fid, 0, None)
    if roots and any(i not in shown for i in others):
        lines += ["", "independent findings:"]
    for fid in others:
        if fid not in shown:
            emit(fid, 0, None)
    lines += [_finding_line(f) for f in findings if f["id"] not in shown]  # never: a DAG
    return lines
