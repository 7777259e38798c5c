"""The physical chains of serving between the rules' findings, as data: :data:`CHAINS`.

Each :class:`Chain` is a cause rule, an effect rule, the mechanism's steps, a condition on the
two findings' evidence (the quantity that moves the effect, read from the cause's and the
effect's evidence; None when that evidence is absent, as in stored findings) and a reason
template. :mod:`slokit.analysis.causality` links findings by these chains and ranks the root
causes. Pure functions: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from slokit.records import Finding
from slokit.timeutil import iso

#: Default tolerance on "the cause starts before or with the effect" (the rules' bucket).
DEFAULT_TOLERANCE_S: Final = 10.0

#: A condition's verdict: True (the evidence links them), False (it does not), None (the
#: evidence needed is not there).
Verdict = bool | None
Condition = Callable[[Finding, Finding], Verdict]
Reason = Callable[[Finding, Finding], str]


@dataclass(frozen=True)
class Chain:
    """One physical chain: ``cause`` rule -> ``steps`` -> ``effect`` rule."""

    cause: str
    effect: str
    steps: tuple[str, ...]
    condition: Condition
    reason: Reason
    to_fleet: bool = False  # a per-replica cause may explain a fleet-wide effect


# -- evidence -------------------------------------------------------------------------------


def _num(f: Finding, *path: str) -> float | None:
    """A number of ``f``'s evidence at ``path`` (nested keys), or None."""
    v: Any = f.evidence
    for key in path:
        if not isinstance(v, Mapping):
            return None
        v = v.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def _ratio(f: Finding, key: str) -> float | None:
    """``episode[key] / baseline[key]`` of a TTFT finding's evidence."""
    ep, base = _num(f, "episode", key), _num(f, "baseline", key)
    return ep / base if ep is not None and base else None


def _pct(v: float | None) -> str:
    return "?%" if v is None else f"{v * 100:.0f}%"


def _hhmm(ts: float) -> str:
    """``14:02`` (UTC) for reasons."""
    text = iso(ts)
    return text[11:16] if text else "?"


def _all(*verdicts: Verdict) -> Verdict:
    """False if any is False, else None if any is None, else True."""
    if any(v is False for v in verdicts):
        return False
    return None if any(v is None for v in verdicts) else True


def _at_least(v: float | None, limit: float) -> Verdict:
    return None if v is None else v >= limit


# -- prefix-cache hits lost -> more prefill tokens -> capacity down --------------------------

#: A replica counts as having lost hits when its ratio is this far below the fleet baseline.
_HIT_LOSS = 0.05


def _replica_hits_lost(cause: Finding, replica: str | None) -> Verdict:
    base = _num(cause, "hit_ratio_baseline")
    if replica is None:
        after = _num(cause, "hit_ratio_after")
        return None if base is None or after is None else after <= base - _HIT_LOSS
    per = cause.evidence.get("per_replica")
    if not isinstance(per, Mapping) or base is None:
        return None
    own = per.get(replica)
    if not isinstance(own, Mapping):
        return False  # it served nothing after the scale-out
    after = own.get("after")
    return isinstance(after, int | float) and after <= base - _HIT_LOSS


def _prefix_capacity(cause: Finding, effect: Finding) -> Verdict:
    extra = _at_least(_num(cause, "extra_prefill_tokens"), 1)
    return _all(extra, _replica_hits_lost(cause, effect.replica))


def _prefix_ttft(cause: Finding, effect: Finding) -> Verdict:
    # The lost hits must show in the effect's prefill work: not cheaper than its baseline.
    prefill = _ratio(effect, "prefill_mean")
    more_prefill = None if prefill is None else prefill >= 0.95
    return _all(_prefix_capacity(cause, effect), more_prefill)


def _prefix_kv(cause: Finding, effect: Finding) -> Verdict:
    # Requests that no longer share prefix blocks each hold their own copy: the pool fills.
    return _replica_hits_lost(cause, effect.replica)


