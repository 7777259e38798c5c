"""Text output of a load run: the end-of-run summary, a sweep's table, progress lines."""

from __future__ import annotations

from collections.abc import Sequence

from slokit.lab.load.stats import LoadSummary, Progress


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}ms"


def _num(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def format_summary(s: LoadSummary) -> str:
    """The end-of-run summary, a few aligned lines."""
    if s.mode == "open":
        load = f"open loop, target {_num(s.target_rate, 'g')} req/s over {s.duration_s:g}s"
    else:
        load = f"closed loop, {s.users} users over {s.duration_s:g}s"
    lines = [
        f"run {s.run_id}: {load}",
        f"  requests  sent {s.sent}  ok {s.ok}  {s.errors_text()}  timeouts {s.timeouts}"
        f"  cancelled {s.cancelled}  incomplete {s.incomplete}",
        f"  rate      achieved {_num(s.achieved_rate, '.2f')} req/s",
    ]
    if s.mode == "open":
        lines[-1] += (
            f"  (send lag p50 {_ms(s.send_lag_p50_s)}  p99 {_ms(s.send_lag_p99_s)}"
            f"  max {_ms(s.send_lag_max_s)})"
        )
    lines += [
        f"  TTFT      p50 {_ms(s.ttft_p50_s)}  p95 {_ms(s.ttft_p95_s)}  p99 {_ms(s.ttft_p99_s)}",
        f"  E2E       p50 {_ms(s.e2e_p50_s)}  p95 {_ms(s.e2e_p95_s)}  p99 {_ms(s.e2e_p99_s)}",
        f"  TPOT      p50 {_ms(s.tpot_p50_s)}  p95 {_ms(s.tpot_p95_s)}",
        f"  output    {s.output_tokens} tokens, {_num(s.output_tokens_per_s)} tokens/s",
    ]
    if s.out:
        lines.append(f"  records   {s.out}")
    return "\n".join(lines)


def format_sweep_table(summaries: Sequence[LoadSummary]) -> str:
    """One row per rate: what was offered, what came back (``failed``: errors, timeouts and
    cancelled; ``incomplete``: cut at the end of the step, after the drain)."""
    header = (
        f"{'rate':>8} {'achieved':>9} {'ok':>6} {'failed':>6} {'incomplete':>10} "
        f"{'ttft_p50':>10} {'ttft_p95':>10} {'tpot_p50':>10} {'out_tok/s':>10}"
    )
    rows = [header]
    for s in summaries:
        rows.append(
            f"{_num(s.target_rate, 'g'):>8} {_num(s.achieved_rate, '.2f'):>9} {s.ok:>6} "
            f"{s.errors + s.timeouts + s.cancelled:>6} {s.incomplete:>10} "
            f"{_ms(s.ttft_p50_s):>10} {_ms(s.ttft_p95_s):>10} {_ms(s.tpot_p50_s):>10} "
            f"{_num(s.output_tokens_per_s):>10}"
        )
    return "\n".join(rows)


def format_progress(p: Progress) -> str:
    return (
        f"[{p.elapsed_s:6.1f}s/{p.duration_s:g}s] sent {p.sent} ok {p.ok} failed {p.failed} "
        f"in flight {p.in_flight} ttft p50 {_ms(p.ttft_p50_s)}"
    )
