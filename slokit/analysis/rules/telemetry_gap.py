"""telemetry_gap: a source is missing, stale or reset, so some conclusions are withheld.

Three kinds of blindness, each reported instead of guessed around:

* **missing**: a source has no rows in the window. The rules that need it are withheld
  (the coverage section lists them); the finding is ``info`` when the store never held that
  source (a CPU deployment has no GPU telemetry) and ``warning`` when it did.
* **stale**: a replica's engine or GPU samples stop for longer than ``stale_factor`` times
  their usual interval (and at least ``min_gap_s``), or its scrapes failed (``scrapes.up``
  false): ``warning``.
* **reset**: a cumulative counter went down (the engine restarted); increases across it are
  counted from zero, and what happened between the last sample and the restart is unknown:
  ``info``.
"""

from __future__ import annotations

from typing import Any

from slokit.analysis.rules import all_rules, register
from slokit.analysis.rules._context import SOURCES, DiagnoseContext
from slokit.analysis.rules._util import make_finding, num
from slokit.records import Finding
from slokit.timeutil import iso

LABELS = {
    "requests": "request records",
    "spans": "vLLM request timing (llm_request spans)",
    "engine": "vLLM engine metrics",
    "gpu": "GPU telemetry (DCGM/NVML)",
}
_SCRAPE_SOURCE = {"vllm": "engine", "dcgm": "gpu", "nvml": "gpu"}


@register
class TelemetryGap:
    id = "telemetry_gap"
    needs: tuple[str, ...] = ()

    def evaluate(self, ctx: DiagnoseContext) -> list[Finding]:
        out = self._missing(ctx)
        problems: dict[tuple[str, str], dict[str, Any]] = {}
        for source in ("engine", "gpu"):
            if ctx.has(source):
                for replica, gaps in self._gaps(ctx, source).items():
                    problems.setdefault((source, replica), {})["gaps"] = gaps
        for row in self._failed_scrapes(ctx):
            source = _SCRAPE_SOURCE.get(row["kind"], row["kind"])
            problems.setdefault((source, row["replica"] or row["target"]), {}).setdefault(
                "failed_scrapes", []
            ).append(row)
        for (source, replica), p in sorted(problems.items()):
            out.append(self._stale_finding(ctx, source, replica, p))
        out.extend(self._resets(ctx))
        return out

    # -- missing -----------------------------------------------------------------------
    def _missing(self, ctx: DiagnoseContext) -> list[Finding]:
        out = []
        for source in SOURCES:
            if ctx.has(source):
                continue
            rules = sorted(r.id for r in all_rules() if source in r.needs)
            last = self._last_seen(ctx, source)
            if source == "spans" and not ctx.has("requests"):
                continue  # already said by "requests"
            summary = f"no {LABELS[source]} in the window"
            if last is not None:
                summary += f" (last seen {iso(last)})"
            summary += f"; withheld: {', '.join(rules)}" if rules else ""
            out.append(
                make_finding(
                    self.id,
                    severity="warning" if last is not None else "info",
                    confidence=1.0,
                    replica=None,
                    start=ctx.since,
                    end=ctx.until,
                    summary=summary,
                    evidence={
                        "kind": "missing",
                        "source": source,
                        "withheld": rules,
                        "last_seen": iso(last),
                    },
                )
            )
        return out

    @staticmethod
    def _last_seen(ctx: DiagnoseContext, source: str) -> float | None:
        return num(ctx.reader.last_seen(source, ctx.since))

    # -- stale -------------------------------------------------------------------------
    @staticmethod
    def _gaps(ctx: DiagnoseContext, source: str) -> dict[str, list[dict[str, Any]]]:
        o = ctx.options
        gaps = ctx.reader.sample_gaps(
            source, ctx.since, ctx.until, stale_factor=o.stale_factor, min_gap_s=o.min_gap_s
        )
        out: dict[str, list[dict[str, Any]]] = {}
        for replica, start, end, med in gaps:
            out.setdefault(replica, []).append(
                {
                    "start": start,
                    "end": end,
                    "duration_s": round(end - start, 3),
                    "usual_interval_s": round(med, 3) if med is not None else None,
                }
            )
        return out

    @staticmethod
    def _failed_scrapes(ctx: DiagnoseContext) -> list[dict[str, Any]]:
        return ctx.reader.failed_scrapes(ctx.since, ctx.until)

    def _stale_finding(
        self, ctx: DiagnoseContext, source: str, replica: str, p: dict[str, Any]
    ) -> Finding:
        gaps = p.get("gaps", [])
        failed = p.get("failed_scrapes", [])
        starts = [g["start"] for g in gaps] + [f["first"] for f in failed]
        ends = [g["end"] for g in gaps] + [f["last"] for f in failed]
        parts = []
        if gaps:
            longest = max(gaps, key=lambda g: g["duration_s"])
            parts.append(
                f"{len(gaps)} gap{'s' if len(gaps) != 1 else ''} in "
                f"{LABELS.get(source, source)} (longest {longest['duration_s']:.0f} s "
                f"from {iso(longest['start'])})"
            )
        if failed:
            n = sum(f["failed"] for f in failed)
            err = next((f["error"] for f in failed if f["error"] and f["error"].strip()), None)
            if err is not None:
                err = err.strip().splitlines()[0][:80]
            parts.append(f"{n} failed scrape{'s' if n != 1 else ''}{f' ({err})' if err else ''}")
        rules = sorted(r.id for r in all_rules() if source in r.needs)
        summary = (
            f"{'; '.join(parts)} for {replica}: conclusions from {source} data "
            f"({', '.join(rules)}) are blind over those periods"
        )
        return make_finding(
            self.id,
            severity="warning",
            confidence=0.9,
            replica=replica,
            start=min(starts),
            end=max(ends),
            summary=summary,
            evidence={
                "kind": "stale",
                "source": source,
                "gaps": [{**g, "start": iso(g["start"]), "end": iso(g["end"])} for g in gaps],
                "failed_scrapes": [
                    {**f, "first": iso(f["first"]), "last": iso(f["last"])} for f in failed
                ],
                "affected_rules": rules,
            },
        )

    # -- reset -------------------------------------------------------------------------
    def _resets(self, ctx: DiagnoseContext) -> list[Finding]:
        out: list[Finding] = []
        eng = ctx.engine
        if eng.empty:
            return out
        hit = eng[ctx.in_window(eng) & (eng["resets"] > 0)]
        for replica, rows in hit.groupby("replica"):
            times = [ctx.bucket_start(int(b)) for b in rows["bucket"]]
            n = int(rows["resets"].sum())
            summary = (
                f"engine counters of {replica} reset {n} time{'s' if n != 1 else ''} "
                f"(restart?), first near {iso(times[0])}: increases across a reset "
                "count from zero; what happened just before it is unknown"
            )
            out.append(
                make_finding(
                    self.id,
                    severity="info",
                    confidence=0.9,
                    replica=str(replica),
                    start=times[0],
                    end=ctx.bucket_end(int(rows["bucket"].max())),
                    summary=summary,
                    evidence={
                        "kind": "reset",
                        "source": "engine",
                        "resets": n,
                        "near": [iso(t) for t in times],
                    },
                )
            )
        return out
