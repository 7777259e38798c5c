"""A fast parser for the Prometheus text format (0.0.4) as vLLM and dcgm-exporter write it.

prometheus_client's parser spends most of a sidecar's CPU on a vLLM scrape: it walks each
label string character by character in Python. This one reads the same text with one
compiled regular expression per line (and a dictionary look-up for a series it has read in
an earlier scrape: a target repeats its series every second), and it is deliberately narrow: it accepts only lines
it understands exactly, and returns None for anything else (a tab or a double space between
fields, an empty or trailing-comma label set, a reserved ``__`` label, an exemplar, a value
spelled in a way it does not know, a duplicate series, a bad ``le``, an unknown type...).
:func:`slokit.sources.exposition.parse_exposition` then parses the *whole* body with
prometheus_client, which decides whether the text is valid and what it means. So the result,
and every error, is the one prometheus_client's path gives; only the time differs.

What it replicates from ``prometheus_client.parser.text_fd_to_metric_families`` (0.26):
family grouping (a ``# HELP`` or ``# TYPE`` line for a new name starts a family; a sample
whose name is not one of the family's starts an untyped family of its own), ``untyped``
read as ``unknown``, counters named without ``_total`` and their samples with it, help-text
escapes (``\\\\``, ``\\n``), label-value escapes (``\\\\``, ``\\"``, ``\\n``; any other
backslash pair kept as written), values read as ``float(int(token))`` when the token is an
integer (so ``-0`` is ``0.0``), and timestamps in milliseconds divided by 1000.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from slokit.sources.exposition import MetricFamily, Sample

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LNAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_LVALUE = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_NUM = (
    r"[-+]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?"
    r"|[Nn][Aa][Nn]|[Ii][Nn][Ff](?:[Ii][Nn][Ii][Tt][Yy])?)"
)
#: ``name{labels} value [timestamp]`` with single spaces, nothing else.
_SAMPLE = re.compile(
    rf"({_NAME})(?:\{{({_LNAME}={_LVALUE}(?:,{_LNAME}={_LVALUE})*)\}})? ({_NUM})(?: ({_NUM}))?"
)
_PAIR = re.compile(rf'({_LNAME})="([^"\\]*(?:\\.[^"\\]*)*)"')
_NUM_RE = re.compile(_NUM)

_Items = tuple[tuple[str, str], ...]
_Key = frozenset[tuple[str, str]]
_SeenKey = tuple[str, _Key, float | None]  # (sample name, label set, timestamp)
_Series = tuple[str, _Items, _SeenKey]
#: What a target repeats every scrape: series text (``name{labels}``, as validated by
#: ``_SAMPLE``) -> (sample name, label items, duplicate-check key). Cleared when full (a target
#: whose series change every scrape); full, it holds about 5 MB (a vLLM scrape: ~450 series).
_SERIES_CACHE: dict[str, _Series] = {}
_CACHE_MAX = 4_096
#: ``# HELP name text`` / ``# TYPE name type``; the text after the name loses its leading
#: ASCII whitespace, as prometheus_client's ``_split_quoted`` does.
_META = re.compile(rf"# (HELP|TYPE) ({_NAME})(?:[ \t\r\x0b\x0c]+(.*))?", re.DOTALL)
_LABEL_ESCAPE = re.compile(r'\\[\\n"]')
_HELP_ESCAPE = re.compile(r"\\[\\n]")
_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
#: prometheus_client's Metric types, plus ``untyped`` (read as ``unknown``).
_TYPES = frozenset(
    ("counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown", "info", "stateset")
)
_ALLOWED_SUFFIXES = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}


def _slot_setter(field: str) -> Callable[[Sample, Any], None]:
    descriptor: Any = Sample.__dict__[field]  # a slot's member descriptor
    setter: Callable[[Sample, Any], None] = descriptor.__set__
    return setter


_new = object.__new__
_set_name = _slot_setter("name")
_set_labels = _slot_setter("labels")
_set_value = _slot_setter("value")
_set_timestamp = _slot_setter("timestamp")


def _sample(name: str, labels: dict[str, str], value: float, ts: float | None) -> Sample:
    """``Sample(name, labels, value, ts)`` at half the cost: a frozen dataclass's ``__init__``
    goes through ``object.__setattr__`` per field; this sets the slots directly."""
    s: Sample = _new(Sample)
    _set_name(s, name)
    _set_labels(s, labels)
    _set_value(s, value)
    _set_timestamp(s, ts)
    return s


class _Unsure(Exception):
    """The text has something this parser does not replicate exactly: let prometheus_client
    parse it."""


def _unescape(m: re.Match[str]) -> str:
    return _ESCAPES[m.group(0)]


def _value(token: str) -> float:
    """The value prometheus_client gives: ``float(int(token))`` for integers, else float."""
    v = float(token)
    if v == 0.0 or v == math.inf or v == -math.inf:
        # -0 as an integer is +0.0; an integer past the double range raises in
        # prometheus_client's path (OverflowError) where float() gives inf.
        try:
            return float(int(token))
        except ValueError:
            return v
        except OverflowError:
            raise _Unsure from None
    return v


def _timestamp(token: str) -> float:
    """Milliseconds -> seconds, computed as prometheus_client does (int / 1000 when integral)."""
    try:
        n: int | float = int(token)
    except ValueError:
        n = float(token)
    try:
        return float(n / 1000)
    except OverflowError:
        raise _Unsure from None


def parse_text(text: str) -> list[MetricFamily] | None:
    """Families of a Prometheus text exposition, or None when prometheus_client must decide.

    ``text`` is decoded, has no NUL and ends with a line feed (``parse_exposition`` checks).
    """
    try:
        families = _parse(text)
    except _Unsure:
        return None
    if not _consistent(families):
        return None
    return families


def _labels(body: str) -> tuple[_Items, _Key]:
    """A label set's items in text order, and as a set (the series' identity)."""
    items: dict[str, str] = {}
    for lname, lvalue in _PAIR.findall(body):
        if lname in items or lname[:2] == "__":
            raise _Unsure  # prometheus_client refuses both
        items[lname] = _LABEL_ESCAPE.sub(_unescape, lvalue) if "\\" in lvalue else lvalue
    return tuple(items.items()), frozenset(items.items())


def _remember(head: str, series: _Series) -> None:
    if len(_SERIES_CACHE) >= _CACHE_MAX:
        _SERIES_CACHE.clear()
    _SERIES_CACHE[head] = series


_NO_LABELS: tuple[_Items, _Key] = ((), frozenset())


def _parse(text: str) -> list[MetricFamily]:
    out: list[MetricFamily] = []
    name = ""
    doc = ""
    typ = "untyped"
    samples: list[Sample] = []
    allowed: frozenset[str] = frozenset()
    seen: set[_SeenKey] = set()
    n_samples = 0
    sample_match = _SAMPLE.fullmatch
    num_match = _NUM_RE.fullmatch
    series_get = _SERIES_CACHE.get
    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            m = _META.fullmatch(line)
            if m is None:
                raise _Unsure
            kind, candidate, rest = m.group(1), m.group(2), m.group(3)
            if kind == "HELP":
                if candidate != name:
                    if name:
                        out.append(_build(name, doc, typ, samples))
                    name, typ, samples = candidate, "untyped", []
                    allowed = frozenset((candidate,))
                if rest is None:
                    doc = ""
                else:
                    doc = _HELP_ESCAPE.sub(_unescape, rest) if "\\" in rest else rest
            else:
                if rest is None or (rest not in _TYPES and rest != "untyped"):
                    raise _Unsure
                if candidate != name:
                    if name:
                        out.append(_build(name, doc, typ, samples))
                    name, doc, samples = candidate, "", []
                typ = rest
                allowed = frozenset(name + s for s in _ALLOWED_SUFFIXES.get(typ, ("",)))
            continue
        # Fast case: the series text (everything before the last space) was read before.
        head, _, tok = line.rpartition(" ")
        hit = series_get(head)
        if hit is not None and num_match(tok) is not None:
            sname, items, seen_key = hit
            ts = None
        else:
            m = sample_match(line)
            if m is None:
                raise _Unsure
            sname, body, tok, ts_tok = m.groups()
            items, key = _NO_LABELS if body is None else _labels(body)
            if ts_tok is None:
                ts = None
                seen_key = (sname, key, None)
                _remember(line[: m.start(3) - 1], (sname, items, seen_key))
            else:
                ts = _timestamp(ts_tok)
                seen_key = (sname, key, ts)
        seen.add(seen_key)
        n_samples += 1
        value = float(tok)
        if not value or value - value != 0.0:  # 0, -0, +-inf, NaN: as prometheus_client reads them
            value = _value(tok)
        sample = _sample(sname, dict(items), value, ts)
        if sname in allowed:
            samples.append(sample)
        else:
            if name:
                out.append(_build(name, doc, typ, samples))
            name, doc, typ, samples, allowed = "", "", "untyped", [], frozenset()
            out.append(_build(sname, "", "untyped", [sample]))
    if name:
        out.append(_build(name, doc, typ, samples))
    if len(seen) != n_samples:
        raise _Unsure  # a duplicate series: parse_exposition names its line
    return out


def _build(name: str, doc: str, typ: str, samples: list[Sample]) -> MetricFamily:
    if typ == "counter":
        if name.endswith("_total"):
            name = name[:-6]
            if not name:  # prometheus_client refuses the empty name
                raise _Unsure
        else:
            samples = [_sample(s.name + "_total", s.labels, s.value, s.timestamp) for s in samples]
    elif typ == "untyped":
        typ = "unknown"
    return MetricFamily(name=name, type=typ, help=doc, samples=samples)


def _consistent(families: list[MetricFamily]) -> bool:
    """Every histogram bucket has a number in ``le``: the check
    :func:`~slokit.sources.exposition.parse_exposition` adds (it names the line)."""
    for fam in families:
        if fam.type != "histogram":
            continue
        bucket = fam.name + "_bucket"
        for s in fam.samples:
            if s.name == bucket:
                le = s.labels.get("le")
                if le is None:
                    return False
                try:
                    if math.isnan(float(le)):
                        return False
                except ValueError:
                    return False
    return True
