"""The SLO spec (YAML, ``slokit: v1``): load, validate, and classify requests.

Errors name the field and the line, e.g. ``slo.yaml:12: classes[0].objective: must be in (0, 1)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from slokit.errors import BadInput
from slokit.timeutil import parse_duration

#: Request fields a class may match on.
MATCHABLE_FIELDS = ("slo_class", "model", "tenant", "replica")
BOUND_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")


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
    """A YAML loader that remembers the line of every mapping, for error messages."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[str, Any]:
    mapping: dict[str, Any] = {
        str(k): v for k, v in loader.construct_mapping(node, deep=True).items()
    }
    mapping["__line__"] = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


class _Ctx:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, node: Any, path: str, msg: str) -> BadInput:
        line = node.get("__line__") if isinstance(node, dict) else None
        where = f"{self.source}:{line}" if line else self.source
        return BadInput(f"{where}: {path}: {msg}")


def _number(
    ctx: _Ctx, parent: dict[str, Any], key: str, path: str, *, positive: bool = True
) -> float:
    v = parent[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ctx.fail(parent, f"{path}.{key}", f"must be a number, got {v!r}")
    if positive and v <= 0:
        raise ctx.fail(parent, f"{path}.{key}", f"must be > 0, got {v!r}")
    return float(v)


def _parse_class(ctx: _Ctx, raw: Any, i: int) -> SloClass:
    path = f"classes[{i}]"
    if not isinstance(raw, dict):
        raise ctx.fail({}, path, "must be a mapping with name, match, good_when, objective")
    unknown = set(raw) - {"name", "match", "good_when", "objective", "__line__"}
    if unknown:
        raise ctx.fail(raw, path, f"unknown keys {sorted(unknown)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ctx.fail(raw, f"{path}.name", "required, a non-empty string")
    if "objective" not in raw:
        raise ctx.fail(raw, f"{path}.objective", "required, e.g. 0.99")
    objective = _number(ctx, raw, "objective", path)
    if not 0 < objective < 1:
        raise ctx.fail(raw, f"{path}.objective", f"must be in (0, 1), got {objective}")
    match_raw = raw.get("match") or {}
    if not isinstance(match_raw, dict):
        raise ctx.fail(raw, f"{path}.match", "must be a mapping of request field to value(s)")
    match: dict[str, tuple[str, ...]] = {}
    for k, v in match_raw.items():
        if k == "__line__":
            continue
        if k not in MATCHABLE_FIELDS:
            raise ctx.fail(
                match_raw,
                f"{path}.match.{k}",
                f"not a request field; one of {list(MATCHABLE_FIELDS)}",
            )
        vals = v if isinstance(v, list) else [v]
        match[k] = tuple(str(x) for x in vals)
    good = raw.get("good_when") or {}
    if not isinstance(good, dict):
        raise ctx.fail(raw, f"{path}.good_when", "must be a mapping with ttft_ms, tpot_ms, e2e_ms")
    bounds: dict[str, float] = {}
    for k in good:
        if k == "__line__":
            continue
        if k not in BOUND_KEYS:
            raise ctx.fail(
                good, f"{path}.good_when.{k}", f"unknown bound; one of {list(BOUND_KEYS)}"
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
        raise ctx.fail(doc, "slokit", f"must be 'v1', got {version!r}")
    service = doc.get("service")
    if not isinstance(service, str) or not service:
        raise ctx.fail(doc, "service", "required, a non-empty string")
    period = str(doc.get("period", "30d"))
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
    names = [c.name for c in classes]
    if len(set(names)) != len(names):
        raise ctx.fail(doc, "classes", f"class names must be unique, got {names}")
    quality = doc.get("quality") or {}
    cost = doc.get("cost") or {}
    gpu_hour = _number(ctx, cost, "gpu_hour_usd", "cost") if "gpu_hour_usd" in cost else None
    gpus = int(_number(ctx, cost, "gpus_per_replica", "cost")) if "gpus_per_replica" in cost else 1
    gate = {k: v for k, v in (doc.get("gate") or {}).items()}
    spec = SloSpec(
        service=service,
        period=period,
        period_s=period_s,
        classes=classes,
        require_quality_pass=bool(quality.get("require_pass", False)),
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


def load_spec(path: str | Path) -> SloSpec:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot read SLO spec {p}: {exc.strerror}") from None
    try:
        doc = yaml.load(text, Loader=_LineLoader)
    except yaml.YAMLError as exc:
        raise BadInput(f"{p}: not valid YAML: {exc}") from None
    return parse_spec(doc, source=str(p))
