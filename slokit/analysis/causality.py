"""Causal links between findings: which finding is a consequence of which, and the root causes.

The rules judge one symptom each; serving has physical chains between them. They are data
here (:data:`CHAINS`): a cause rule, an effect rule, the mechanism's steps, a condition on
the two findings' evidence and a reason template. A link needs evidence, not co-occurrence:

* scope: the same replica, or a fleet-wide cause (it can explain per-replica effects), or,
  where the chain says so, a per-replica cause of a fleet-wide effect (a throttled pod lowers
  the fleet's capacity);
* timing: the cause starts before or with the effect (one bucket of tolerance) and is still
  active when the effect starts;
* the quantity that moves the effect: read from the cause's (and the effect's) evidence.
  A condition answers None when the evidence it needs is absent (stored findings carry no
  evidence): :func:`analyse` with ``strict=False`` accepts those, ``strict=True`` does not;
* the cause is actionable (warning or above): an info finding is context, never a cause.

Root causes are the findings at warning or above that no other finding explains, ranked by
severity, how many findings they explain (transitively), start and confidence; at most two,
the second only at the first's severity. A consequence's severity is capped at its causes'
(never above the most severe cause); the rule's own severity stays in its evidence as
``own_severity``. Pure functions: no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from slokit.records import Finding, Severity
from slokit.timeutil import iso

#: Severities by weight (higher: more severe).
SEVERITY_RANK: Final[dict[str, int]] = {"info": 0, "warning": 1, "critical": 2}
#: At most this many root causes.
MAX_ROOT_CAUSES: Final = 2
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


@dataclass(frozen=True)
class Link:
    cause: str  # finding id
    effect: str  # finding id
    reason: str


@dataclass(frozen=True)
class Causality:
    """The findings with ids, links and capped severities, and the root causes' ids."""

    findings: list[Finding]
    links: list[Link]
    root_causes: list[str]


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

_BY_PAIR: Final[dict[tuple[str, str], Chain]] = {(c.cause, c.effect): c for c in CHAINS}


# -- ids ------------------------------------------------------------------------------------


def finding_ids(findings: Sequence[Finding]) -> list[str]:
    """Each finding's id, in the given order: ``rule`` + ``@replica`` (when per replica) +
    ``#k`` for the k-th finding (k >= 2, by start) of the same rule and replica."""
    order = sorted(range(len(findings)), key=lambda i: (findings[i].start_ts, i))
    seen: dict[tuple[str, str | None], int] = {}
    ids = [""] * len(findings)
    for i in order:
        f = findings[i]
        key = (f.rule, f.replica)
        seen[key] = seen.get(key, 0) + 1
        base = f.rule + (f"@{f.replica}" if f.replica else "")
        ids[i] = base if seen[key] == 1 else f"{base}#{seen[key]}"
    return ids


# -- links ----------------------------------------------------------------------------------


def _in_scope(chain: Chain, cause: Finding, effect: Finding) -> bool:
    if cause.replica is None or cause.replica == effect.replica:
        return True
    return effect.replica is None and chain.to_fleet


def _in_time(cause: Finding, effect: Finding, tolerance_s: float) -> bool:
    """The cause starts before or with the effect and is still active when it starts."""
    return (
        cause.start_ts <= effect.start_ts + tolerance_s
        and cause.end_ts + tolerance_s >= effect.start_ts
    )


def link_reason(cause: Finding, effect: Finding) -> str:
    """The one-sentence reason of the chain from ``cause``'s rule to ``effect``'s."""
    return _BY_PAIR[(cause.rule, effect.rule)].reason(cause, effect)


def find_links(
    findings: Sequence[Finding],
    ids: Sequence[str],
    *,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    strict: bool = True,
) -> list[Link]:
    """Every (cause, effect) pair that a chain of :data:`CHAINS` links with evidence."""
    out = []
    for ci, cause in enumerate(findings):
        if SEVERITY_RANK.get(cause.severity, 0) < SEVERITY_RANK["warning"]:
            continue
        for ei, effect in enumerate(findings):
            chain = _BY_PAIR.get((cause.rule, effect.rule))
            if chain is None or ci == ei:
                continue
            if not (_in_scope(chain, cause, effect) and _in_time(cause, effect, tolerance_s)):
                continue
            verdict = chain.condition(cause, effect)
            if verdict is True or (verdict is None and not strict):
                out.append(Link(ids[ci], ids[ei], chain.reason(cause, effect)))
    return out


def _descendants(node: str, explains: Mapping[str, Sequence[str]]) -> set[str]:
    seen: set[str] = set()
    todo = list(explains.get(node, ()))
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(explains.get(n, ()))
    return seen


