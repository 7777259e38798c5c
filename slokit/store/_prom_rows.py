"""Engine and GPU rows from the series Prometheus answered.

What :func:`slokit.sources.prometheus.samples_from_series` and the scrape normalizers make
of the series :func:`~slokit.store._promql.engine_match` fetches (vLLM gauges and counters,
``request_success_total``, ``cache_config_info``, DCGM fields), built column-wise: one
``engine_samples`` row per (timestamp, replica, model, engine), one ``gpu_samples`` row per
(timestamp, replica, GPU), in the same order with the same values. Point by point in Python
that took ~40 us a point (100 pods x 1 h: ~30 s); here the points are numpy arrays.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from slokit.sources.dcgm import FB_PARTS
from slokit.sources.dcgm import FIELDS as DCGM_FIELDS
from slokit.sources.prometheus import Series, vllm_name
from slokit.sources.validate import ENGINE_RANGES, GPU_RANGES, MAX_COUNT
from slokit.sources.vllm_metrics import (
    CACHE_CONFIG_INFO,
    CACHE_CONFIG_LABELS,
    REQUEST_SUCCESS,
    SCALARS,
)
from slokit.store import _histograms as hist
from slokit.store.append import (
    ENGINE_MAPS,
    ENGINE_SCALARS,
    HISTOGRAM_TYPE,
    ts_array,
)

if TYPE_CHECKING:  # frames are built only when a diagnosis asks
    import pandas as pd

__all__ = ["scrape_tables"]

#: vLLM scalar name -> (its field's index in SCALARS, preference: 0 = the current name).
_SCALAR_NAMES: dict[str, tuple[int, int]] = {
    name: (i, pref) for i, names in enumerate(SCALARS.values()) for pref, name in enumerate(names)
}
_SCALAR_FIELDS = tuple(SCALARS)
#: An engine row is made by its first point in the parser's order: the scalar fields in
#: order, then ``request_success_total``; within one, the series in the answer's order.
_SUCCESS_ORDER = len(SCALARS)
_GPU_WANTED = frozenset(DCGM_FIELDS) | frozenset(FB_PARTS)
#: GPU columns filled from the DCGM fields, then the framebuffer parts summed into the total.
_GPU_FIELDS = tuple(dict.fromkeys(f for f, _, _ in DCGM_FIELDS.values()))
_FB_FREE, _FB_RESERVED = len(_GPU_FIELDS), len(_GPU_FIELDS) + 1
_GPU_STRINGS = ("node", "gpu", "uuid", "gpu_model", "replica", "namespace")


class _Points:
    """The points of one kind of series stacked, with integer facts per series."""

    def __init__(self, *facts: str) -> None:
        self.facts = facts
        self.ts: list[npt.NDArray[np.float64]] = []
        self.values: list[npt.NDArray[np.float64]] = []
        self.meta: list[tuple[int, ...]] = []

    def add(self, ts: npt.NDArray[np.float64], v: npt.NDArray[np.float64], *meta: int) -> None:
        self.ts.append(ts)
        self.values.append(v)
        self.meta.append(meta)

    def frame(self) -> pd.DataFrame:
        """One row per point: ``ts``, ``v`` and the facts of its series."""
        import pandas as pd  # deferred: heavy, and only a diagnosis fetches engine series

        if not self.meta:
            return pd.DataFrame({c: np.empty(0, np.int64) for c in ("ts", "v", *self.facts)})
        idx = np.repeat(np.arange(len(self.meta)), [len(t) for t in self.ts])
        meta = np.array(self.meta, dtype=np.int64)[idx]
        out: dict[str, npt.NDArray[Any]] = {
            "ts": np.concatenate(self.ts),
            "v": np.concatenate(self.values),
        }
        out.update({c: meta[:, i] for i, c in enumerate(self.facts)})
        return pd.DataFrame(out)


class _Codes:
    """Small integers for strings (or tuples), in order of first sight."""

    def __init__(self) -> None:
        self.codes: dict[Any, int] = {}

    def __call__(self, key: Any) -> int:
        return self.codes.setdefault(key, len(self.codes))

    def keys(self) -> list[Any]:
        return list(self.codes)


def scrape_tables(series: list[Series], replica_label: str) -> tuple[pa.Table, pa.Table]:
    """``engine_samples`` and ``gpu_samples`` rows of the series of one range query."""
    scalars = _Points("rep", "eid", "field", "pref", "sid")
    success = _Points("eid", "sid", "reason")
    infos = _Points("rep", "sid", "elabel", "cfg")
    gpus = _Points("rep", "gid", "col", "sid", "name", "ident")
    reps, engines, reasons, elabels, gids, names = (_Codes() for _ in range(6))
    configs: list[tuple[float, float]] = []
    idents: list[tuple[str | None, ...]] = []
    for sid, s in enumerate(series):
        labels = {k: v for k, v in s.labels.items() if k != "__name__"}
        name = vllm_name(s.labels.get("__name__") or "")
        if not name or not s.points:
            continue
        pts = np.asarray(s.points, dtype=np.float64).reshape(-1, 2)
        ts, v = pts[:, 0], pts[:, 1]
        ts, v = ts[~np.isnan(v)], v[~np.isnan(v)]
        rep = reps(labels.get(replica_label) or labels.get("instance") or "unknown")
        model = labels.get("model_name")
        eid = -1 if model is None else engines((rep, model, labels.get("engine")))
        if name in _SCALAR_NAMES:
            f, pref = _SCALAR_NAMES[name]
            scalars.add(ts, _plausible(v, _SCALAR_FIELDS[f], ENGINE_RANGES), rep, eid, f, pref, sid)
        elif name in REQUEST_SUCCESS:
            if eid >= 0:
                reason = reasons(labels.get("finished_reason", "unknown"))
                success.add(ts, _plausible(v, "request_success_total", ENGINE_RANGES), eid, sid,
                            reason)  # fmt: skip
        elif name == CACHE_CONFIG_INFO:
            configs.append(tuple(_config_number(labels.get(CACHE_CONFIG_LABELS[f]), f)
                                 for f in ("block_size", "num_gpu_blocks")))  # type: ignore[arg-type]  # fmt: skip
            infos.add(ts, v, rep, sid, elabels(labels.get("engine")), len(configs) - 1)
        else:
            name = name[:-6] if name.endswith("_total") and name[:-6] in _GPU_WANTED else name
            gpu = labels.get("gpu")
            if name not in _GPU_WANTED or gpu is None:
                continue
            uuid, mig = _first_label(labels, "UUID", "uuid"), labels.get("GPU_I_ID", "")
            idents.append((_first_label(labels, "Hostname", "hostname"),
                           f"{gpu}/{mig}" if mig else gpu, uuid, _first_label(labels, "modelName"),
                           _first_label(labels, "pod"), _first_label(labels, "namespace")))  # fmt: skip
            col, gv = _gpu_values(name, v)
            gid = gids((rep, gpu, uuid or "", mig))
            gpus.add(ts, gv, rep, gid, col, sid, names(name), len(idents) - 1)
    # The parser's order: by timestamp, then replica name, then as each row was made.
    rep_names = reps.keys()
    rep_rank = np.empty(len(rep_names), np.int64)
    rep_rank[sorted(range(len(rep_names)), key=rep_names.__getitem__)] = np.arange(len(rep_names))
    weight = len(series) + 1
    engine = _engine_table(scalars, success, infos, engines.keys(), reasons.keys(),
                           elabels.keys(), configs, rep_names, rep_rank, weight)  # fmt: skip
    gpu = _gpu_table(gpus, idents, rep_rank, weight)
    return engine, gpu


def _first_label(labels: Mapping[str, str], *names: str) -> str | None:
    return next((labels[n] for n in names if labels.get(n)), None)


def _plausible(
    v: npt.NDArray[np.float64], fieldname: str, ranges: Mapping[str, tuple[float, float]]
) -> npt.NDArray[np.float64]:
    """``v`` where inside the field's range, else NaN (a missing fact, as ``sample_value``)."""
    lo, hi = ranges.get(fieldname, (0.0, MAX_COUNT))
    return np.where((v >= lo) & (v <= hi), v, np.nan)


