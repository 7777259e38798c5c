"""Workload mixes for ``slokit load``: what each request asks for.

A workload is either a YAML file of request *classes* or a JSONL file of prompts.

YAML (``examples/workloads/chat_mix.yaml``)::

    workload: v1                 # optional format marker
    model: tiny                  # optional; --model wins
    classes:
      - name: chat               # required, unique
        weight: 3                # relative share of requests (default 1)
        slo_class: interactive   # label written to every record (default: the name)
        tenant: acme             # optional label
        input: {dist: lognormal, median: 200, sigma: 0.6, min: 16, max: 2000}
        output: {dist: uniform, min: 32, max: 256}
        shared_prefix: {fraction: 0.5, length: 128, count: 4}
        task_size: 3             # optional: 3 consecutive requests of this class share a task_id

Length distributions are in tokens (one synthetic word is about one token) and take one of
these shapes; a bare integer is shorthand for ``{dist: fixed, value: N}``:

- ``{dist: fixed, value: N}``
- ``{dist: uniform, min: A, max: B}`` (integers, both ends included)
- ``{dist: lognormal, median: M, sigma: S, min: A, max: B}`` (``min``/``max`` clamp; optional)

``input`` gives the prompt length; ``output`` sets ``max_tokens`` and the request is sent
with ``ignore_eos: true``, so on vLLM the output length is exact. ``shared_prefix`` makes
``fraction`` of the class's requests start with one of ``count`` distinct prefixes of
``length`` tokens (prefix-cache scenarios); the prefix counts within the sampled input
length, and a prompt always keeps at least one unique word after it.

JSONL: one object per line, ``{"prompt": "...", "max_tokens": 64, "slo_class": "chat"}``,
optionally with ``tenant``, ``task_id`` and ``ignore_eos`` (default false). Prompts are
drawn at random (seeded) when the run needs more requests than lines.

Everything random is drawn from a :class:`random.Random` the caller seeds, so a seed
reproduces the exact sequence of prompts.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from slokit.errors import BadInput, show

# Common short English words: each is one token for typical BPE vocabularies.
_WORD_TEXT = """
the of and to in is it you that he was for on are with as his they be at one have this
from or had by hot word but what some we can out other were all there when up use your
how said an each she which do their time if will way about many then them write would
like so these her long make thing see him two has look more day could go come did number
sound no most people my over know water than call first who may down side been now find
any new work part take get place made live where after back little only round man year
came show every good me give our under name very through just form sentence great think
say help low line differ turn cause much mean before move right boy old too same tell
does set three want air well also play small end put home read hand port large spell add
even land here must big high such follow act why ask men change went light kind off need
house picture try us again animal point mother world near build self earth father head
stand own page should country found answer school grow study still learn plant cover
food sun four between state keep eye never last let thought city tree cross farm hard
start might story saw far sea draw left late run while press close night real life few
north
"""
_WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A distribution of lengths in tokens."""

    dist: str  # "fixed" | "uniform" | "lognormal"
    value: int | None = None
    min: int | None = None
    max: int | None = None
    median: float | None = None
    sigma: float | None = None

    def sample(self, rng: random.Random) -> int:
        if self.dist == "fixed":
            assert self.value is not None
            return self.value
        if self.dist == "uniform":
            assert self.min is not None and self.max is not None
            return rng.randint(self.min, self.max)
        assert self.median is not None and self.sigma is not None
        n = round(rng.lognormvariate(math.log(self.median), self.sigma))
        lo = self.min if self.min is not None else 1
        hi = self.max if self.max is not None else n
        return max(lo, min(hi, n))


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    fraction: float
    length: int
    count: int


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    name: str
    weight: float
    slo_class: str
    input: LengthDist
    output: LengthDist
    tenant: str | None = None
    shared_prefix: SharedPrefix | None = None
    task_size: int = 1


