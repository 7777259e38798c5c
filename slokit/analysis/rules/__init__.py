"""Diagnostic rules, one module per rule id, registered by id.

A rule is an object with ``id`` (a rule id of :data:`RULE_IDS`), ``needs`` (the sources it reads:
``requests``, ``spans``, ``engine``, ``gpu``; see :mod:`._context`; the optional
``router`` is checked by the rule that reads it) and
``evaluate(ctx) -> list[Finding]``. Modules register their rule with :func:`register`;
:func:`all_rules` imports every module named in :data:`RULE_IDS`, so the set of rules is
explicit and each id has exactly one module (and one ``runbooks/<id>.md``).

A rule that finds its question does not apply to the data (no speculative decoding counters,
a single replica...) raises :class:`NotApplicable`; one that ran but could not judge some
replica says so with ``ctx.note(rule_id, text)``. Both show in the coverage section.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from slokit.analysis.rules._context import DiagnoseContext
    from slokit.records import Finding

#: The stable rule ids (public: docs/schema/diagnose.schema.json, docs/diagnose.md); each is
#: a module of this package.
RULE_IDS: tuple[str, ...] = (
    "queue_saturation",
    "prefill_saturation",
    "decode_saturation",
    "kv_pressure",
    "frontend_bound",
    "prefix_affinity_loss",
    "beyond_knee",
    "gpu_throttle",
    "gpu_xid",
    "error_burst",
    "spec_decode_low_acceptance",
    "gateway_queueing",
    "telemetry_gap",
)


class Rule(Protocol):
    id: str
    needs: tuple[str, ...]

    def evaluate(self, ctx: DiagnoseContext) -> list[Finding]: ...


class NotApplicable(Exception):
    """The rule's question does not apply to this data (the reason is the message)."""


_REGISTRY: dict[str, Rule] = {}

R = TypeVar("R")


def register(cls: type[R]) -> type[R]:
    """Class decorator: instantiate the rule and register it under its id."""
    rule = cls()
    rule_id = rule.id  # type: ignore[attr-defined]
    if rule_id not in RULE_IDS:
        raise ValueError(f"unknown rule id {rule_id!r}; add it to RULE_IDS and the diagnose schema")
    _REGISTRY[rule_id] = rule  # type: ignore[assignment]
    return cls


def all_rules() -> list[Rule]:
    """Every rule, in RULE_IDS order (telemetry_gap last: it reports on the others' inputs)."""
    for rule_id in RULE_IDS:
        importlib.import_module(f"{__name__}.{rule_id}")
    return [_REGISTRY[r] for r in RULE_IDS]


def runbook_path(rule_id: str) -> str:
    return f"runbooks/{rule_id}.md"
