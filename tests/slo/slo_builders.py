"""Builders for hand-computable request sets (imported by the SLO tests)."""

from __future__ import annotations

from typing import Any

from slokit.records import RequestFragment

SPEC_YAML = """\
slokit: v1
service: chat
period: 30d
classes:
  - name: interactive
    match: {slo_class: interactive}
    good_when: {ttft_ms: 500, tpot_ms: 50}
    objective: 0.9
  - name: batch
    match: {slo_class: batch}
    good_when: {e2e_ms: 10000}
    objective: 0.5
quality:
  require_pass: true
cost:
  gpu_hour_usd: 3.6
  gpus_per_replica: 2
"""


def frag(rid: str, **fields: Any) -> RequestFragment:
    """A client fragment; ``finish_ts`` defaults to arrival + E2E."""
    fields.setdefault("status", "ok")
    if fields.get("finish_ts") is None and fields.get("arrival_ts") is not None:
        e2e = fields.get("client_e2e_s")
        if e2e is not None:
            fields["finish_ts"] = fields["arrival_ts"] + e2e
    return RequestFragment(request_id=rid, source="client", fragment_id=f"client:{rid}", **fields)


def interactive(i: int, **kw: Any) -> RequestFragment:
    base: dict[str, Any] = dict(
        slo_class="interactive", replica="r0", arrival_ts=1000.0 + 10 * i,
        client_ttft_s=0.2, client_e2e_s=1.2, tpot_s=0.02, prompt_tokens=100,
        output_tokens=50,
    )  # fmt: skip
    base.update(kw)
    return frag(f"i{i}", **base)


def batch(i: int, **kw: Any) -> RequestFragment:
    base: dict[str, Any] = dict(
        slo_class="batch", replica="r0", arrival_ts=1060.0 + 10 * i, client_ttft_s=1.0,
        client_e2e_s=5.0, prompt_tokens=1000, output_tokens=200,
    )  # fmt: skip
    base.update(kw)
    return frag(f"b{i}", **base)


def known_fragments() -> list[RequestFragment]:
    """The hand-computed set (numbers in test_evaluate.py), first arrival 1000, last finish 1100.

    interactive (objective 0.9): i0-i5 good, i6 slow (TTFT 800 ms), i7 error, i8 quality
    fail, i9 slow (no TPOT measured) -> 6/10 good. batch (objective 0.5): b0-b2 good (b2 at
    its 10 s bound), b3 slow (E2E 20 s, finishing at 1100) -> 3/4 good.
    Tasks: t1 = i0,i1,i2 (succeeds), t2 = i3,i4 (succeeds), t3 = i5,i6 (fails); the other
    seven requests are tasks of their own (b0, b1, b2 succeed) -> 5 of 10 tasks succeed.
    """
    return [
        interactive(0, task_id="t1"),
        interactive(1, task_id="t1"),
        interactive(2, task_id="t1"),
        interactive(3, task_id="t2"),
        interactive(4, task_id="t2"),
        interactive(5, task_id="t3"),
        interactive(6, task_id="t3", client_ttft_s=0.8),
        interactive(
            7,
            status="error",
            client_ttft_s=None,
            client_e2e_s=None,
            tpot_s=None,
            output_tokens=None,
            finish_ts=1071.0,
        ),
        interactive(8, quality_pass=False),
        interactive(9, tpot_s=None, output_tokens=None),
        batch(0),
        batch(1),
        batch(2, client_e2e_s=10.0),  # at the bound: met
        batch(3, arrival_ts=1080.0, client_e2e_s=20.0),  # finishes at 1100: slow
    ]