@dataclass(frozen=True, slots=True)
class PromptLine:
    """One line of a JSONL prompt file."""

    prompt: str
    max_tokens: int
    slo_class: str | None = None
    tenant: str | None = None
    task_id: str | None = None
    ignore_eos: bool = False


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What one request asks for; the load runner turns it into an HTTP body."""

    prompt: str
    max_tokens: int
    ignore_eos: bool
    slo_class: str | None
    tenant: str | None
    task_id: str | None
    input_words: int


@dataclass(slots=True)
class Workload:
    """A mix of classes (YAML) or a list of prompts (JSONL); exactly one is non-empty."""

    classes: list[WorkloadClass] = field(default_factory=list)
    prompts: list[PromptLine] = field(default_factory=list)
    model: str | None = None

    def sampler(self, rng: random.Random, run_id: str) -> WorkloadSampler:
        return WorkloadSampler(self, rng, run_id)


DEFAULT_WORKLOAD = Workload(
    classes=[
        WorkloadClass(
            name="default",
            weight=1.0,
            slo_class="default",
            input=LengthDist("fixed", value=128),
            output=LengthDist("fixed", value=64),
        )
    ]
)


class WorkloadSampler:
    """Draws request specs in a reproducible order from one seeded generator."""

    def __init__(self, workload: Workload, rng: random.Random, run_id: str) -> None:
        self._w = workload
        self._rng = rng
        self._run_id = run_id
        self._weights = [c.weight for c in workload.classes]
        # Per class: (task id, requests left in it).
        self._open_task: dict[str, tuple[str, int]] = {}
        self._tasks = 0
        self._prefixes: dict[tuple[str, int], list[str]] = {}

    def next(self) -> RequestSpec:
        if self._w.prompts:
            line = self._w.prompts[self._rng.randrange(len(self._w.prompts))]
            return RequestSpec(
                prompt=line.prompt,
                max_tokens=line.max_tokens,
                ignore_eos=line.ignore_eos,
                slo_class=line.slo_class,
                tenant=line.tenant,
                task_id=line.task_id,
                input_words=len(line.prompt.split()),
            )
        cls = self._rng.choices(self._w.classes, weights=self._weights)[0]
        n_in = max(1, cls.input.sample(self._rng))
        n_out = max(1, cls.output.sample(self._rng))
        words: list[str] = []
        sp = cls.shared_prefix
        if sp is not None and self._rng.random() < sp.fraction:
            words.extend(self._prefix(cls.name, sp, self._rng.randrange(sp.count)))
        n_unique = max(1, n_in - len(words))
        words.extend(self._rng.choice(_WORDS) for _ in range(n_unique))
        return RequestSpec(
            prompt=" ".join(words),
            max_tokens=n_out,
            ignore_eos=True,
            slo_class=cls.slo_class,
            tenant=cls.tenant,
            task_id=self._task_id(cls),
            input_words=len(words),
        )

    def _prefix(self, cls_name: str, sp: SharedPrefix, index: int) -> list[str]:
        key = (cls_name, index)
        if key not in self._prefixes:
            # Independent of the run's generator so that prefixes are the same across runs
            # and seeds (a warm prefix cache stays warm).
            prng = random.Random(f"{cls_name}/{index}")
            self._prefixes[key] = [f"[{cls_name}-{index}]"] + [
                prng.choice(_WORDS) for _ in range(sp.length - 1)
            ]
        return self._prefixes[key]

    def _task_id(self, cls: WorkloadClass) -> str | None:
        if cls.task_size <= 1:
            return None
        tid, left = self._open_task.get(cls.name, ("", 0))
        if left == 0:
            self._tasks += 1
            tid, left = f"{self._run_id}-t{self._tasks}", cls.task_size
        self._open_task[cls.name] = (tid, left - 1)
        return tid


# --- parsing -------------------------------------------------------------------------


def load_workload(path: str | Path) -> Workload:
    """Read a workload YAML (``.yaml``/``.yml``) or a prompt JSONL (``.jsonl``)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot read workload {p}: {exc.strerror or exc}") from exc
    if p.suffix.lower() == ".jsonl":
        return parse_prompts_jsonl(text, source=str(p))
    return parse_workload_yaml(text, source=str(p))