def _prefix_reason(cause: Finding, effect: Finding) -> str:
    base, after = _num(cause, "hit_ratio_baseline"), _num(cause, "hit_ratio_after")
    lost = f" ({_pct(base)} -> {_pct(after)})" if base is not None and after is not None else ""
    grew = cause.evidence.get("scale_out")
    when = (
        f"after the {_hhmm(cause.start_ts)} scale-out" if grew else f"from {_hhmm(cause.start_ts)}"
    )
    extra = _num(cause, "extra_prefill_tokens")
    more = (
        f"~{extra:,.0f} more prompt tokens to prefill" if extra else "more prompt tokens to prefill"
    )
    tail = {
        "kv_pressure": "more KV blocks held per request",
        "prefill_saturation": "slower prefills",
    }.get(effect.rule, "so capacity fell")
    return f"the fleet lost prefix-cache hits{lost} {when}: {more}, {tail}"


# -- KV pool full -> preemptions -> recompute -> TTFT and TPOT up -----------------------------

_MIN_PREEMPTIONS_PER_REQUEST = 0.05
_KV_FULL_MEAN = 0.9


def _kv_recompute(cause: Finding, effect: Finding) -> Verdict:
    per = _at_least(_num(cause, "preemptions_per_request"), _MIN_PREEMPTIONS_PER_REQUEST)
    tpot = _num(effect, "tpot_ratio")
    return _all(per, None if tpot is None else tpot > 1.0)


def _kv_queue(cause: Finding, effect: Finding) -> Verdict:
    per = _at_least(_num(cause, "preemptions_per_request"), _MIN_PREEMPTIONS_PER_REQUEST)
    full = _at_least(_num(cause, "kv_usage_mean"), _KV_FULL_MEAN)
    capped = True if per is True or full is True else (None if None in (per, full) else False)
    waiting, base = _num(effect, "waiting_peak"), _num(effect, "waiting_baseline_peak")
    grew = None if waiting is None else waiting > (base or 0.0)
    return _all(capped, grew)


def _kv_reason(cause: Finding, effect: Finding) -> str:
    peak, pre = _num(cause, "kv_usage_peak"), _num(cause, "preemptions")
    what = f"the KV cache was {_pct(peak)} full" if peak is not None else "the KV cache was full"
    if pre is not None:
        what += f" with {pre:.0f} preemptions"
    where = f" on {cause.replica}" if cause.replica else ""
    if effect.rule == "queue_saturation":
        return f"{what}{where}: it capped the running batch and recomputed preempted requests"
    return f"{what}{where}: preempted requests were recomputed, stretching TPOT"


# -- GPU throttling -> slower steps -> TPOT up -> capacity down -------------------------------

_THROTTLED = 0.9  # clock ratio at or below this is a throttle that slows steps


def _throttle_slower(cause: Finding, effect: Finding) -> Verdict:
    clock = _num(cause, "clock_ratio")
    slowed = None if clock is None else clock <= _THROTTLED
    tpot = _num(cause, "tpot_p50_ratio")
    if tpot is None:
        tpot = _num(effect, "tpot_ratio") or _num(effect, "tpot_p50_ratio")
    prefill = _ratio(effect, "prefill_mean")
    steps = (
        None if tpot is None and prefill is None else (tpot or 0) >= 1.05 or (prefill or 0) >= 1.1
    )
    return _all(slowed, steps)


def _throttle_capacity(cause: Finding, effect: Finding) -> Verdict:
    clock = _num(cause, "clock_ratio")
    return None if clock is None else clock <= _THROTTLED


def _throttle_reason(cause: Finding, effect: Finding) -> str:
    clock = _num(cause, "clock_ratio")
    drop = f" to {_pct(clock)} of its baseline" if clock is not None else ""
    where = f" on {cause.replica}" if cause.replica else ""
    tail = (
        "TPOT rose" if effect.rule == "decode_saturation" else "every step slowed and capacity fell"
    )
    return f"the GPU{where} throttled its SM clock{drop}: {tail}"


