"""Request-id normalization: the id the client sent (``X-Request-Id``) is the key.

vLLM 0.32 answers ``X-Request-Id: fx-1`` with response id ``cmpl-fx-1`` (completions) or
``chatcmpl-fx-1`` (chat), and its ``llm_request`` span carries ``gen_ai.request.id`` =
``cmpl-fx-1-0`` for completions: a per-prompt sub-index is appended. All of them normalize to
``fx-1``.
"""

from __future__ import annotations

import re

_PREFIX = re.compile(r"^(?:chatcmpl|cmpl)-")
_SUBINDEX = re.compile(r"-\d+$")


def normalize_request_id(raw: str, *, from_span: bool = False) -> str:
    """Strip vLLM's ``cmpl-``/``chatcmpl-`` prefix.

    With ``from_span=True`` (the id came from vLLM's ``gen_ai.request.id``), a ``cmpl-`` id
    also loses the ``-N`` sub-index that vLLM appends for completions. Response ids and the
    ids clients send carry no sub-index, so a client id ending in ``-3`` survives.
    """
    rid = raw.strip()
    if from_span and rid.startswith("cmpl-"):
        rid = _SUBINDEX.sub("", rid, count=1)
    return _PREFIX.sub("", rid, count=1)


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
