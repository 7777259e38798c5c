"""NVML poller (``pynvml`` from nvidia-ml-py) -> :class:`GpuSample` per local GPU.

A missing library, an unloaded driver or a machine without GPUs is a state, not a crash:
the poller reports ``available=False`` with a reason and every :meth:`NvmlPoller.poll`
returns an empty sample list plus one ``up=False`` health record. A device that fails
mid-poll (GPU lost, unknown error) is reported as its own ``up=False`` record; the other
devices are still sampled. A field the device does not support is ``None``.

The ``nvml`` module is injectable so tests drive this code against a fake module that
raises pynvml's real exception classes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from slokit.records import GpuSample, ScrapeResult


@dataclass(slots=True)
class NvmlPoll:
    """What one poll saw: samples of the devices that answered, health of every target."""

    samples: list[GpuSample] = field(default_factory=list)
    health: list[ScrapeResult] = field(default_factory=list)


def _import_pynvml() -> ModuleType:
    import pynvml  # deferred: nvidia-ml-py is the optional `nvml` extra

    return pynvml


class NvmlPoller:
    """Polls every GPU NVML sees. Call :meth:`close` (or use as a context manager) when done."""

    def __init__(
        self,
        *,
        nvml: Any = None,
        node: str | None = None,
        replica: str | None = None,
        importer: Callable[[], Any] = _import_pynvml,
    ) -> None:
        self._nvml = nvml
        self._importer = importer
        self._node = node
        self._replica = replica
        self._initialized = False
        self._tried = False
        self.unavailable_reason: str | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def _init(self) -> None:
        if self._tried:
            return
        self._tried = True
        if self._nvml is None:
            try:
                self._nvml = self._importer()
            except ImportError:
                self.unavailable_reason = (
                    "pynvml is not installed (pip install 'slokit[nvml]' / nvidia-ml-py)"
                )
                return
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            self.unavailable_reason = f"NVML init failed: {_describe(exc)}"
            return
        self._initialized = True
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            self.unavailable_reason = f"NVML device count failed: {_describe(exc)}"
            return
        if count == 0:
            self.unavailable_reason = "NVML sees no GPU"

    @property
    def available(self) -> bool:
        self._init()
        return self.unavailable_reason is None

    def close(self) -> None:
        if self._initialized:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()
            self._initialized = False

    def __enter__(self) -> NvmlPoller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- polling --------------------------------------------------------------------------

    def poll(self, ts: float) -> NvmlPoll:
        """Sample every GPU at ``ts``. Never raises for NVML trouble."""
        if not self.available:
            return NvmlPoll(
                health=[
                    ScrapeResult(
                        ts=ts,
                        target="nvml",
                        kind="nvml",
                        replica=self._replica,
                        up=False,
                        error=self.unavailable_reason,
                    )
                ]
            )
        nvml = self._nvml
        out = NvmlPoll()
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            out.health.append(
                ScrapeResult(
                    ts=ts,
                    target="nvml",
                    kind="nvml",
                    replica=self._replica,
                    up=False,
                    error=f"device count failed: {_describe(exc)}",
                )
            )
            return out
        for index in range(count):
            target = f"nvml:{index}"
            try:
                sample = self._sample(index, ts)
            except nvml.NVMLError as exc:
                out.health.append(
                    ScrapeResult(
                        ts=ts,
                        target=target,
                        kind="nvml",
                        replica=self._replica,
                        up=False,
                        error=_describe(exc),
                    )
                )
                continue
            out.samples.append(sample)
            out.health.append(
                ScrapeResult(
                    ts=ts, target=target, kind="nvml", replica=self._replica, up=True, samples=1
                )
            )
        return out

    def _sample(self, index: int, ts: float) -> GpuSample:
        nvml = self._nvml
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        mem = self._optional(nvml.nvmlDeviceGetMemoryInfo, h)
        util = self._optional(nvml.nvmlDeviceGetUtilizationRates, h)
        power_mw = self._optional(nvml.nvmlDeviceGetPowerUsage, h)
        energy_mj = self._optional(nvml.nvmlDeviceGetTotalEnergyConsumption, h)
        return GpuSample(
            ts=ts,
            node=self._node,
            gpu=str(index),
            uuid=_text(self._optional(nvml.nvmlDeviceGetUUID, h)),
            gpu_model=_text(self._optional(nvml.nvmlDeviceGetName, h)),
            replica=self._replica,
            util_ratio=None if util is None else util.gpu / 100.0,
            mem_used_mib=None if mem is None else mem.used / 2**20,
            mem_total_mib=None if mem is None else mem.total / 2**20,
            power_w=None if power_mw is None else power_mw / 1000.0,
            temperature_c=_num(
                self._optional(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
            ),
            sm_clock_mhz=_num(self._optional(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)),
            energy_j=None if energy_mj is None else energy_mj / 1000.0,
            source="nvml",
        )

    def _optional(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A field this device does not offer (or lets us read) is None, not a device failure."""
        nvml = self._nvml
        try:
            return fn(*args)
        except (
            nvml.NVMLError_NotSupported,
            nvml.NVMLError_NoPermission,
            nvml.NVMLError_FunctionNotFound,
            nvml.NVMLError_NoData,
        ):
            return None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _text(v: Any) -> str | None:
    if v is None:
        return None
    return v.decode() if isinstance(v, bytes) else str(v)


def _num(v: Any) -> float | None:
    return None if v is None else float(v)
