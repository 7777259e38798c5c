"""dcgm-exporter exposition -> one :class:`GpuSample` per GPU (or MIG instance).

Names and units follow dcgm-exporter's ``etc/default-counters.csv`` and
``etc/dcp-metrics-included.csv``: utilization in percent (converted to a ratio), PROF_*
activity already a ratio, framebuffer in MiB, power in W, energy in mJ (converted to J),
XID_ERRORS the value of the last XID. DCGM writes "blank" sentinels (values near 2**31,
2**47 or 2**63) for fields it could not read; those become None. A value that is not finite
or is outside its field's range (a negative power, a utilization over 100%, a count past
2**53: :mod:`slokit.sources.validate`) becomes None as well, and is counted by field in the
caller's ``invalid`` counter; the rest of the scrape is kept.

Labels, as dcgm-exporter renders them: ``gpu``, ``UUID`` (or ``uuid``), ``pci_bus_id``,
``device``, ``modelName``, ``Hostname`` (older releases and the GPU template) or
``hostname``, MIG ``GPU_I_PROFILE``/``GPU_I_ID``, and with pod mapping ``pod``,
``namespace``, ``container``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from slokit.records import GpuSample
from slokit.sources.exposition import MetricFamily, parse_exposition
from slokit.sources.validate import GPU_RANGES, Invalid, sample_value

#: DCGM blank sentinels: int32 blanks start at 0x7ffffff0, fp64 at 2**47, int64 at 0x7ff...f0.
_INT32_BLANK = 0x7FFFFFF0
_FP64_BLANK = 140737488355328.0
_INT64_BLANK = 0x7FFFFFFFFFFFFFF0


def _pct_to_ratio(v: float) -> float:
    return v / 100.0


def _mj_to_j(v: float) -> float:
    return v / 1000.0


def _same(v: float) -> float:
    return v


#: metric -> (GpuSample field, conversion to the field's unit, blank threshold).
FIELDS: dict[str, tuple[str, Callable[[float], float], float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("util_ratio", _pct_to_ratio, _INT32_BLANK),
    "DCGM_FI_DEV_FB_USED": ("mem_used_mib", _same, _INT32_BLANK),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", _same, _FP64_BLANK),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", _same, _INT32_BLANK),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", _same, _INT32_BLANK),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active_ratio", _same, _FP64_BLANK),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active_ratio", _same, _FP64_BLANK),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_engine_active_ratio", _same, _FP64_BLANK),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_j", _mj_to_j, _INT64_BLANK),
    "DCGM_FI_DEV_XID_ERRORS": ("xid_last", _same, _INT32_BLANK),
}
#: Framebuffer parts that add up to the total (MiB): total = used + free + reserved.
FB_PARTS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")

_GpuKey = tuple[str, str, str]  # (gpu index, uuid, MIG instance id)


def parse_dcgm_metrics(data: str | bytes, *, ts: float, invalid: Invalid = None) -> list[GpuSample]:
    """Parse one dcgm-exporter scrape. Raises :class:`~slokit.errors.BadInput` if malformed;
    values made missing are counted by field in ``invalid``."""
    return gpu_samples_from_families(parse_exposition(data), ts=ts, invalid=invalid)


def _value(
    v: float,
    blank: float,
    fieldname: str,
    invalid: Invalid,
    convert: Callable[[float], float] | None = None,
) -> float | None:
    """The field's value: None for DCGM's blank sentinels (a handful of values from
    ``blank`` up), and for a value out of range (counted in ``invalid``)."""
    if blank <= v <= blank + 16:
        return None
    if convert is not None:
        v = convert(v)
    return sample_value(v, fieldname, GPU_RANGES, invalid)


def _label(labels: dict[str, str], *names: str) -> str | None:
    for n in names:
        v = labels.get(n)
        if v:
            return v
    return None


def gpu_samples_from_families(
    families: Iterable[MetricFamily], *, ts: float, invalid: Invalid = None
) -> list[GpuSample]:
    """Build GPU samples from already-parsed families; series without a ``gpu`` label are skipped."""
    gpus: dict[_GpuKey, GpuSample] = {}
    fb: dict[_GpuKey, dict[str, float | None]] = {}
    wanted = set(FIELDS) | set(FB_PARTS)
    for fam in families:
        for s in fam.samples:
            # prometheus_client names a counter's sample ``<name>_total`` when the text
            # did not (dcgm-exporter's counters carry no suffix).
            name = s.name[:-6] if s.name.endswith("_total") and s.name[:-6] in wanted else s.name
            if name not in wanted:
                continue
            labels = s.labels
            gpu = labels.get("gpu")
            if gpu is None:
                continue
            uuid = _label(labels, "UUID", "uuid")
            mig = labels.get("GPU_I_ID", "")
            key = (gpu, uuid or "", mig)
            sample = gpus.get(key)
            if sample is None:
                sample = gpus[key] = GpuSample(
                    ts=ts,
                    node=_label(labels, "Hostname", "hostname"),
                    gpu=f"{gpu}/{mig}" if mig else gpu,
                    uuid=uuid,
                    gpu_model=_label(labels, "modelName"),
                    replica=_label(labels, "pod"),
                    namespace=_label(labels, "namespace"),
                    source="dcgm",
                )
            if name in FIELDS:
                fieldname, convert, blank = FIELDS[name]
                v = _value(s.value, blank, fieldname, invalid, convert)
                setattr(sample, fieldname, v)
                if name in FB_PARTS:
                    fb.setdefault(key, {})[name] = v
            elif name in FB_PARTS:
                fb.setdefault(key, {})[name] = _value(
                    s.value, _INT32_BLANK, "mem_total_mib", invalid
                )
    for key, parts in fb.items():
        used, free = parts.get(FB_PARTS[0]), parts.get(FB_PARTS[1])
        if used is not None and free is not None:
            gpus[key].mem_total_mib = used + free + (parts.get(FB_PARTS[2]) or 0.0)
    return list(gpus.values())
