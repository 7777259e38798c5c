"""Prometheus text exposition (0.0.4) and OpenMetrics text -> metric families.

Two entry points:

- :func:`parse_exposition` reads one scrape (what a ``/metrics`` endpoint answers) with
  prometheus_client's parsers, then applies the checks that parser leaves out (duplicate
  series, unparseable ``le``). Any rejection raises :class:`~slokit.errors.BadInput` naming
  the line; the caller drops the scrape whole. Prometheus text as vLLM and dcgm-exporter
  write it takes :mod:`.fastparse` (same families, several times faster); anything that
  parser does not replicate exactly goes to prometheus_client whole.
- :func:`parse_openmetrics_history` reads recorded history: OpenMetrics with ``# EOF`` whose
  samples carry timestamps in seconds, the format that
  ``promtool tsdb create-blocks-from openmetrics`` reads. prometheus_client 0.26 rejects a
  histogram with more than one timestamped point, so this one is a small line parser of
  its own.

Sample timestamps are always epoch seconds here: the classic text format writes
milliseconds (prometheus_client divides by 1000), OpenMetrics writes seconds.

Sample *values* are not judged here: NaN, +-Inf, 1e308 or a negative counter are valid
exposition (Prometheus stores them). The consumers that map series to fields
(:mod:`.vllm_metrics`, :mod:`.dcgm`) turn a value outside its field's range into a missing
fact and count it (:mod:`.validate`), so one odd series never costs the rest of the scrape.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from slokit.errors import BadInput


@dataclass(slots=True, frozen=True)
class Sample:
    """One sample line: full sample name (``foo_bucket``, ``foo_total``), labels, value."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None  # epoch seconds


@dataclass(slots=True)
class MetricFamily:
    """A ``# TYPE`` family: a counter's name has no ``_total``; its samples keep it."""

    name: str
    type: str
    help: str = ""
    samples: list[Sample] = field(default_factory=list)


def _decode(data: str | bytes) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise BadInput(f"line {line}: invalid UTF-8 in exposition") from exc


def is_openmetrics(text: str) -> bool:
    """True when the text ends with OpenMetrics' ``# EOF`` line."""
    return text.rstrip("\n").rsplit("\n", 1)[-1].strip() == "# EOF"


def _short(s: str, limit: int = 160) -> str:
    return s if len(s) <= limit else s[:limit] + "..."


class _LineCounter:
    """Feeds lines to a parser and remembers which line each sample came from."""

    def __init__(self, text: str) -> None:
        self._lines = text.split("\n")
        if self._lines and self._lines[-1] == "":
            self._lines.pop()
        self.current = 0
        self.sample_lines: list[int] = []

    def __iter__(self) -> Iterator[str]:
        for i, line in enumerate(self._lines, start=1):
            self.current = i
            stripped = line.strip()
            if stripped and not stripped.startswith("#"):
                self.sample_lines.append(i)
            yield line + "\n"

    def text_of(self, lineno: int) -> str:
        return self._lines[lineno - 1]


def parse_exposition(
    data: str | bytes, *, openmetrics: bool | None = None, fast: bool = True
) -> list[MetricFamily]:
    """Parse one scrape into families; raise :class:`BadInput` (with the line) if malformed.

    ``openmetrics=None`` picks the OpenMetrics parser when the text ends with ``# EOF``.
    Prometheus text goes through :mod:`.fastparse` first, which gives prometheus_client's
    result or hands the whole text to prometheus_client (``fast=False``: always).
    """
    text = _decode(data)
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise BadInput(f"line {line}: NUL byte in exposition")
    if text and not text.endswith("\n"):
        # Both formats end every line, the last included, with a line feed: a scrape without
        # it was cut off.
        raise BadInput(f"line {text.count(chr(10)) + 1}: truncated (no line feed at the end)")
    om = is_openmetrics(text) if openmetrics is None else openmetrics
    # deferred: prometheus_client's parsers load only for what the fast parser declines;
    # fastparse imports this module (a cycle at the top)
    if om:
        from prometheus_client.openmetrics.parser import text_fd_to_metric_families

        text = _unescape_sample_names(text)
    else:
        if fast:
            from slokit.sources.fastparse import parse_text

            fast_families = parse_text(text)
            if fast_families is not None:
                return fast_families
        from prometheus_client.parser import text_fd_to_metric_families

    counter = _LineCounter(text)
    families: list[MetricFamily] = []
    try:
        for metric in text_fd_to_metric_families(counter):
            families.append(
                MetricFamily(
                    name=metric.name,
                    type=metric.type,
                    help=metric.documentation,
                    samples=[
                        Sample(
                            s.name,
                            s.labels,
                            float(s.value),
                            None if s.timestamp is None else float(s.timestamp),
                        )
                        for s in metric.samples
                    ],
                )
            )
    # prometheus_client signals bad input mostly with ValueError, but some malformed lines
    # reach IndexError/KeyError/TypeError inside it; all of them mean "this text is bad".
    except (ValueError, IndexError, KeyError, TypeError, AttributeError, OverflowError) as exc:
        detail = _short(str(exc)) or type(exc).__name__
        raise BadInput(f"line {counter.current}: malformed exposition: {detail}") from exc
    _check(families, counter)
    return _without_created(families) if om else families