def _config_number(text: str | None, fieldname: str) -> float:
    """A ``cache_config_info`` label as its field's value (NaN: missing or implausible)."""
    try:
        x = float(text) if text is not None else math.nan
    except ValueError:
        return math.nan
    lo, hi = ENGINE_RANGES.get(fieldname, (0.0, MAX_COUNT))
    return x if lo <= x <= hi else math.nan


def _gpu_values(name: str, raw: npt.NDArray[np.float64]) -> tuple[int, npt.NDArray[np.float64]]:
    """The GPU column a DCGM series fills and its values (NaN: DCGM's blank or implausible)."""
    if name in DCGM_FIELDS:
        fieldname, convert, blank = DCGM_FIELDS[name]
        col = _GPU_FIELDS.index(fieldname)
    else:  # a framebuffer part only summed into the total
        fieldname, convert, blank = "mem_total_mib", _same, DCGM_FIELDS[FB_PARTS[0]][2]
        col = _FB_FREE if name == FB_PARTS[1] else _FB_RESERVED
    v: Any = convert(np.where((raw >= blank) & (raw <= blank + 16), np.nan, raw))  # type: ignore[arg-type]
    return col, _plausible(v, fieldname, GPU_RANGES)


def _same(v: Any) -> Any:
    return v


def _masked(values: Any) -> pa.Array:
    values = np.asarray(values, dtype=np.float64)
    return pa.array(values, pa.float64(), mask=np.isnan(values))