def _topological(ids: Sequence[str], links: Sequence[Link]) -> list[str]:
    """Ids with every cause before its effects (the rule graph is acyclic)."""
    causes: dict[str, list[str]] = {i: [] for i in ids}
    for ln in links:
        causes[ln.effect].append(ln.cause)
    done: list[str] = []
    placed: set[str] = set()

    def visit(i: str, path: frozenset[str]) -> None:
        if i in placed or i in path:
            return
        for c in causes[i]:
            visit(c, path | {i})
        placed.add(i)
        done.append(i)

    for i in ids:
        visit(i, frozenset())
    return done


def rank_root_causes(findings: Sequence[Finding]) -> list[str]:
    """The root causes' ids: findings at warning or above that nothing explains, ranked by
    (severity, findings explained, start, confidence); at most two, the second only when it
    is as severe as the first."""
    explains = {f.id or "": f.explains for f in findings}
    candidates = [
        f
        for f in findings
        if not f.caused_by and SEVERITY_RANK.get(f.severity, 0) >= SEVERITY_RANK["warning"]
    ]
    candidates.sort(
        key=lambda f: (
            -SEVERITY_RANK.get(f.severity, 0),
            -len(_descendants(f.id or "", explains)),
            f.start_ts,
            -f.confidence,
        )
    )
    top = candidates[:MAX_ROOT_CAUSES]
    return [f.id or "" for f in top if f.severity == top[0].severity]


def analyse(
    findings: Sequence[Finding],
    *,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    strict: bool = True,
) -> Causality:
    """Ids, links (``caused_by``/``explains``), capped severities and the root causes.
    The findings are copied, in the same order."""
    ids = finding_ids(findings)
    links = find_links(findings, ids, tolerance_s=tolerance_s, strict=strict)
    by_id = {
        i: replace(f, id=i, caused_by=[], explains=[]) for i, f in zip(ids, findings, strict=True)
    }
    for ln in links:
        by_id[ln.cause].explains.append(ln.effect)
        by_id[ln.effect].caused_by.append({"id": ln.cause, "reason": ln.reason})
    for i in _topological(ids, links):
        f = by_id[i]
        if not f.caused_by:
            continue
        cap = max(SEVERITY_RANK.get(by_id[c["id"]].severity, 0) for c in f.caused_by)
        if SEVERITY_RANK.get(f.severity, 0) > cap:
            capped: Severity = _SEVERITY_OF[cap]
            by_id[i] = replace(
                f, severity=capped, evidence={**f.evidence, "own_severity": f.severity}
            )
    out = [by_id[i] for i in ids]
    return Causality(out, links, rank_root_causes(out))


_SEVERITY_OF: Final[dict[int, Severity]] = {0: "info", 1: "warning", 2: "critical"}


def from_stored(row: Mapping[str, Any]) -> Finding:
    """A :class:`Finding` from a stored row (``rule, severity, confidence, replica``, the
    window as ``start_ts``/``end_ts`` or ``start``/``end`` epoch seconds, ``summary``,
    ``runbook``); stored rows carry no evidence."""
    start = row.get("start_ts", row.get("start"))
    end = row.get("end_ts", row.get("end"))
    return Finding(
        rule=str(row["rule"]),
        severity=row["severity"],
        confidence=float(row["confidence"]),
        replica=row.get("replica"),
        start_ts=float(start) if start is not None else 0.0,
        end_ts=float(end) if end is not None else 0.0,
        summary=str(row["summary"]),
        evidence={},
        runbook=str(row["runbook"]),
    )


# -- the causal chain in words ----------------------------------------------------------------


def _paths(
    node: str, explains: Mapping[str, Sequence[str]], path: tuple[str, ...]
) -> list[tuple[str, ...]]:
    children = [c for c in explains.get(node, ()) if c not in path]
    if not children:
        return [(*path, node)]
    return [p for c in children for p in _paths(c, explains, (*path, node))]


def chain_text(
    roots: Iterable[str], explains: Mapping[str, Sequence[str]], rule_of: Mapping[str, str]
) -> str | None:
    """The causal chain from the root causes as one line:
    ``prefix_affinity_loss -> prefill tokens up -> capacity down -> beyond_knee``; effects
    reached through the same steps are joined with ``+``, separate chains with ``; ``.
    None when the root causes explain nothing."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for root in roots:
        for path in _paths(root, explains, ()):
            if len(path) < 2:
                continue
            words = [path[0]]
            for cause, effect in itertools.pairwise(path):
                chain = _BY_PAIR.get((rule_of.get(cause, ""), rule_of.get(effect, "")))
                words += [*(chain.steps if chain else ()), effect]
            groups.setdefault(tuple(words[:-1]), []).append(words[-1])
    if not groups:
        return None
    return "; ".join(
        " -> ".join([*head, " + ".join(dict.fromkeys(tails))]) for head, tails in groups.items()
    )


def label(rule: str, replica: str | None) -> str:
    """``queue_saturation on pod-a`` or ``beyond_knee on fleet``."""
    return f"{rule} on {replica or 'fleet'}"
