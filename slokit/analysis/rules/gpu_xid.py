"""gpu_xid: the GPU driver reported an XID error.

``DCGM_FI_DEV_XID_ERRORS`` holds the last XID the driver logged for the GPU (0: none). Any
non-zero value is a hardware or driver event (a physical signal: no baseline needed). Some
codes mean the GPU is gone or its memory is corrupt and the replica must be drained.
"""

from __future__ import annotations

from slokit.analysis.rules import register
from slokit.analysis.rules._context import DiagnoseContext
from slokit.analysis.rules._util import (
    fmt_pct,
    items,
    make_finding,
    num,
    on,
    ratio,
    rnd,
    rows_of,
)
from slokit.records import Finding, Severity

#: XID codes and what they mean (NVIDIA's XID catalogue); critical ones need a drain/reset.
XID_MEANING: dict[int, tuple[str, str]] = {
    13: ("graphics engine exception (often the application)", "warning"),
    31: ("GPU memory page fault (often the application)", "warning"),
    43: ("GPU stopped processing (application fault)", "warning"),
    45: ("preemptive cleanup after an earlier error", "warning"),
    48: ("double-bit ECC error", "critical"),
    61: ("internal micro-controller breakpoint/warning", "critical"),
    62: ("internal micro-controller halt", "critical"),
    63: ("ECC page retirement / row remapping event", "warning"),
    64: ("ECC page retirement / row remapping failure", "critical"),
    74: ("NVLink error", "critical"),
    79: ("GPU has fallen off the bus", "critical"),
    92: ("high single-bit ECC error rate", "warning"),
    94: ("contained ECC error", "critical"),
    95: ("uncontained ECC error", "critical"),
    119: ("GSP RPC timeout", "critical"),
    120: ("GSP error", "critical"),
}


@register
class GpuXid:
    id = "gpu_xid"
    needs = ("gpu",)

    def evaluate(self, ctx: DiagnoseContext) -> list[Finding]:
        out = []
        gpu = ctx.gpu[ctx.in_window(ctx.gpu)]
        for replica in sorted(gpu["replica"].unique()):
            rows = rows_of(gpu, replica)
            hit = rows[rows["xid_max"].fillna(0) != 0]
            if hit.empty:
                continue
            start = ctx.bucket_start(int(hit["bucket"].min()))
            end = ctx.bucket_end(int(hit["bucket"].max()))
            codes = sorted({int(x) for xs in hit["xids"] for x in items(xs) if num(x) is not None})
            gpus = sorted({str(g) for gs in hit["gpus"] for g in items(gs)})
            meanings = {
                c: XID_MEANING.get(c, ("see NVIDIA's XID catalogue", "critical")) for c in codes
            }
            severity: Severity = (
                "critical" if any(m[1] == "critical" for m in meanings.values()) else "warning"
            )
            desc = ", ".join(f"XID {c} ({meanings[c][0]})" for c in codes)
            summary = f"{desc}{on(replica)} (GPU {', '.join(gpus)})"
            first_bucket = int(rows["bucket"].min())
            preexisting = int(hit["bucket"].min()) == first_bucket
            if preexisting:
                summary += "; already set when the window starts (the gauge keeps the last XID)"
            evidence = {
                "xids": codes,
                "gpus": gpus,
                "meaning": {str(c): m[0] for c, m in meanings.items()},
                "buckets_with_xid": len(hit),
                "set_at_window_start": preexisting,
            }
            if ctx.has("requests"):
                s = ctx.request_summary(replica, start, end)
                fleet = ctx.request_summary(None, start, end)
                err = ratio(s["n_err"], s["n"])
                if not s["n_err"] and fleet["n_err"]:
                    # Requests that fail before reaching the engine carry no replica.
                    fleet_err = ratio(fleet["n_err"], fleet["n"])
                    summary += (
                        f"; {fmt_pct(fleet_err)} of all requests failed meanwhile "
                        "(the failures name no replica)"
                    )
                    evidence["fleet_error_ratio"] = rnd(fleet_err)
                elif err is not None:
                    summary += f"; {fmt_pct(err)} of its requests failed meanwhile"
                evidence["error_ratio"] = rnd(err)
                evidence["requests"] = num(s["n"])
            out.append(
                make_finding(
                    self.id,
                    severity=severity,
                    confidence=0.95,
                    replica=replica,
                    start=start,
                    end=end,
                    summary=summary,
                    evidence=evidence,
                )
            )
        return out
