"""Causal links between findings: which finding is a consequence of which, and the root causes.

The rules judge one symptom each; serving has physical chains between them. They are data
(:data:`slokit.analysis.chains.CHAINS`): a cause rule, an effect rule, the mechanism's steps,
a condition on the two findings' evidence and a reason template. A link needs evidence, not
co-occurrence:

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from slokit.analysis.chains import CHAIN_BY_PAIR, DEFAULT_TOLERANCE_S, Chain
from slokit.records import Finding, Severity

#: Severities by weight (higher: more severe).
SEVERITY_RANK: Final[dict[str, int]] = {"info": 0, "warning": 1, "critical": 2}
#: At most this many root causes.
MAX_ROOT_CAUSES: Final = 2


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
    return CHAIN_BY_PAIR[(cause.rule, effect.rule)].reason(cause, effect)


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
            chain = CHAIN_BY_PAIR.get((cause.rule, effect.rule))
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
                chain = CHAIN_BY_PAIR.get((rule_of.get(cause, ""), rule_of.get(effect, "")))
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