def parse_workload_yaml(text: str, *, source: str = "<workload>") -> Workload:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BadInput(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise BadInput(f"{source}: expected a mapping with 'classes'")
    _no_unknown(doc, {"workload", "model", "classes"}, source)
    if doc.get("workload", "v1") != "v1":
        raise BadInput(f"{source}: unsupported workload version {doc['workload']!r} (want v1)")
    model = doc.get("model")
    if model is not None and not isinstance(model, str):
        raise BadInput(f"{source}: 'model' must be a string")
    raw_classes = doc.get("classes")
    if not isinstance(raw_classes, list) or not raw_classes:
        raise BadInput(f"{source}: 'classes' must be a non-empty list")
    classes = [_parse_class(c, f"{source}: classes[{i}]") for i, c in enumerate(raw_classes)]
    names = [c.name for c in classes]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise BadInput(f"{source}: duplicate class names: {', '.join(dupes)}")
    if sum(c.weight for c in classes) <= 0:
        raise BadInput(f"{source}: class weights must not all be zero")
    return Workload(classes=classes, model=model)


def _parse_class(raw: Any, where: str) -> WorkloadClass:
    if not isinstance(raw, dict):
        raise BadInput(f"{where}: expected a mapping")
    _no_unknown(
        raw,
        {"name", "weight", "slo_class", "tenant", "input", "output", "shared_prefix", "task_size"},
        where,
    )
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise BadInput(f"{where}: 'name' is required (a string)")
    where = f"{where} ({name})"
    weight = _number(raw.get("weight", 1), f"{where}.weight", minimum=0.0)
    for key in ("input", "output"):
        if key not in raw:
            raise BadInput(f"{where}: '{key}' length distribution is required")
    slo_class = raw.get("slo_class", name)
    tenant = raw.get("tenant")
    if not isinstance(slo_class, str) or (tenant is not None and not isinstance(tenant, str)):
        raise BadInput(f"{where}: 'slo_class' and 'tenant' must be strings")
    task_size = raw.get("task_size", 1)
    if not isinstance(task_size, int) or isinstance(task_size, bool) or task_size < 1:
        raise BadInput(f"{where}.task_size: expected an integer >= 1, got {show(task_size)}")
    return WorkloadClass(
        name=name,
        weight=weight,
        slo_class=slo_class,
        tenant=tenant,
        input=parse_length(raw["input"], f"{where}.input"),
        output=parse_length(raw["output"], f"{where}.output"),
        shared_prefix=_parse_prefix(raw.get("shared_prefix"), f"{where}.shared_prefix"),
        task_size=task_size,
    )


def parse_length(raw: Any, where: str) -> LengthDist:
    """Parse one length distribution (see the module docstring)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = {"dist": "fixed", "value": raw}
    if not isinstance(raw, dict):
        raise BadInput(f"{where}: expected an integer or a mapping with 'dist'")
    kind = raw.get("dist")
    if kind == "fixed":
        _no_unknown(raw, {"dist", "value"}, where)
        return LengthDist("fixed", value=_int(raw.get("value"), f"{where}.value"))
    if kind == "uniform":
        _no_unknown(raw, {"dist", "min", "max"}, where)
        lo = _int(raw.get("min"), f"{where}.min")
        hi = _int(raw.get("max"), f"{where}.max")
        if hi < lo:
            raise BadInput(f"{where}: max ({hi}) is below min ({lo})")
        return LengthDist("uniform", min=lo, max=hi)
    if kind == "lognormal":
        _no_unknown(raw, {"dist", "median", "sigma", "min", "max"}, where)
        median = _number(raw.get("median"), f"{where}.median", minimum=1.0)
        sigma = _number(raw.get("sigma"), f"{where}.sigma", minimum=0.0)
        clamp_lo = _int(raw["min"], f"{where}.min") if "min" in raw else None
        clamp_hi = _int(raw["max"], f"{where}.max") if "max" in raw else None
        if clamp_lo is not None and clamp_hi is not None and clamp_hi < clamp_lo:
            raise BadInput(f"{where}: max ({clamp_hi}) is below min ({clamp_lo})")
        return LengthDist("lognormal", median=median, sigma=sigma, min=clamp_lo, max=clamp_hi)
    raise BadInput(f"{where}: 'dist' must be one of fixed, uniform, lognormal (got {show(kind)})")


def _parse_prefix(raw: Any, where: str) -> SharedPrefix | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise BadInput(f"{where}: expected a mapping with fraction, length, count")
    _no_unknown(raw, {"fraction", "length", "count"}, where)
    fraction = _number(raw.get("fraction"), f"{where}.fraction", minimum=0.0)
    if fraction > 1:
        raise BadInput(f"{where}.fraction: must be between 0 and 1, got {fraction}")
    return SharedPrefix(
        fraction=fraction,
        length=_int(raw.get("length"), f"{where}.length"),
        count=_int(raw.get("count", 1), f"{where}.count"),
    )


def parse_prompts_jsonl(text: str, *, source: str = "<prompts>") -> Workload:
    prompts: list[PromptLine] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{where}: not valid JSON: {exc.msg}") from exc
        if not isinstance(obj, dict):
            raise BadInput(f"{where}: expected a JSON object")
        _no_unknown(
            obj, {"prompt", "max_tokens", "slo_class", "tenant", "task_id", "ignore_eos"}, where
        )
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise BadInput(f"{where}: 'prompt' must be a non-empty string")
        for key in ("slo_class", "tenant", "task_id"):
            if obj.get(key) is not None and not isinstance(obj[key], str):
                raise BadInput(f"{where}: '{key}' must be a string")
        ignore_eos = obj.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise BadInput(f"{where}: 'ignore_eos' must be true or false")
        prompts.append(
            PromptLine(
                prompt=prompt,
                max_tokens=_int(obj.get("max_tokens"), f"{where}: max_tokens"),
                slo_class=obj.get("slo_class"),
                tenant=obj.get("tenant"),
                task_id=obj.get("task_id"),
                ignore_eos=ignore_eos,
            )
        )
    if not prompts:
        raise BadInput(f"{source}: no prompts in file")
    return Workload(prompts=prompts)


def _no_unknown(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise BadInput(
            f"{where}: unknown key(s) {', '.join(map(str, unknown))} "
            f"(allowed: {', '.join(sorted(allowed))})"
        )


def _int(raw: Any, where: str) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < 1:
        raise BadInput(f"{where}: expected an integer >= 1, got {show(raw)}")
    return raw


def _number(raw: Any, where: str, *, minimum: float) -> float:
    if not isinstance(raw, int | float) or isinstance(raw, bool) or raw < minimum:
        raise BadInput(f"{where}: expected a number >= {minimum:g}, got {show(raw)}")
    return float(raw)
