"""Capacity planning from tokens: KV footprint, resident tokens, replicas for a target mix.

Each number comes with the assumption it rests on (:class:`Figure`), and the CLI prints
them side by side:

* KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element, from
  the model's ``config.json`` (``num_hidden_layers``, ``num_key_value_heads`` (else
  ``num_attention_heads``), ``head_dim`` (else hidden / heads), ``dtype``/``torch_dtype``,
  unless the KV cache dtype is given, e.g. 1 byte for fp8).
* Resident-token capacity per replica = ``num_gpu_blocks x block_size`` from vLLM's
  ``cache_config_info`` (the newest engine sample), else KV memory / KV bytes per token.
* Sustainable work per replica at the SLO: the token throughput (prompt + output tokens/s)
  of the fastest sweep step that still met every objective (DistServe max goodput, see
  :mod:`slokit.analysis.slo`), divided by the replicas that served it; or given.
* Replicas for a target arrival rate: ``ceil(arrival x work per request / (sustainable work x
  rho))``, rho the utilisation headroom (default 0.8), plus one to survive a replica failure
  (N+1).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slokit.analysis.slo import run_of, sweep_points
from slokit.analysis.slo_spec import SloSpec
from slokit.errors import BadInput, show

DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4, "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2,
    "bf16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "int8": 1,
}  # fmt: skip


@dataclass(frozen=True)
class Figure:
    """A number and what it assumes."""

    name: str
    value: float | None
    unit: str
    assumes: str

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "unit": self.unit, "assumes": self.assumes}


@dataclass(frozen=True)
class KvShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    dtype: str

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


def _int(cfg: Mapping[str, Any], key: str, where: str) -> int | None:
    v = cfg.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise BadInput(f"{where}: {key} must be a positive integer, got {show(v)}")
    return v


def kv_shape(
    config: Mapping[str, Any], *, kv_dtype: str | None = None, where: str = "config.json"
) -> KvShape:
    """The KV cache's shape from a Hugging Face model config (``text_config`` if nested)."""
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    assert isinstance(cfg, Mapping)
    layers = _int(cfg, "num_hidden_layers", where)
    heads = _int(cfg, "num_attention_heads", where)
    if layers is None or heads is None:
        raise BadInput(f"{where}: needs num_hidden_layers and num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads", where) or heads
    head_dim = _int(cfg, "head_dim", where)
    if head_dim is None:
        hidden = _int(cfg, "hidden_size", where)
        if hidden is None:
            raise BadInput(f"{where}: needs head_dim or hidden_size")
        head_dim = hidden // heads
    dtype = kv_dtype or str(
        cfg.get("dtype") or cfg.get("torch_dtype") or config.get("torch_dtype") or "bfloat16"
    )
    if dtype not in DTYPE_BYTES:
        raise BadInput(f"{where}: unknown dtype {dtype!r}; one of {sorted(DTYPE_BYTES)}")
    return KvShape(layers, kv_heads, head_dim, DTYPE_BYTES[dtype], dtype)