def _engine_table(
    scalars: _Points,
    success: _Points,
    infos: _Points,
    engines: list[tuple[int, str, str | None]],
    reasons: list[str],
    elabels: list[str | None],
    configs: list[tuple[float, float]],
    rep_names: list[str],
    rep_rank: npt.NDArray[np.int64],
    weight: int,
) -> pa.Table:
    import pandas as pd  # deferred: heavy, and only a diagnosis fetches engine series

    sc = scalars.frame()
    # A field is read from the first of its names the scrape has (any engine's, as parsed).
    sc = sc[sc["pref"] == sc.groupby(["ts", "rep", "field"])["pref"].transform("min")]
    sc = sc[sc["eid"] >= 0].sort_values("sid", kind="stable")
    ok = success.frame().sort_values(["ts", "eid", "sid"], kind="stable")
    made = pd.concat([
        pd.DataFrame({"ts": sc["ts"], "eid": sc["eid"], "order": sc["field"] * weight + sc["sid"]}),
        pd.DataFrame({"ts": ok["ts"], "eid": ok["eid"], "order": _SUCCESS_ORDER * weight + ok["sid"]}),
    ])  # fmt: skip
    rows = made.groupby(["ts", "eid"], as_index=False)["order"].min()
    eng_rep = np.array([e[0] for e in engines], np.int64)
    rows["rank"] = rep_rank[eng_rep[rows["eid"].to_numpy()]] if len(rows) else 0
    rows = rows.sort_values(["ts", "rank", "order"], ignore_index=True)
    at = pd.MultiIndex.from_arrays([rows["ts"], rows["eid"]])
    n = len(rows)

    cols: dict[str, Any] = {}
    last = sc.drop_duplicates(["ts", "eid", "field"], keep="last")
    for f, fieldname in enumerate(_SCALAR_FIELDS):
        one = last[last["field"] == f]
        idx = pd.MultiIndex.from_arrays([one["ts"], one["eid"]]).get_indexer(at)
        cols[fieldname] = np.where(idx >= 0, one["v"].to_numpy()[idx], np.nan) if len(one) else None

    # request_success_total: the sum over reasons, unknown when one is implausible
    key = ok.groupby(["ts", "eid"], sort=False).ngroup().to_numpy()
    first = np.unique(key, return_index=True)[1]
    v = ok["v"].to_numpy()
    good = ~np.isnan(v)
    total = hist.ordered_sums(key[good], v[good], len(first))
    total[np.unique(key[~good])] = np.nan
    idx = pd.MultiIndex.from_arrays([ok["ts"].to_numpy()[first], ok["eid"].to_numpy()[first]])
    where = idx.get_indexer(at)
    cols["request_success_total"] = np.where(where >= 0, total[where] if len(total) else 0, np.nan)
    # ...and by reason, in the order the reasons came (the series' order)
    g = ok[good]
    rkey = g.groupby(["ts", "eid", "reason"], sort=False).ngroup().to_numpy()
    rfirst = np.unique(rkey, return_index=True)[1]
    rsum = hist.ordered_sums(rkey, g["v"].to_numpy(), len(rfirst))
    row_of = at.get_indexer(pd.MultiIndex.from_arrays([g["ts"].to_numpy()[rfirst],
                                                       g["eid"].to_numpy()[rfirst]]))  # fmt: skip
    by = np.argsort(row_of, kind="stable")
    offsets = np.concatenate([[0], np.cumsum(np.bincount(row_of, minlength=n))]).astype(np.int32)
    names = np.array(reasons, dtype=object)[g["reason"].to_numpy()[rfirst][by]] if reasons else []
    by_reason = pa.MapArray.from_arrays(
        offsets, pa.array(list(names), pa.string()), pa.array(rsum[by], pa.float64())
    )

    # the KV cache geometry: the info of the row's engine, else the scrape's only one
    cfg = infos.frame()
    cfg["n"] = cfg.groupby(["ts", "rep"])["sid"].transform("size")
    cfg = cfg.sort_values("sid", kind="stable")
    cfg_at = np.full(n, -1)
    eng_label = np.array([_label_code(elabels, e[2]) for e in engines] or [0], np.int64)
    row_eid = rows["eid"].to_numpy()
    single = cfg[cfg["n"] == 1]
    idx = pd.MultiIndex.from_arrays([single["ts"], single["rep"]]).get_indexer(
        pd.MultiIndex.from_arrays([rows["ts"], eng_rep[row_eid] if n else row_eid])
    )
    cfg_at = np.where(idx >= 0, single["cfg"].to_numpy()[idx] if len(single) else -1, cfg_at)
    multi = cfg[cfg["n"] > 1].drop_duplicates(["ts", "rep", "elabel"], keep="last")
    idx = pd.MultiIndex.from_arrays([multi["ts"], multi["rep"], multi["elabel"]]).get_indexer(
        pd.MultiIndex.from_arrays(
            [rows["ts"], eng_rep[row_eid] if n else row_eid, eng_label[row_eid] if n else row_eid]
        )
    )
    cfg_at = np.where(idx >= 0, multi["cfg"].to_numpy()[idx] if len(multi) else -1, cfg_at)
    geometry = np.array(configs or [(math.nan, math.nan)], np.float64)
    cols["block_size"] = np.where(cfg_at >= 0, geometry[cfg_at, 0], np.nan)
    cols["num_gpu_blocks"] = np.where(cfg_at >= 0, geometry[cfg_at, 1], np.nan)

    out: dict[str, pa.Array] = {
        "ts": ts_array(rows["ts"].to_numpy()),
        "replica": pa.array([rep_names[engines[e][0]] for e in row_eid], pa.string()),
        "model": pa.array([engines[e][1] for e in row_eid], pa.string()),
        "engine": pa.array([engines[e][2] for e in row_eid], pa.string()),
    }
    for name in ENGINE_SCALARS:
        col = cols.get(name)
        out[name] = _masked(np.full(n, np.nan) if col is None else col)
    empty = pa.MapArray.from_arrays(np.zeros(n + 1, np.int32), pa.array([], pa.string()),
                                    pa.array([], pa.float64()))  # fmt: skip
    for name in ENGINE_MAPS:
        out[name] = by_reason if name == "request_success_by_reason" else empty
    out["histograms"] = pa.array([[]] * n, HISTOGRAM_TYPE)
    return pa.table(out)


