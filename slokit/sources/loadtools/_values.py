"""Typed reads of one load tool's JSON values, each a :class:`~slokit.errors.BadInput` naming
where it went wrong, and the checks every imported request passes (id, plausibility)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from slokit.errors import BadInput
from slokit.ids import InvalidRequestId, checked_request_id
from slokit.records import RequestFragment
from slokit.sources import _json
from slokit.sources.validate import fragment_problem

#: A decoded JSON value (what :func:`json.loads` returns).
Json = None | bool | int | float | str | list["Json"] | dict[str, "Json"]


def loads(text: str, name: str) -> Json:
    """The whole text as one JSON document."""
    try:
        doc: Json = _json.loads(text)
    except _json.NotJson as exc:
        raise BadInput(f"{name}:{exc.lineno}: not JSON: {exc.msg}") from exc
    return doc


def first_line(text: str) -> str:
    """The first non-blank line of ``text`` (``""`` when none)."""
    for _, line in _json.lines(text):
        if line.strip():
            return line
    return ""


def obj(v: Json, key: str, where: str) -> dict[str, Json]:
    """``v`` as a JSON object (``{}`` for null)."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise BadInput(f"{where}: {key} must be an object")
    return v


def items(v: Json, key: str, where: str) -> list[Json]:
    """``v`` as a JSON array (``[]`` for null)."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise BadInput(f"{where}: {key} must be a list")
    return v


def number(rec: Mapping[str, Json], key: str, where: str) -> float | None:
    v = rec.get(key)
    if v is None:
        return None
    f = _json.finite(v)
    if f is None:
        raise BadInput(f"{where}: {key} must be a finite number, got {_json.shown(v)}")
    return f


def integer(rec: Mapping[str, Json], key: str, where: str) -> int | None:
    v = number(rec, key, where)
    if v is None:
        return None
    if not v.is_integer() or v < 0:
        raise BadInput(
            f"{where}: {key} must be a non-negative integer, got {_json.shown(rec[key])}"
        )
    return int(v)


def string(rec: Mapping[str, Json], key: str, where: str) -> str | None:
    v = rec.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise BadInput(f"{where}: {key} must be a string, got {_json.shown(v)}")
    return v


def floats(v: Json, key: str, where: str) -> list[float]:
    """A list of finite numbers (``[]`` for null)."""
    out: list[float] = []
    for x in items(v, key, where):
        f = _json.finite(x)
        if f is None:
            raise BadInput(f"{where}: {key} must be a list of finite numbers")
        out.append(f)
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), or None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def request_id(raw: str, where: str) -> str:
    """The request's key: the id normalized as everywhere in slokit (:mod:`slokit.ids`)."""
    try:
        return checked_request_id(raw)
    except InvalidRequestId as exc:
        raise BadInput(f"{where}: {exc}") from None


def stem(name: str) -> str:
    """The file's name without directory and extension: the prefix of synthesized ids."""
    return Path(name).stem or name


def brief(s: str, limit: int = 120) -> str:
    """The first line of a message, at most ``limit`` characters."""
    return s.strip().split("\n", 1)[0].strip()[:limit]


def checked(frag: RequestFragment, where: str, now: float) -> RequestFragment:
    """``frag``, or :class:`BadInput` at ``where`` when a value of it is implausible."""
    why = fragment_problem(frag, now)
    if why is not None:
        raise BadInput(f"{where}: {why}")
    return frag


def unique(frags: list[RequestFragment], name: str) -> list[RequestFragment]:
    """``frags``, or :class:`BadInput` when two share a request id (they would merge)."""
    seen: set[str] = set()
    for f in frags:
        if f.request_id in seen:
            raise BadInput(f"{name}: request id {f.request_id!r} appears twice")
        seen.add(f.request_id)
    return frags
