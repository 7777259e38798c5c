"""Request-id normalization: the id the client sent (``X-Request-Id``) is the key.

vLLM 0.32 answers ``X-Request-Id: fx-1`` with response id ``cmpl-fx-1`` (completions) or
``chatcmpl-fx-1`` (chat), and its ``llm_request`` span carries ``gen_ai.request.id`` =
``cmpl-fx-1-0`` for completions: a per-prompt sub-index is appended. All of them normalize to
``fx-1``.

An id that normalizes to nothing (``" "``, ``"chatcmpl-"``, ``"cmpl--0"``) would merge
unrelated requests into one record ``''``: :func:`checked_request_id` refuses it, and ids
longer than :data:`MAX_REQUEST_ID_CHARS` or carrying control characters (no HTTP header can).
"""

from __future__ import annotations

import re

from slokit.errors import BadInput

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

#: Longest request id kept (a UUID is 36; W3C trace ids 32).
MAX_REQUEST_ID_CHARS = 512


class InvalidRequestId(BadInput):
    """An id that cannot be a request's key; ``reason`` is short and fixed (a metric label)."""

    def __init__(self, reason: str, raw: str) -> None:
        shown = raw if len(raw) <= 60 else raw[:60] + "..."
        super().__init__(f"{reason}: {shown!r}")
        self.reason = reason


def normalize_request_id(raw: str, *, from_span: bool = False) -> str:
    """Strip vLLM's ``cmpl-``/``chatcmpl-`` prefix (and surrounding blanks).

    With ``from_span=True`` (the id came from vLLM's ``gen_ai.request.id``), a ``cmpl-`` id
    also loses the ``-N`` sub-index that vLLM appends for completions. Response ids and the
    ids clients send carry no sub-index, so a client id ending in ``-3`` survives. The result
    may be empty; :func:`checked_request_id` refuses that.
    """
    # string operations, not regular expressions: this runs once per span on the ingest path
    rid = raw.strip()
    if from_span and rid.startswith("cmpl-"):
        head, dash, index = rid.rpartition("-")
        if dash and index.isdecimal():  # isdecimal: what \d matches
            rid = head
    if rid.startswith("chatcmpl-"):
        rid = rid[9:]
    elif rid.startswith("cmpl-"):
        rid = rid[5:]
    return rid.strip()


def checked_request_id(raw: str, *, from_span: bool = False) -> str:
    """:func:`normalize_request_id`, refusing what cannot be a key.

    Raises :class:`InvalidRequestId` (a :class:`BadInput`) when the id is empty once
    normalized, longer than :data:`MAX_REQUEST_ID_CHARS`, or has control characters.
    """
    rid = normalize_request_id(raw, from_span=from_span)
    if not rid:
        raise InvalidRequestId("request id empty once normalized", raw)
    if len(rid) > MAX_REQUEST_ID_CHARS:
        raise InvalidRequestId(f"request id longer than {MAX_REQUEST_ID_CHARS} characters", raw)
    if not rid.isprintable() and _CONTROL.search(rid):
        raise InvalidRequestId("request id has control characters", raw)
    return rid


def candidate_ids(raw: str) -> list[str]:
    """Ids to try, in order, when a user looks a request up by any form of its id."""
    raw = raw.strip()
    out: list[str] = []
    for c in (
        normalize_request_id(raw),
        normalize_request_id(raw, from_span=True),
        raw,
    ):
        if c and c not in out:
            out.append(c)
    return out
