"""NvmlPoller: real code against a fake NVML module that raises pynvml's real exceptions."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from slokit.sources.nvml import NvmlPoller


class FakeNvml:
    """Just enough of pynvml: devices are dicts of readings; a reading may be an exception."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_NoPermission = pynvml.NVMLError_NoPermission
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVMLError_NoData = pynvml.NVMLError_NoData
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM

    def __init__(self, devices, *, init_error=None):
        self.devices = devices
        self.init_error = init_error
        self.shutdowns = 0

    def _get(self, h, key):
        v = self.devices[h][key]
        if isinstance(v, BaseException):
            raise v
        return v

    def nvmlInit(self):
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return self._get(h, "uuid")

    def nvmlDeviceGetName(self, h):
        return self._get(h, "name")

    def nvmlDeviceGetMemoryInfo(self, h):
        return self._get(h, "mem")

    def nvmlDeviceGetUtilizationRates(self, h):
        return self._get(h, "util")

    def nvmlDeviceGetPowerUsage(self, h):
        return self._get(h, "power_mw")

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self._get(h, "energy_mj")

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._get(h, "temp")

    def nvmlDeviceGetClockInfo(self, h, clock):
        assert clock == pynvml.NVML_CLOCK_SM
        return self._get(h, "sm_clock")


def device(**over):
    d = {
        "uuid": "GPU-aaa",
        "name": "NVIDIA H100 80GB HBM3",
        "mem": SimpleNamespace(used=40 * 2**30, total=80 * 2**30, free=40 * 2**30),
        "util": SimpleNamespace(gpu=75, memory=30),
        "power_mw": 350_500,
        "energy_mj": 12_345_678,
        "temp": 66,
        "sm_clock": 1980,
    }
    d.update(over)
    return d


def test_real_pynvml_on_a_machine_without_gpu_reports_unavailable():
    poller = NvmlPoller(node="n")
    if poller.available:  # pragma: no cover - only on a GPU machine
        pytest.skip("this machine has a GPU")
    assert poller.unavailable_reason
    result = poller.poll(10.0)
    assert result.samples == []
    (h,) = result.health
    assert (h.target, h.kind, h.up, h.ts) == ("nvml", "nvml", False, 10.0)
    assert h.error == poller.unavailable_reason


def test_library_not_found_is_unavailable_with_reason():
    fake = FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound())
    poller = NvmlPoller(nvml=fake)
    assert not poller.available
    assert "LibraryNotFound" in str(poller.unavailable_reason)


def test_driver_not_loaded_is_unavailable_and_poll_does_not_raise():
    poller = NvmlPoller(nvml=FakeNvml([], init_error=pynvml.NVMLError_DriverNotLoaded()))
    result = poller.poll(1.0)
    assert result.samples == [] and result.health[0].up is False
    assert "DriverNotLoaded" in str(result.health[0].error)


def test_no_devices_is_unavailable():
    poller = NvmlPoller(nvml=FakeNvml([]))
    assert not poller.available
    assert poller.unavailable_reason == "NVML sees no GPU"


def test_missing_pynvml_package_is_unavailable():
    def importer():
        raise ImportError("No module named 'pynvml'")

    poller = NvmlPoller(importer=importer)
    assert not poller.available
    assert "nvidia-ml-py" in str(poller.unavailable_reason)


def test_poll_converts_units_to_the_record():
    poller = NvmlPoller(nvml=FakeNvml([device()]), node="node-1", replica="vllm-0")
    result = poller.poll(100.0)
    (s,) = result.samples
    assert (s.ts, s.node, s.gpu, s.uuid, s.replica, s.source) == (
        100.0,
        "node-1",
        "0",
        "GPU-aaa",
        "vllm-0",
        "nvml",
    )
    assert s.gpu_model == "NVIDIA H100 80GB HBM3"
    assert s.util_ratio == 0.75
    assert (s.mem_used_mib, s.mem_total_mib) == (40 * 1024.0, 80 * 1024.0)
    assert s.power_w == 350.5
    assert s.energy_j == pytest.approx(12_345.678)
    assert (s.temperature_c, s.sm_clock_mhz) == (66.0, 1980.0)
    assert [(h.target, h.up, h.samples) for h in result.health] == [("nvml:0", True, 1)]


def test_bytes_names_from_old_pynvml_are_decoded():
    poller = NvmlPoller(nvml=FakeNvml([device(uuid=b"GPU-b", name=b"Tesla T4")]))
    (s,) = poller.poll(0.0).samples
    assert (s.uuid, s.gpu_model) == ("GPU-b", "Tesla T4")


def test_unsupported_field_is_none_not_a_device_failure():
    poller = NvmlPoller(nvml=FakeNvml([device(energy_mj=pynvml.NVMLError_NotSupported())]))
    result = poller.poll(0.0)
    (s,) = result.samples
    assert s.energy_j is None and s.power_w == 350.5
    assert result.health[0].up is True


def test_device_lost_mid_poll_is_reported_and_other_devices_still_sampled():
    fake = FakeNvml([device(util=pynvml.NVMLError_GpuIsLost()), device(uuid="GPU-bbb")])
    result = NvmlPoller(nvml=fake).poll(5.0)
    assert [s.uuid for s in result.samples] == ["GPU-bbb"]
    lost, ok = result.health
    assert (lost.target, lost.up) == ("nvml:0", False)
    assert "GpuIsLost" in str(lost.error)
    assert (ok.target, ok.up) == ("nvml:1", True)


def test_close_shuts_nvml_down_once():
    fake = FakeNvml([device()])
    with NvmlPoller(nvml=fake) as poller:
        poller.poll(0.0)
    poller.close()
    assert fake.shutdowns == 1