#: OpenMetrics types whose points carry a ``_created`` sample (the series' start time).
_CREATED_TYPES = frozenset(("counter", "histogram", "summary", "gaugehistogram"))


def _without_created(families: list[MetricFamily]) -> list[MetricFamily]:
    """OpenMetrics' ``_created`` samples dropped: a start time, neither a value nor a counter
    (the text format writes them as ``*_created`` gauge families, which are kept)."""
    for fam in families:
        if fam.type in _CREATED_TYPES:
            created = fam.name + "_created"
            fam.samples = [s for s in fam.samples if s.name != created]
    return families


def _unescape_sample_names(text: str) -> str:
    """Sample names spelled as their family's: asked for OpenMetrics, prometheus_client 0.26
    (what vLLM 0.32 serves /metrics with) writes ``# TYPE vllm:x counter`` but
    ``vllm_x_total ...``, which its own parser splits into one family per line (and then
    refuses as a clash). A sample name that is the family's name with ``:`` escaped to ``_``,
    plus a suffix, is rewritten to the family's spelling; every other line is left as written."""
    if ":" not in text:
        return text
    lines = text.split("\n")
    family = escaped = ""
    for i, line in enumerate(lines):
        if line.startswith("# "):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE", "UNIT"):
                family = parts[2]
                escaped = family.replace(":", "_") if ":" in family else ""
        elif escaped and line.startswith(escaped) and not line.startswith(family):
            lines[i] = family + line[len(escaped) :]
    return "\n".join(lines)


def _check(families: list[MetricFamily], counter: _LineCounter) -> None:
    """The checks prometheus_client's parsers skip: duplicate series and histogram ``le``."""
    lines = counter.sample_lines
    n_samples = sum(len(f.samples) for f in families)
    seen: set[tuple[str, tuple[tuple[str, str], ...], float | None]] = set()
    k = 0
    for fam in families:
        for s in fam.samples:
            lineno = lines[k] if k < len(lines) else counter.current
            if not counter.text_of(lineno).lstrip().startswith(s.name) and n_samples != len(lines):
                # The OpenMetrics parser silently drops a repeated series: the line that
                # does not match the sample we hold is the dropped duplicate.
                raise BadInput(f"line {lineno}: duplicate series")
            k += 1
            key = (s.name, tuple(sorted(s.labels.items())), s.timestamp)
            if key in seen:
                raise BadInput(f"line {lineno}: duplicate series {s.name}{_fmt_labels(s.labels)}")
            seen.add(key)
            if fam.type == "histogram" and s.name == fam.name + "_bucket":
                le = s.labels.get("le")
                try:
                    ok = le is not None and not math.isnan(float(le))
                except ValueError:
                    ok = False
                if not ok:
                    raise BadInput(f"line {lineno}: histogram bucket with invalid le={le!r}")
    if n_samples != len(lines):
        raise BadInput(f"line {lines[-1] if lines else 0}: duplicate series")


def _fmt_labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


# --- OpenMetrics history (many timestamped points per series) --------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE_RE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})?[ ]+(\S+)(?:[ ]+(\S+))?(?:[ ]+#[ ].*)?$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE = re.compile(r"\\[\\\"n]")
_META_RE = re.compile(rf"^# (HELP|TYPE|UNIT) ({_NAME})(?: (.*))?$")
_TYPE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}
_VALID_TYPES = {
    "counter",
    "gauge",
    "histogram",
    "gaugehistogram",
    "summary",
    "info",
    "stateset",
    "unknown",
}


