"""The SLO spec (YAML, ``slokit: v1``): load, validate, and classify requests.

Errors name the field and the line, e.g. ``slo.yaml:12: classes[0].objective: must be in (0, 1)``.

A spec is a small hand-written file, and the loader treats it as untrusted input: at most
:data:`MAX_SPEC_BYTES`, :data:`MAX_NODES` YAML nodes (an alias counts as every node it stands
for, so an alias bomb is refused before it is expanded) nested at most :data:`MAX_DEPTH`
deep; every field is checked for its type, numbers must be finite, and the names that end
up in file names, PromQL and reports (``service``, class names) are restricted to a safe
character set (:data:`SERVICE_NAME`, :data:`CLASS_NAME`).
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from slokit.errors import BadInput, show
from slokit.timeutil import parse_duration

#: Request fields a class may match on.
MATCHABLE_FIELDS = ("slo_class", "model", "tenant", "replica")
BOUND_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")
TOP_KEYS = ("slokit", "service", "period", "classes", "quality", "cost", "gate")
QUALITY_KEYS = ("require_pass",)
COST_KEYS = ("gpu_hour_usd", "gpus_per_replica")

#: Bounds on the file itself (see the module docstring).
MAX_SPEC_BYTES = 1 << 20
MAX_NODES = 50_000
MAX_DEPTH = 64
#: ``service`` names the rule file (``<service>-slo.rules.yaml``) and the rule group: ASCII
#: letters, digits, ``_``, ``.``, ``-``, starting with a letter or digit, at most 63 long
#: (a Kubernetes label value's limit), so it cannot leave ``--out`` or break a file name.
SERVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
#: A class name is a label value in PromQL, alert annotations, dashboards and JUnit: word
#: characters (Unicode letters and digits, ``_``), ``.`` and ``-``, at most 63 long; no
#: spaces, quotes, braces, ``$`` or control characters.
CLASS_NAME = re.compile(r"\w[\w.-]{0,62}")
#: The most GPUs one replica may have (a bigger number is a typo, and overflows cost sums).
MAX_GPUS_PER_REPLICA = 100_000
#: The most a GPU-hour may cost (same reason).
MAX_GPU_HOUR_USD = 1e6


@dataclass(frozen=True)
class SloClass:
    name: str
    objective: float
    match: dict[str, tuple[str, ...]] = field(default_factory=dict)
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def bounds_ms(self) -> dict[str, float]:
        return {k: v for k in BOUND_KEYS if (v := getattr(self, k)) is not None}

    def matches(self, request: dict[str, Any]) -> bool:
        return all(str(request.get(k)) in vals for k, vals in self.match.items())


@dataclass(frozen=True)
class SloSpec:
    service: str
    period: str
    period_s: float
    classes: tuple[SloClass, ...]
    require_quality_pass: bool = False
    gpu_hour_usd: float | None = None
    gpus_per_replica: int = 1
    gate: dict[str, Any] = field(default_factory=dict)
    source: str = "<spec>"

    def class_of(self, request: dict[str, Any]) -> SloClass | None:
        """The first class whose ``match`` the request satisfies (an empty match takes all)."""
        for c in self.classes:
            if c.matches(request):
                return c
        return None

    def class_named(self, name: str) -> SloClass:
        for c in self.classes:
            if c.name == name:
                return c
        raise BadInput(f"{self.source}: no SLO class named {name!r}")


class _LineLoader(yaml.SafeLoader):
    """A YAML loader that remembers the line of every mapping, for error messages.

    It counts nodes while composing, an alias as the nodes of what it refers to, and refuses
    a document of more than :data:`MAX_NODES` nodes or nested deeper than :data:`MAX_DEPTH`
    before anything is expanded: a billion-laughs document fails in milliseconds.
    """

    def __init__(self, stream: str, source: str = "<spec>") -> None:
        super().__init__(stream)
        self.source = source
        self._nodes = 0
        self._depth = 0
        self._anchored: dict[str, int] = {}  # anchor -> nodes under it, once composed

    def refuse(self, mark: Any, msg: str) -> BadInput:
        return BadInput(f"{self.source}:{mark.line + 1}: {msg}")

    def _count(self, n: int, mark: Any) -> None:
        self._nodes += n
        if self._nodes > MAX_NODES:
            raise self.refuse(
                mark, f"the spec has more than {MAX_NODES} YAML nodes (aliases expanded)"
            )

    def compose_node(self, parent: Any, index: Any) -> Any:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self.anchors:
                size = self._anchored.get(event.anchor or "")
                if size is None:
                    raise self.refuse(
                        event.start_mark, f"alias *{event.anchor} refers to a node that holds it"
                    )
                self._count(size, event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise self.refuse(event.start_mark, f"nested deeper than {MAX_DEPTH} levels")
        before = self._nodes
        self._count(1, event.start_mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        if event.anchor is not None:
            self._anchored[event.anchor] = self._nodes - before
        return node


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[str, Any]:
    seen: set[str] = set()
    for key_node, _ in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
            if key_node.value in seen:
                raise loader.refuse(key_node.start_mark, f"duplicate key {show(key_node.value)}")
            seen.add(key_node.value)
    mapping: dict[str, Any] = {
        str(k): v for k, v in loader.construct_mapping(node, deep=True).items()
    }
    mapping["__line__"] = node.start_mark.line + 1
    return mapping


def _construct_int(loader: _LineLoader, node: yaml.ScalarNode) -> int:
    try:
        return loader.construct_yaml_int(node)
    except ValueError:  # more digits than Python converts (sys.int_info.str_digits_check_threshold)
        raise loader.refuse(
            node.start_mark, f"number too large ({len(node.value)} digits)"
        ) from None


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


class _Ctx:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, node: Any, path: str, msg: str) -> BadInput:
        line = node.get("__line__") if isinstance(node, dict) else None
        where = f"{self.source}:{line}" if line else self.source
        return BadInput(f"{where}: {path}: {msg}")


def _cut(key: Any) -> str:
    """A mapping key for a field path, cut short."""
    text = str(key)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(
    ctx: _Ctx,
    parent: dict[str, Any],
    key: str,
    path: str,
    *,
    positive: bool = True,
    most: float | None = None,
) -> float:
    v = parent[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ctx.fail(parent, f"{path}.{key}", f"must be a number, got {show(v)}")
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise ctx.fail(parent, f"{path}.{key}", f"must be a finite number, got {show(v)}")
    if positive and f <= 0:
        raise ctx.fail(parent, f"{path}.{key}", f"must be > 0, got {show(v)}")
    if most is not None and f > most:
        raise ctx.fail(parent, f"{path}.{key}", f"must be at most {most:g}, got {show(v)}")
    return f


def _mapping(ctx: _Ctx, parent: dict[str, Any], key: str, path: str, what: str) -> dict[str, Any]:
    """``parent[key]`` as a mapping: absent or null is empty, anything else is an error."""
    v = parent.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ctx.fail(parent, path, f"must be a mapping ({what}), got {show(v)}")
    return v


def _unknown_keys(ctx: _Ctx, node: dict[str, Any], path: str, known: tuple[str, ...]) -> None:
    unknown = set(node) - set(known) - {"__line__"}
    if unknown:
        raise ctx.fail(node, path, f"unknown keys {show(sorted(unknown))}; one of {list(known)}")


def _name(ctx: _Ctx, parent: dict[str, Any], key: str, path: str, pattern: re.Pattern[str]) -> str:
    v = parent.get(key)
    if not isinstance(v, str) or not v:
        raise ctx.fail(parent, path, "required, a non-empty string")
    if not pattern.fullmatch(v):
        allowed = (
            "ASCII letters, digits, '_', '.' or '-', starting with a letter or digit"
            if pattern is SERVICE_NAME
            else "letters, digits, '_', '.' or '-', starting with a letter, digit or '_'"
        )
        raise ctx.fail(parent, path, f"must be 1 to 63 {allowed}; got {show(v)}")
    return v


def _refuse_huge_numbers(ctx: _Ctx, doc: dict[str, Any]) -> None:
    """An integer no float can hold (YAML has no size limit) is refused wherever it is, before
    any field turns it into a float. Iterative: ``parse_spec`` may get any Python object."""
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        node, path = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            if k == "__line__":
                continue
            p = f"{path}.{k}".lstrip(".") if isinstance(node, dict) else f"{path}[{k}]"
            if isinstance(v, dict | list):
                stack.append((v, p))
            elif isinstance(v, int) and not isinstance(v, bool) and abs(v) > sys.float_info.max:
                raise ctx.fail(node, p, f"must be a finite number, got {show(v)}")


def _parse_class(ctx: _Ctx, raw: Any, i: int) -> SloClass:
    path = f"classes[{i}]"
    if not isinstance(raw, dict):
        raise ctx.fail({}, path, "must be a mapping with name, match, good_when, objective")
    unknown = set(raw) - {"name", "match", "good_when", "objective", "__line__"}
    if unknown:
        raise ctx.fail(raw, path, f"unknown keys {show(sorted(unknown))}")
    name = _name(ctx, raw, "name", f"{path}.name", CLASS_NAME)
    if "objective" not in raw:
        raise ctx.fail(raw, f"{path}.objective", "required, e.g. 0.99")
    objective = _number(ctx, raw, "objective", path)
    if not 0 < objective < 1:
        raise ctx.fail(raw, f"{path}.objective", f"must be in (0, 1), got {objective}")
    match_raw = _mapping(ctx, raw, "match", f"{path}.match", "request field to value(s)")
    match: dict[str, tuple[str, ...]] = {}
    for k, v in match_raw.items():
        if k == "__line__":
            continue
        if k not in MATCHABLE_FIELDS:
            raise ctx.fail(
                match_raw,
                f"{path}.match.{_cut(k)}",
                f"not a request field; one of {list(MATCHABLE_FIELDS)}",
            )
        vals = v if isinstance(v, list) else [v]
        if not vals or not all(isinstance(x, str | int | float) for x in vals):
            raise ctx.fail(
                match_raw,
                f"{path}.match.{k}",
                f"must be a string, number or boolean, or a non-empty list of them, got {show(v)}",
            )
        match[k] = tuple(str(x) for x in vals)
    good = _mapping(ctx, raw, "good_when", f"{path}.good_when", "ttft_ms, tpot_ms, e2e_ms")
    bounds: dict[str, float] = {}
    for k in good:
        if k == "__line__":
            continue
        if k not in BOUND_KEYS:
            raise ctx.fail(
                good,
                f"{path}.good_when.{_cut(k)}",
                f"unknown bound; one of {list(BOUND_KEYS)}",
            )
        bounds[k] = _number(ctx, good, k, f"{path}.good_when")
    return SloClass(name=name, objective=objective, match=match, **bounds)


#: The rolling window an SLO is judged over (``period``): at least a minute, at most a year.
#: A zero period would make every burn rate infinite; a longer one is a typo.
MIN_PERIOD_S = 60.0
MAX_PERIOD_S = 366 * 86400.0


def parse_spec(doc: Any, source: str = "<spec>") -> SloSpec:
    ctx = _Ctx(source)
    if not isinstance(doc, dict):
        raise BadInput(f"{source}: the spec must be a YAML mapping")
    version = doc.get("slokit")
    if version != "v1":
        raise ctx.fail(doc, "slokit", f"must be 'v1', got {show(version)}")
    _unknown_keys(ctx, doc, "the spec", TOP_KEYS)
    _refuse_huge_numbers(ctx, doc)
    service = _name(ctx, doc, "service", "service", SERVICE_NAME)
    period = doc.get("period", "30d")
    if not isinstance(period, str) or len(period) > 32:
        raise ctx.fail(doc, "period", f"not a duration: {show(period)} (expected e.g. 30d or 7d)")
    try:
        period_s = parse_duration(period)
    except BadInput as exc:
        raise ctx.fail(doc, "period", str(exc)) from None
    if not MIN_PERIOD_S <= period_s <= MAX_PERIOD_S:
        raise ctx.fail(
            doc, "period", f"must be between 1m and 366d (the SLO's rolling window), got {period!r}"
        )
    classes_raw = doc.get("classes")
    if not isinstance(classes_raw, list) or not classes_raw:
        raise ctx.fail(doc, "classes", "required, a non-empty list")
    classes = tuple(_parse_class(ctx, c, i) for i, c in enumerate(classes_raw))
    seen: set[str] = set()
    for c in classes:
        if c.name in seen:
            raise ctx.fail(doc, "classes", f"class names must be unique, {c.name!r} is repeated")
        seen.add(c.name)
    quality = _mapping(ctx, doc, "quality", "quality", "require_pass")
    _unknown_keys(ctx, quality, "quality", QUALITY_KEYS)
    require_pass = quality.get("require_pass", False)
    if not isinstance(require_pass, bool):
        raise ctx.fail(
            quality, "quality.require_pass", f"must be true or false, got {show(require_pass)}"
        )
    cost = _mapping(ctx, doc, "cost", "cost", "gpu_hour_usd, gpus_per_replica")
    _unknown_keys(ctx, cost, "cost", COST_KEYS)
    gpu_hour = (
        _number(ctx, cost, "gpu_hour_usd", "cost", most=MAX_GPU_HOUR_USD)
        if "gpu_hour_usd" in cost
        else None
    )
    gpus = 1
    if "gpus_per_replica" in cost:
        n = _number(ctx, cost, "gpus_per_replica", "cost", most=MAX_GPUS_PER_REPLICA)
        if not n.is_integer():
            raise ctx.fail(
                cost, "cost.gpus_per_replica", f"must be a whole number of GPUs, got {show(n)}"
            )
        gpus = int(n)
    gate = dict(_mapping(ctx, doc, "gate", "gate", "the gate's thresholds"))
    spec = SloSpec(
        service=service,
        period=period,
        period_s=period_s,
        classes=classes,
        require_quality_pass=require_pass,
        gpu_hour_usd=gpu_hour,
        gpus_per_replica=gpus,
        gate=gate,
        source=source,
    )
    # Deferred: the gate package imports SloSpec from this module. Validating here makes a
    # typo under ``gate:`` fail every command that loads the spec, not only ``slokit gate``.
    from slokit.analysis.gate import gate_config

    gate_config(spec)
    return spec


def _decode(p: Path, data: bytes) -> str:
    """UTF-8, or UTF-16 with a byte order mark (the encodings YAML allows)."""
    utf16 = data[:2] in (b"\xff\xfe", b"\xfe\xff")
    try:
        return data.decode("utf-16" if utf16 else "utf-8-sig")
    except UnicodeDecodeError as exc:
        enc = "UTF-16" if utf16 else "UTF-8"
        raise BadInput(
            f"{p}: not {enc} text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def _yaml_error(p: Path, exc: yaml.YAMLError) -> BadInput:
    """One line: ``slo.yaml:3: not valid YAML: <problem> (<context>)``."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark or exc.context_mark
        where = f"{p}:{mark.line + 1}" if mark else str(p)
        detail = exc.problem + (f" ({exc.context})" if exc.context else "")
    else:
        where, detail = str(p), " ".join(str(exc).split())
    return BadInput(f"{where}: not valid YAML: {detail}")


def load_spec(path: str | Path) -> SloSpec:
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise BadInput(f"cannot read SLO spec {p}: {exc.strerror}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise BadInput(f"{p}: larger than {MAX_SPEC_BYTES >> 20} MiB; not an SLO spec")
    loader = _LineLoader(_decode(p, data), source=str(p))
    try:
        doc = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise _yaml_error(p, exc) from None
    finally:
        loader.dispose()
    return parse_spec(doc, source=str(p))