# -- error bursts -> client retries -> arrival rate up ----------------------------------------


def _errors_retried(cause: Finding, effect: Finding) -> Verdict:
    first, last = _num(effect, "arrival_rate_first"), _num(effect, "arrival_rate_last")
    errors = _num(cause, "errors")
    if first is None or last is None or errors is None:
        return None
    extra = last - first
    error_rate = errors / max(cause.end_ts - cause.start_ts, DEFAULT_TOLERANCE_S)
    # Retries must account for at least a quarter of the extra arrivals.
    return extra > 0 and error_rate >= 0.25 * extra


def _errors_reason(cause: Finding, effect: Finding) -> str:
    n = _num(cause, "errors")
    what = f"{n:.0f} failed requests" if n is not None else "failed requests"
    return f"{what} came back as client retries, raising the arrival rate past capacity"


# -- GPU XID -> failed requests -----------------------------------------------------------


def _xid_errors(cause: Finding, effect: Finding) -> Verdict:
    own, fleet = _num(cause, "error_ratio"), _num(cause, "fleet_error_ratio")
    if own is None and fleet is None:
        return None
    return (own or 0.0) > 0 or (effect.replica is None and (fleet or 0.0) > 0)


def _xid_reason(cause: Finding, effect: Finding) -> str:
    codes = cause.evidence.get("xids")
    xid = (
        f"XID {', '.join(str(c) for c in codes)}" if isinstance(codes, list) and codes else "an XID"
    )
    return f"the GPU of {cause.replica or 'a replica'} reported {xid}: its requests failed"


# -- speculative decoding acceptance drop -> TPOT up ---------------------------------------


def _spec_slower(cause: Finding, effect: Finding) -> Verdict:
    # Fewer tokens per verification step: acceptance below its baseline, or a step that
    # yields under 1.5 tokens (the rule's uneconomic case, when there is no baseline).
    acc, base = _num(cause, "acceptance_rate"), _num(cause, "acceptance_rate_baseline")
    per_step = _num(cause, "tokens_per_step")
    known = [v for v in (None if acc is None or base is None else acc < base,
                         None if per_step is None else per_step < 1.5) if v is not None]  # fmt: skip
    fewer = any(known) if known else None
    tpot = _num(effect, "tpot_ratio")
    return _all(fewer, None if tpot is None else tpot > 1.0)


def _spec_reason(cause: Finding, effect: Finding) -> str:
    acc = _num(cause, "acceptance_rate")
    what = f" to {_pct(acc)}" if acc is not None else ""
    return f"speculative decoding's draft acceptance fell{what}: fewer tokens per step, TPOT rose"


# -- past the knee -> every replica queues ---------------------------------------------------


def _knee_queue(cause: Finding, effect: Finding) -> Verdict:
    arrivals, capacity = _num(cause, "arrival_rate_last"), _num(cause, "capacity_req_s")
    over = None if arrivals is None or capacity is None else arrivals > capacity
    waiting, base = _num(effect, "waiting_peak"), _num(effect, "waiting_baseline_peak")
    grew = None if waiting is None else waiting > (base or 0.0)
    return _all(over, grew)


def _knee_reason(cause: Finding, effect: Finding) -> str:
    arrivals, capacity = _num(cause, "arrival_rate_last"), _num(cause, "capacity_req_s")
    if arrivals is not None and capacity is not None:
        return (
            f"the fleet was offered {arrivals:.1f} req/s against a capacity of "
            f"{capacity:.1f} req/s: the backlog queued on every replica"
        )
    return "the fleet was offered more load than its capacity: the backlog queued"


# -- a backlog fills the running batch -> bigger steps -> TPOT up ------------------------------