def _parse_labels(body: str, lineno: int) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    body = body.strip()
    while pos < len(body):
        m = _LABEL_RE.match(body, pos)
        if not m:
            raise BadInput(f"line {lineno}: malformed labels: {_short(body)}")
        name, raw = m.group(1), m.group(2)
        if name in labels:
            raise BadInput(f"line {lineno}: duplicate label {name}")
        labels[name] = _ESCAPE_RE.sub(lambda e: _ESCAPES[e.group(0)], raw) if "\\" in raw else raw
        pos = m.end()
    return labels


def _parse_number(token: str, lineno: int, what: str) -> float:
    if "_" in token:
        raise BadInput(f"line {lineno}: invalid {what} {token!r}")
    try:
        return float(token)
    except ValueError:
        raise BadInput(f"line {lineno}: invalid {what} {token!r}") from None


def parse_openmetrics_history(data: str | bytes) -> list[MetricFamily]:
    """Parse OpenMetrics text with timestamped samples (seconds), many points per series.

    Strict on syntax (a bad line raises :class:`BadInput` naming it) and on the ``# EOF``
    terminator; tolerant of sample order, since recorded history is written series by
    series. Histogram consistency is left to the consumer, which groups by timestamp.
    """
    text = _decode(data)
    families: dict[str, MetricFamily] = {}
    sample_family: dict[str, str] = {}  # sample name -> family name, from # TYPE lines
    escaped_sample: dict[str, str] = {}  # ``vllm_x_total`` -> ``vllm:x_total``
    seen: set[tuple[str, tuple[tuple[str, str], ...], float | None]] = set()
    eof = False
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for lineno, line in enumerate(lines, start=1):
        if eof:
            raise BadInput(f"line {lineno}: text after # EOF")
        if line == "# EOF":
            eof = True
            continue
        if not line.strip():
            raise BadInput(f"line {lineno}: blank line (not allowed in OpenMetrics)")
        if line.startswith("#"):
            m = _META_RE.match(line)
            if not m:
                raise BadInput(f"line {lineno}: malformed metadata line: {_short(line)}")
            kind, name, rest = m.group(1), m.group(2), m.group(3) or ""
            fam = families.setdefault(name, MetricFamily(name=name, type="unknown"))
            if kind == "TYPE":
                if rest not in _VALID_TYPES:
                    raise BadInput(f"line {lineno}: unknown metric type {rest!r}")
                fam.type = rest
                for suffix in _TYPE_SUFFIXES.get(rest, ("",)):
                    sample_family[name + suffix] = name
                    if ":" in name:  # prometheus_client's escaped spelling: see above
                        escaped_sample[name.replace(":", "_") + suffix] = name + suffix
            elif kind == "HELP":
                fam.help = rest
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            raise BadInput(f"line {lineno}: malformed sample line: {_short(line)}")
        name, body, value_tok, ts_tok = m.groups()
        name = escaped_sample.get(name, name)
        labels = _parse_labels(body, lineno) if body else {}
        value = _parse_number(value_tok, lineno, "value")
        ts = None
        if ts_tok is not None:
            ts = _parse_number(ts_tok, lineno, "timestamp")
            if not math.isfinite(ts):
                raise BadInput(f"line {lineno}: invalid timestamp {ts_tok!r}")
        fam_name = sample_family.get(name, name)
        if fam_name not in families:
            families[fam_name] = MetricFamily(name=fam_name, type="unknown")
            sample_family[name] = fam_name
        fam = families[fam_name]
        if fam.type in ("histogram", "gaugehistogram") and name == fam_name + "_bucket":
            le = labels.get("le")
            if le is None or math.isnan(_parse_number(le, lineno, "le")):
                raise BadInput(f"line {lineno}: histogram bucket with invalid le={le!r}")
        key = (name, tuple(sorted(labels.items())), ts)
        if key in seen:
            raise BadInput(f"line {lineno}: duplicate sample {name}{_fmt_labels(labels)} at {ts}")
        seen.add(key)
        fam.samples.append(Sample(name, labels, value, ts))
    if not eof:
        raise BadInput(f"line {len(lines)}: missing '# EOF' at the end (not OpenMetrics)")
    return [f for f in _without_created(list(families.values())) if f.samples]