def load_model_config(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadInput(f"cannot read {p}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise BadInput(f"{p}:{exc.lineno}: not JSON: {exc.msg}") from exc
    if not isinstance(doc, dict):
        raise BadInput(f"{p}: expected a JSON object")
    return doc


@dataclass(frozen=True)
class Sustainable:
    tokens_per_s: float
    step: str
    offered_rps: float
    replicas: int
    lower_bound: bool = False  # every step met the objectives: the knee lies beyond


def sustainable_work(records: Sequence[Mapping[str, Any]], spec: SloSpec) -> Sustainable | None:
    """Prompt + output tokens/s per replica of the fastest sweep step meeting every objective
    (steps are load runs, see :func:`slokit.analysis.slo.sweep_points`)."""
    points = sweep_points(records, spec, by="run")
    best = None
    missed = False
    for p in points:  # ascending offered rate; stop at the first miss (as max goodput does)
        if not p.meets_objectives:
            missed = True
            break
        best = p
    if best is None:
        return None
    rs = [r for r in records if run_of(r.get("request_id")) == best.label]
    arrivals = [float(a) for r in rs if (a := r.get("arrival_ts")) is not None]
    finishes = [float(f) for r in rs if (f := r.get("finish_ts")) is not None]
    if not arrivals or not finishes or max(finishes) <= min(arrivals):
        return None
    ok = [r for r in rs if r.get("status") == "ok"]
    tokens = sum(int(r.get("prompt_tokens") or 0) + int(r.get("output_tokens") or 0) for r in ok)
    replicas = len({r["replica"] for r in rs if r.get("replica") is not None}) or 1
    span = max(finishes) - min(arrivals)
    return Sustainable(
        tokens / span / replicas, best.label, best.offered_rps, replicas, lower_bound=not missed
    )


def mean_mix(records: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    """Mean prompt and output tokens of requests that finished ok."""
    ok = [
        r
        for r in records
        if r.get("status") == "ok"
        and r.get("prompt_tokens") is not None
        and r.get("output_tokens") is not None
    ]
    if not ok:
        return None
    return (
        sum(int(r["prompt_tokens"]) for r in ok) / len(ok),
        sum(int(r["output_tokens"]) for r in ok) / len(ok),
    )


@dataclass
class CapacityPlan:
    figures: list[Figure] = field(default_factory=list)

    def get(self, name: str) -> Figure:
        return next(f for f in self.figures if f.name == name)

    def to_json(self) -> dict[str, Any]:
        return {f.name: f.to_json() for f in self.figures}


def plan(
    *,
    shape: KvShape | None = None,
    cache: Mapping[str, float] | None = None,
    kv_memory_bytes: float | None = None,
    sustainable: Sustainable | None = None,
    sustainable_tokens_per_s: float | None = None,
    mix: tuple[float, float] | None = None,
    mix_source: str = "given",
    arrival_rps: float | None = None,
    rho: float = 0.8,
) -> CapacityPlan:
    """Assemble the figures that the inputs allow (each missing input leaves its figures
    out or None, with the reason in ``assumes``)."""
    if not 0 < rho <= 1:
        raise BadInput(f"rho (utilisation headroom) must be in (0, 1], got {rho}")
    out = CapacityPlan()
    kv_bpt: float | None = None
    if shape is not None:
        kv_bpt = float(shape.bytes_per_token)
        out.figures.append(Figure(
            "kv_bytes_per_token", kv_bpt, "bytes",
            f"2 x {shape.layers} layers x {shape.kv_heads} KV heads x {shape.head_dim} head dim"
            f" x {shape.dtype_bytes} bytes ({shape.dtype})",
        ))  # fmt: skip
    if cache is not None:
        tokens = cache["num_gpu_blocks"] * cache["block_size"]
        out.figures.append(Figure(
            "resident_tokens_per_replica", tokens, "tokens",
            f"{cache['num_gpu_blocks']:.0f} KV blocks x {cache['block_size']:.0f} tokens "
            "(vLLM cache_config_info)",
        ))  # fmt: skip
    elif kv_memory_bytes is not None and kv_bpt:
        out.figures.append(Figure(
            "resident_tokens_per_replica", math.floor(kv_memory_bytes / kv_bpt), "tokens",
            f"{kv_memory_bytes / 2**30:.2f} GiB of KV memory / {kv_bpt:.0f} bytes per token",
        ))  # fmt: skip
    work: float | None = None
    if sustainable_tokens_per_s is not None:
        work = sustainable_tokens_per_s
        out.figures.append(
            Figure("sustainable_tokens_per_s_per_replica", work, "tokens/s", "given")
        )
    elif sustainable is not None:
        work = sustainable.tokens_per_s
        out.figures.append(Figure(
            "sustainable_tokens_per_s_per_replica", work, "tokens/s",
            f"prompt + output tokens/s of sweep step {sustainable.step} "
            f"({sustainable.offered_rps:.2f} req/s, the fastest meeting every objective) / "
            f"{sustainable.replicas} replica(s)"
            + ("; a lower bound: every step met them, the knee lies beyond"
               if sustainable.lower_bound else ""),
        ))  # fmt: skip
    else:
        out.figures.append(
            Figure(
                "sustainable_tokens_per_s_per_replica",
                None,
                "tokens/s",
                "no sweep step met every objective and none was given",
            )
        )
    per_request: float | None = None
    if mix is not None:
        per_request = mix[0] + mix[1]
        out.figures.append(Figure(
            "work_per_request_tokens", per_request, "tokens",
            f"{mix[0]:.1f} prompt + {mix[1]:.1f} output tokens ({mix_source})",
        ))  # fmt: skip
    if arrival_rps is not None:
        if per_request is None or work is None:
            missing = "the request mix" if per_request is None else "the sustainable work"
            out.figures.append(Figure("replicas_needed", None, "replicas", f"needs {missing}"))
            return out
        demand = arrival_rps * per_request
        n = max(1, math.ceil(demand / (work * rho) - 1e-9))
        out.figures.append(Figure(
            "replicas_needed", n, "replicas",
            f"ceil({arrival_rps:g} req/s x {per_request:.1f} tokens / ({work:.1f} tokens/s x "
            f"rho {rho:g})) = ceil({demand / (work * rho):.3f})",
        ))  # fmt: skip
        out.figures.append(
            Figure(
                "replicas_n_plus_1",
                n + 1,
                "replicas",
                "one more, so that losing a replica keeps the SLO",
            )
        )
    return out


def render_text(p: CapacityPlan) -> str:
    lines = []
    for f in p.figures:
        if f.value is None:
            v = "-"
        elif float(f.value).is_integer():
            v = f"{f.value:,.0f}"
        else:
            v = f"{f.value:,.1f}"
        lines.append(f"{f.name:<38} {v:>14} {f.unit:<9} assumes: {f.assumes}")
    return "\n".join(lines)
