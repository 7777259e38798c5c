"""Fault knobs of the simulator and the named scenario presets.

Faults are plain data, switchable at start (``slokit sim --scenario NAME``) and at run
time (``POST /admin/faults`` with a JSON object on a replica's port; ``GET`` returns the
current state). A POST merges the given keys into the current faults; ``{"clear": true}``
first resets everything. Keys:

``frontend_delay_s`` (float)
    Tokenizer/CPU slowdown: each request spends this long in a single-threaded frontend
    before it reaches the engine (requests queue behind each other there). Shows as TTFT
    without engine queue time.
``step_gap_s`` (float)
    Engine starved by the CPU: an idle gap after every engine step (GPU idle, so
    utilisation and power drop while requests wait).
``gpu_clock_ratio`` (0 < r <= 1)
    GPU throttle: SM clock at ``r`` of its maximum. Steps slow down (compute by ``r``,
    memory-bound work by ``0.5 + 0.5 r``); DCGM SM clock and power show it.
``xid`` (int, 0 = none)
    Last XID error reported by DCGM (``DCGM_FI_DEV_XID_ERRORS``), e.g. 79 or 48.
``error_rate`` (0..1)
    Fraction of requests rejected with vLLM's 500 ``InternalServerError`` body.
``kv_blocks`` (int, 0 = full pool)
    KV pool shrink: only this many KV blocks usable (preemptions and usage near 1 follow).
``prefix_caching`` (bool)
    Prefix cache on/off (off: hit ratio falls to 0, as after losing prefix affinity).
``spec_decode`` (object or null)
    ``{"num_speculative_tokens": k, "acceptance_rate": a}``: speculative decoding with
    ``k`` draft tokens per step, each accepted with probability ``a`` while the run of
    accepted drafts lasts; emits vLLM's ``vllm:spec_decode_*`` counters.
``metrics_blackout`` (bool)
    ``/metrics`` (vLLM and DCGM) answer 503: a telemetry gap.
``router_max_inflight`` (int, 0 = no limit)
    The gateway router's concurrency limit (:mod:`slokit.lab.sim.router`; only the router's
    own ``/admin/faults`` reads it): requests past it wait in the router's flow-control
    queue, outside the engines. Set too low, they queue at the gateway while the engines
    have headroom.
``crash`` (object)
    ``{"down_s": s}``: the replica crashes now (in-flight requests fail, its port stops
    answering), restarts after ``s`` seconds with fresh counters. Not persisted in state.

Scenario presets, named for the diagnostic rule ids of docs/diagnose.md (engine knobs are
applied at start; the load decides the rest):

=========================  ============================================================
``healthy``                no faults
``queue_saturation``       ``max_num_seqs=16``: a modest burst fills the waiting queue
``prefill_saturation``     ``max_num_batched_tokens=512``: long prompts queue in prefill
``decode_saturation``      ``max_num_seqs=512``: large running batches, TPOT rises
``kv_pressure``            ``num_gpu_blocks=2048`` (32k tokens): preemptions, usage near 1
``frontend_bound``         ``frontend_delay_s=0.02``, ``step_gap_s=0.01``
``prefix_affinity_loss``   prefix caching off (hit ratio collapses)
``beyond_knee``            ``max_num_seqs=64``: drive past the knee with the load
``gpu_throttle``           ``gpu_clock_ratio=0.45``
``gpu_xid``                ``xid=79``, ``error_rate=0.5``
``error_burst``            ``error_rate=0.3``
``spec_decode_low_acceptance``  ``spec_decode={k: 4, acceptance_rate: 0.15}``
``telemetry_gap``          ``metrics_blackout=true``
``crash_restart``          start healthy; crash with ``POST /admin/faults {"crash": {...}}``
=========================  ============================================================
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


class FaultError(ValueError):
    """A fault specification that cannot be applied."""


@dataclass
class SpecDecode:
    num_speculative_tokens: int = 3
    acceptance_rate: float = 0.7


@dataclass
class Faults:
    frontend_delay_s: float = 0.0
    step_gap_s: float = 0.0
    gpu_clock_ratio: float = 1.0
    xid: int = 0
    error_rate: float = 0.0
    kv_blocks: int = 0
    prefix_caching: bool = True
    spec_decode: SpecDecode | None = None
    metrics_blackout: bool = False
    router_max_inflight: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "frontend_delay_s": (0.0, 60.0),
    "step_gap_s": (0.0, 10.0),
    "gpu_clock_ratio": (0.05, 1.0),
    "error_rate": (0.0, 1.0),
}


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FaultError(f"{key} must be a number, got {value!r}")
    lo, hi = _FLOAT_RANGES[key]
    if not lo <= float(value) <= hi:
        raise FaultError(f"{key} must be within [{lo}, {hi}], got {value}")
    return float(value)


def _integer(key: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FaultError(f"{key} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise FaultError(f"{key} must be within [{lo}, {hi}], got {value}")
    return value


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise FaultError(f"{key} must be true or false, got {value!r}")
    return value


def _spec(value: Any) -> SpecDecode | None:
    if value is None or value is False:
        return None
    if not isinstance(value, dict):
        raise FaultError("spec_decode must be an object or null")
    unknown = set(value) - {"num_speculative_tokens", "acceptance_rate"}
    if unknown:
        raise FaultError(f"unknown spec_decode keys: {sorted(unknown)}")
    k = _integer("num_speculative_tokens", value.get("num_speculative_tokens", 3), 1, 16)
    a = value.get("acceptance_rate", 0.7)
    if isinstance(a, bool) or not isinstance(a, int | float) or not 0.0 <= a <= 1.0:
        raise FaultError(f"acceptance_rate must be within [0, 1], got {a!r}")
    return SpecDecode(k, float(a))


@dataclass
class Crash:
    down_s: float = 5.0


@dataclass
class FaultUpdate:
    """A parsed admin request: the new faults and an optional crash to perform."""

    faults: Faults
    crash: Crash | None = None


def apply_update(current: Faults, body: Any) -> FaultUpdate:
    """Validate an admin JSON body and merge it into a copy of ``current``."""
    if not isinstance(body, dict):
        raise FaultError("body must be a JSON object")
    known = {f.name for f in dataclasses.fields(Faults)} | {"clear", "crash"}
    unknown = set(body) - known
    if unknown:
        raise FaultError(f"unknown fault keys: {sorted(unknown)}")
    new = Faults() if body.get("clear") else dataclasses.replace(current)
    for key, value in body.items():
        if key in _FLOAT_RANGES:
            setattr(new, key, _number(key, value))
        elif key == "xid":
            new.xid = _integer(key, value, 0, 1000)
        elif key == "kv_blocks":
            new.kv_blocks = _integer(key, value, 0, 10**9)
        elif key == "router_max_inflight":
            new.router_max_inflight = _integer(key, value, 0, 10**6)
        elif key in ("prefix_caching", "metrics_blackout"):
            setattr(new, key, _flag(key, value))
        elif key == "spec_decode":
            new.spec_decode = _spec(value)
    crash = None
    if "crash" in body:
        spec = body["crash"]
        if not isinstance(spec, dict):
            raise FaultError('crash must be an object such as {"down_s": 5}')
        down = spec.get("down_s", 5.0)
        if isinstance(down, bool) or not isinstance(down, int | float) or not 0 <= down <= 3600:
            raise FaultError(f"crash.down_s must be within [0, 3600], got {down!r}")
        crash = Crash(float(down))
    return FaultUpdate(new, crash)


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    faults: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, int] = field(default_factory=dict)  # overrides of EngineConfig


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("healthy", "no faults"),
        Scenario(
            "queue_saturation",
            "few sequences may run: a modest burst fills the waiting queue",
            engine={"max_num_seqs": 16},
        ),
        Scenario(
            "prefill_saturation",
            "small token budget per step: long prompts queue in prefill",
            engine={"max_num_batched_tokens": 512},
        ),
        Scenario(
            "decode_saturation",
            "very large running batches: TPOT rises with batch size",
            engine={"max_num_seqs": 512},
        ),
        Scenario(
            "kv_pressure",
            "KV pool of 2048 blocks (like --num-gpu-blocks-override 2048)",
            engine={"num_gpu_blocks": 2048},
        ),
        Scenario(
            "frontend_bound",
            "slow tokenizer and starved engine loop",
            faults={"frontend_delay_s": 0.02, "step_gap_s": 0.01},
        ),
        Scenario("prefix_affinity_loss", "prefix caching off", faults={"prefix_caching": False}),
        Scenario(
            "beyond_knee",
            "capped batch: throughput flattens while the tail grows under more load",
            engine={"max_num_seqs": 64},
        ),
        Scenario("gpu_throttle", "SM clock at 45%", faults={"gpu_clock_ratio": 0.45}),
        Scenario("gpu_xid", "XID 79 and failing requests", faults={"xid": 79, "error_rate": 0.5}),
        Scenario("error_burst", "30% of requests fail with 500", faults={"error_rate": 0.3}),
        Scenario(
            "spec_decode_low_acceptance",
            "speculative decoding, 4 drafts, 15% acceptance",
            faults={"spec_decode": {"num_speculative_tokens": 4, "acceptance_rate": 0.15}},
        ),
        Scenario("telemetry_gap", "/metrics answers 503", faults={"metrics_blackout": True}),
        Scenario("crash_restart", "healthy; crash at run time via the admin endpoint"),
    ]
}


def scenario_faults(name: str) -> tuple[Faults, dict[str, int]]:
    """Faults and engine overrides of a named preset; FaultError for an unknown name."""
    if name not in SCENARIOS:
        raise FaultError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    s = SCENARIOS[name]
    return apply_update(Faults(), s.faults).faults, dict(s.engine)
