"""Explain one request: where its time went, how it compares, and why.

Every second of vLLM's E2E is in a component: queue, prefill and decode (vLLM's own span
timestamps) and ``frontend``, the rest of the E2E (vLLM's API server outside the engine:
HTTP, tokenisation, detokenisation, streaming); what the client waited beyond the server's
E2E is ``client``. Context comes from the replica's engine and GPU samples around the
request's life, read through a :class:`~slokit.store.reader.Reader`. Missing sources are
listed in ``unknown`` instead of being guessed.

- :mod:`._components`: the time decomposition, the timeline and the dominant component;
- :mod:`._context`: peers, replica state at arrival, during-life counters, GPU, findings;
- :mod:`._slo`: the SLO verdict; :mod:`._cause`: the cause sentence and the runbook;
- :mod:`._model` and :mod:`._model_context`: the typed :class:`Explanation` and its JSON form;
- :mod:`._render`: the document as text.
"""

from __future__ import annotations

from slokit.analysis.explain._cause import DOMINANT_RUNBOOK
from slokit.analysis.explain._explain import explain, explain_request
from slokit.analysis.explain._model import (
    COMPONENTS,
    BoundCheck,
    Components,
    Dominant,
    Explanation,
    OverlappingFinding,
    SloJudgement,
    TimelineEvent,
    Tokens,
)
from slokit.analysis.explain._model_context import (
    Context,
    During,
    GpuState,
    PeerRank,
    Peers,
    ReplicaState,
)
from slokit.analysis.explain._options import ExplainOptions
from slokit.analysis.explain._render import render_text

__all__ = [
    "COMPONENTS",
    "DOMINANT_RUNBOOK",
    "BoundCheck",
    "Components",
    "Context",
    "Dominant",
    "During",
    "ExplainOptions",
    "Explanation",
    "GpuState",
    "OverlappingFinding",
    "PeerRank",
    "Peers",
    "ReplicaState",
    "SloJudgement",
    "TimelineEvent",
    "Tokens",
    "explain",
    "explain_request",
    "render_text",
]