def _label_code(elabels: list[str | None], engine: str | None) -> int:
    """The code of an engine label among the infos' (-1: no info carries it)."""
    try:
        return elabels.index(engine)
    except ValueError:
        return -1


def _gpu_table(
    gpus: _Points, idents: list[tuple[str | None, ...]], rep_rank: npt.NDArray[np.int64],
    weight: int,
) -> pa.Table:  # fmt: skip
    import pandas as pd  # deferred: heavy, and only a diagnosis fetches engine series

    g = gpus.frame()
    # A GPU's row is made by the first of its points in the parser's order: the names as
    # they first came in the scrape, then the series' order; its labels are that series'.
    g["order"] = g.groupby(["ts", "rep", "name"])["sid"].transform("min") * weight + g["sid"]
    rows = g.sort_values("order", kind="stable").drop_duplicates(["ts", "gid"], keep="first")
    rows = rows.assign(rank=rep_rank[rows["rep"].to_numpy()] if len(rows) else 0)
    rows = rows.sort_values(["ts", "rank", "order"], ignore_index=True)
    at = pd.MultiIndex.from_arrays([rows["ts"], rows["gid"]])
    n = len(rows)
    last = g.sort_values("sid", kind="stable").drop_duplicates(["ts", "gid", "col"], keep="last")
    values = np.full((_FB_RESERVED + 1, n), np.nan)
    for col in range(_FB_RESERVED + 1):
        one = last[last["col"] == col]
        if len(one):
            idx = pd.MultiIndex.from_arrays([one["ts"], one["gid"]]).get_indexer(at)
            values[col] = np.where(idx >= 0, one["v"].to_numpy()[idx], np.nan)
    used = values[_GPU_FIELDS.index("mem_used_mib")]
    free, reserved = values[_FB_FREE], values[_FB_RESERVED]
    total = np.where(np.isnan(used) | np.isnan(free), np.nan,
                     used + free + np.nan_to_num(reserved, nan=0.0))  # fmt: skip
    who = [idents[i] for i in rows["ident"].to_numpy()]
    out: dict[str, pa.Array] = {"ts": ts_array(rows["ts"].to_numpy())}
    for i, name in enumerate(_GPU_STRINGS):
        out[name] = pa.array([w[i] for w in who], pa.string())
    out["source"] = pa.array(["dcgm"] * n, pa.string())
    for i, name in enumerate(_GPU_FIELDS):
        out[name] = _masked(values[i])
    out["mem_total_mib"] = _masked(total)
    return pa.table(out)