def _backlog_batch(cause: Finding, effect: Finding) -> Verdict:
    # The load filled the batch: arrivals grew at least as much as the batch did (when the
    # batch grew with arrivals flat, slower requests grew it: the reverse chain), requests
    # waited, and the queue episode saw TPOT rise with the batch.
    arrivals, batch = _num(effect, "arrival_ratio"), _num(effect, "batch_ratio")
    load = None if arrivals is None or batch is None else arrivals >= batch > 1.0
    waiting, base = _num(cause, "waiting_peak"), _num(cause, "waiting_baseline_peak")
    backlog = None if waiting is None else waiting > max(1.0, 2 * (base or 0.0))
    tpot = _num(cause, "tpot_p50_ratio")
    return _all(load, backlog, None if tpot is None else tpot > 1.0)


def _backlog_reason(cause: Finding, effect: Finding) -> str:
    waiting, batch = _num(cause, "waiting_peak"), _num(effect, "batch_ratio")
    where = f" on {cause.replica}" if cause.replica else ""
    queued = f" (waiting peaked at {waiting:.0f})" if waiting is not None else ""
    grew = f" {batch:.1f}x" if batch is not None else ""
    return (
        f"the backlog{where}{queued} filled the running batch{grew}: each step carried more "
        "sequences, stretching TPOT"
    )


_PREFIX_STEPS = ("prefill tokens up", "capacity down")
_THROTTLE_STEPS = ("slower steps", "TPOT up", "capacity down")

#: The physical chains of serving (cause rule, effect rule): the rule graph is acyclic.
#: ``telemetry_gap`` explains nothing (a blind spot is no cause) and nothing explains it.
CHAINS: Final[tuple[Chain, ...]] = (
    Chain("prefix_affinity_loss", "beyond_knee", _PREFIX_STEPS, _prefix_capacity, _prefix_reason),
    Chain("prefix_affinity_loss", "queue_saturation", _PREFIX_STEPS, _prefix_ttft, _prefix_reason),
    Chain(
        "prefix_affinity_loss",
        "prefill_saturation",
        ("prefill tokens up",),
        _prefix_ttft,
        _prefix_reason,
    ),
    Chain(
        "prefix_affinity_loss",
        "kv_pressure",
        ("KV blocks per request up",),
        _prefix_kv,
        _prefix_reason,
    ),
    Chain(
        "kv_pressure",
        "decode_saturation",
        ("preemptions", "recompute", "TPOT up"),
        _kv_recompute,
        _kv_reason,
    ),
    Chain(
        "kv_pressure",
        "queue_saturation",
        ("batch capped", "preemptions", "TTFT up"),
        _kv_queue,
        _kv_reason,
    ),
    Chain(
        "gpu_throttle",
        "decode_saturation",
        ("slower steps", "TPOT up"),
        _throttle_slower,
        _throttle_reason,
    ),
    Chain("gpu_throttle", "queue_saturation", _THROTTLE_STEPS, _throttle_slower, _throttle_reason),
    Chain(
        "gpu_throttle",
        "prefill_saturation",
        ("slower prefill steps",),
        _throttle_slower,
        _throttle_reason,
    ),
    Chain(
        "gpu_throttle",
        "beyond_knee",
        _THROTTLE_STEPS,
        _throttle_capacity,
        _throttle_reason,
        to_fleet=True,
    ),
    Chain(
        "error_burst",
        "beyond_knee",
        ("client retries", "arrival rate up"),
        _errors_retried,
        _errors_reason,
        to_fleet=True,
    ),
    Chain("gpu_xid", "error_burst", ("requests fail",), _xid_errors, _xid_reason, to_fleet=True),
    Chain(
        "spec_decode_low_acceptance",
        "decode_saturation",
        ("fewer tokens per step", "TPOT up"),
        _spec_slower,
        _spec_reason,
    ),
    Chain(
        "queue_saturation",
        "decode_saturation",
        ("batch filled", "bigger steps", "TPOT up"),
        _backlog_batch,
        _backlog_reason,
    ),
    Chain(
        "beyond_knee",
        "queue_saturation",
        ("arrivals above capacity", "backlog"),
        _knee_queue,
        _knee_reason,
    ),
)

CHAIN_BY_PAIR: Final[dict[tuple[str, str], Chain]] = {(c.cause, c.effect): c for c in CHAINS}
