"""What the served work cost: per token, per good request, per successful task, energy.

GPU cost of a window = replicas x ``cost.gpus_per_replica`` x ``cost.gpu_hour_usd`` x hours.
Replicas are the distinct ``replica`` values in the records (1 when the records name none,
e.g. a client-only load file; the report says so). The window is the SLO report's (see
:mod:`slokit.analysis.slo`).

Tokens: the cost is split between input and output tokens by the time requests spent in
prefill and in decode (summed over requests). Prefill time is ``prefill_s`` where vLLM
reported it, else TTFT minus queue time, else TTFT; decode time is ``decode_s``, else E2E
minus TTFT. Cost per 1M input tokens = cost x prefill share / input tokens x 1e6; output
likewise with the decode share.

Good requests are those :func:`slokit.analysis.slo.classify` calls ``good`` (a request that
matches no class has no bounds: it is good when it finished ok and did not fail quality).
Tasks: requests grouped by ``task_id`` (a request without one is a task by itself); a task
succeeds when all its requests are good and none failed quality (``quality_pass`` False),
whether or not the spec requires quality for goodness.

Energy: where GPU samples carry cumulative ``energy_j`` (DCGM total energy), the increase
per GPU over the window (a decrease is a counter reset) summed over GPUs; per output token.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slokit.analysis.slo import classify, measurement
from slokit.analysis.slo_spec import SloSpec


@dataclass(frozen=True)
class TaskSummary:
    tasks: int
    successful: int
    requests_without_task: int


def task_outcomes(records: Iterable[Mapping[str, Any]], spec: SloSpec) -> TaskSummary:
    """Count tasks and successful tasks (rules in the module docstring)."""
    ok_by_task: dict[str, bool] = {}
    loose = 0
    for i, r in enumerate(records):
        task = r.get("task_id")
        if task is None:
            loose += 1
            key = f"\0request:{i}"
        else:
            key = str(task)
        good = classify(r, spec)[1] == "good" and r.get("quality_pass") is not False
        ok_by_task[key] = ok_by_task.get(key, True) and good
    return TaskSummary(len(ok_by_task), sum(ok_by_task.values()), loose)


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    return float(v)


def prefill_seconds(r: Mapping[str, Any]) -> float | None:
    p = _num(r.get("prefill_s"))
    if p is not None:
        return p
    ttft = measurement(r, "ttft")
    if ttft is None:
        return None
    q = _num(r.get("queue_s"))
    return max(0.0, ttft - q) if q is not None else ttft


def decode_seconds(r: Mapping[str, Any]) -> float | None:
    d = _num(r.get("decode_s"))
    if d is not None:
        return d
    e2e, ttft = measurement(r, "e2e"), measurement(r, "ttft")
    if e2e is None or ttft is None:
        return None
    return max(0.0, e2e - ttft)


@dataclass
class CostReport:
    gpu_hour_usd: float
    gpus_per_replica: int
    replicas: int
    duration_s: float
    total_usd: float
    input_tokens: int
    output_tokens: int
    prefill_share: float | None
    usd_per_1m_input_tokens: float | None
    usd_per_1m_output_tokens: float | None
    good_requests: int
    usd_per_good_request: float | None
    tasks: TaskSummary
    usd_per_successful_task: float | None
    energy_j: float | None = None
    j_per_output_token: float | None = None
    assumptions: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu_hour_usd": self.gpu_hour_usd,
            "gpus_per_replica": self.gpus_per_replica,
            "replicas": self.replicas,
            "duration_s": self.duration_s,
            "total_usd": self.total_usd,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "prefill_time_share": self.prefill_share,
            "usd_per_1m_input_tokens": self.usd_per_1m_input_tokens,
            "usd_per_1m_output_tokens": self.usd_per_1m_output_tokens,
            "good_requests": self.good_requests,
            "usd_per_good_request": self.usd_per_good_request,
            "tasks": self.tasks.tasks,
            "successful_tasks": self.tasks.successful,
            "usd_per_successful_task": self.usd_per_successful_task,
            "energy_j": self.energy_j,
            "j_per_output_token": self.j_per_output_token,
            "assumptions": list(self.assumptions),
        }


def compute_cost(
    records: Sequence[Mapping[str, Any]],
    spec: SloSpec,
    *,
    duration_s: float | None,
    replicas: int | None = None,
    energy_j: float | None = None,
) -> CostReport | None:
    """Cost of the window's work; None when the spec has no ``cost.gpu_hour_usd`` or the
    window has no duration (records without times and no duration given)."""
    if spec.gpu_hour_usd is None or not duration_s:
        return None
    notes: list[str] = []
    if replicas is None:
        named = {str(r["replica"]) for r in records if r.get("replica") is not None}
        replicas = len(named)
        if replicas == 0:
            replicas = 1
            notes.append("records name no replica: assumed 1 replica")
    total = replicas * spec.gpus_per_replica * spec.gpu_hour_usd * duration_s / 3600.0
    notes.append(
        f"cost = {replicas} replica(s) x {spec.gpus_per_replica} GPU(s) x "
        f"${spec.gpu_hour_usd:g}/GPU-hour x {duration_s:.1f} s"
    )
    inp = sum(int(_num(r.get("prompt_tokens")) or 0) for r in records)
    out = sum(int(_num(r.get("output_tokens")) or 0) for r in records)
    pre = sum(v for r in records if (v := prefill_seconds(r)) is not None)
    dec = sum(v for r in records if (v := decode_seconds(r)) is not None)
    share = pre / (pre + dec) if pre + dec > 0 else None
    if share is not None:
        notes.append(f"prefill/decode split by summed request time: {share:.3f} prefill")
    per_in = total * share / inp * 1e6 if share is not None and inp else None
    per_out = total * (1 - share) / out * 1e6 if share is not None and out else None
    good = sum(1 for r in records if classify(r, spec)[1] == "good")
    tasks = task_outcomes(records, spec)
    if tasks.requests_without_task:
        notes.append(f"{tasks.requests_without_task} request(s) without task_id: one task each")
    return CostReport(
        gpu_hour_usd=spec.gpu_hour_usd,
        gpus_per_replica=spec.gpus_per_replica,
        replicas=replicas,
        duration_s=duration_s,
        total_usd=total,
        input_tokens=inp,
        output_tokens=out,
        prefill_share=share,
        usd_per_1m_input_tokens=per_in,
        usd_per_1m_output_tokens=per_out,
        good_requests=good,
        usd_per_good_request=total / good if good else None,
        tasks=tasks,
        usd_per_successful_task=total / tasks.successful if tasks.successful else None,
        energy_j=energy_j,
        j_per_output_token=energy_j / out if energy_j is not None and out else None,
        assumptions=notes,
    )


def money(v: float | None) -> str:
    """Dollars: cents above $1, else four significant digits ($0.0002381)."""
    if v is None:
        return "-"
    if abs(v) >= 1 or v == 0:
        return f"${v:,.2f}"
    decimals = max(2, 3 - math.floor(math.log10(abs(v))))
    return f"${v:.{decimals}f}"


def render_text(cost: CostReport) -> str:
    lines = [
        f"cost {money(cost.total_usd)} over {cost.duration_s:.1f} s",
        f"  per 1M input tokens {money(cost.usd_per_1m_input_tokens)}"
        f"  per 1M output tokens {money(cost.usd_per_1m_output_tokens)}",
        f"  per good request {money(cost.usd_per_good_request)} ({cost.good_requests} good)",
        f"  per successful task {money(cost.usd_per_successful_task)}"
        f" ({cost.tasks.successful}/{cost.tasks.tasks} tasks succeeded)",
    ]
    if cost.energy_j is not None:
        jpt = "-" if cost.j_per_output_token is None else f"{cost.j_per_output_token:.3f}"
        lines.append(f"  energy {cost.energy_j:.0f} J, {jpt} J per output token")
    lines += [f"  assumes: {a}" for a in cost.assumptions]
    return "\n".join(lines)
