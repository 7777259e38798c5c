"""dcgm-exporter exposition -> GpuSample, on an exposition shaped like dcgm-exporter's output."""

from __future__ import annotations

import pytest

from slokit.errors import BadInput
from slokit.sources.dcgm import parse_dcgm_metrics


def by_gpu(samples):
    return {s.gpu: s for s in samples}


def test_two_gpus_give_two_samples_with_identity_labels(dcgm_two_gpus):
    gpus = by_gpu(parse_dcgm_metrics(dcgm_two_gpus, ts=42.0))
    assert set(gpus) == {"0", "1"}
    g0 = gpus["0"]
    assert (g0.ts, g0.source, g0.node) == (42.0, "dcgm", "gpu-node-7")
    assert g0.uuid == "GPU-3f9d2a71-8c1e-4b6a-9e0d-52f1c7a8b934"
    assert g0.gpu_model == "NVIDIA H100 80GB HBM3"


def test_pod_labels_name_replica_and_namespace_and_empty_ones_are_none(dcgm_two_gpus):
    gpus = by_gpu(parse_dcgm_metrics(dcgm_two_gpus, ts=0.0))
    assert (gpus["0"].replica, gpus["0"].namespace) == ("vllm-llama-0", "inference")
    assert (gpus["1"].replica, gpus["1"].namespace) == (None, None)


def test_units_are_converted_to_the_record_units(dcgm_two_gpus):
    g0 = by_gpu(parse_dcgm_metrics(dcgm_two_gpus, ts=0.0))["0"]
    assert g0.util_ratio == pytest.approx(0.97)  # GPU_UTIL is percent
    assert g0.gr_engine_active_ratio == pytest.approx(0.912345)  # PROF_* already ratios
    assert g0.tensor_active_ratio == pytest.approx(0.384211)
    assert g0.dram_active_ratio == pytest.approx(0.702918)
    assert g0.mem_used_mib == 74883.0
    assert g0.mem_total_mib == 74883.0 + 6112.0 + 564.0  # used + free + reserved
    assert g0.power_w == pytest.approx(512.347)
    assert g0.energy_j == pytest.approx(48213377.412)  # mJ -> J
    assert (g0.temperature_c, g0.sm_clock_mhz) == (61.0, 1980.0)


def test_last_xid_is_reported(dcgm_two_gpus):
    gpus = by_gpu(parse_dcgm_metrics(dcgm_two_gpus, ts=0.0))
    assert (gpus["0"].xid_last, gpus["1"].xid_last) == (0.0, 13.0)


def test_lowercase_hostname_label_is_read():
    text = '# TYPE DCGM_FI_DEV_GPU_TEMP gauge\nDCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-x",hostname="n2"} 50\n'
    (g,) = parse_dcgm_metrics(text, ts=0.0)
    assert (g.node, g.temperature_c) == ("n2", 50.0)


def test_dcgm_blank_sentinels_are_none_not_huge_numbers():
    text = (
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-x"} 2147483632\n'
        "# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"
        'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-x"} 140737488355328.000000\n'
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
        'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-x"} 9223372036854775794\n'
    )
    (g,) = parse_dcgm_metrics(text, ts=0.0)
    assert (g.temperature_c, g.power_w, g.energy_j) == (None, None, None)


def test_mig_instances_are_separate_samples():
    text = (
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-x",GPU_I_PROFILE="1g.10gb",GPU_I_ID="7"} 100\n'
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-x",GPU_I_PROFILE="1g.10gb",GPU_I_ID="8"} 200\n'
    )
    got = {g.gpu: g.mem_used_mib for g in parse_dcgm_metrics(text, ts=0.0)}
    assert got == {"0/7": 100.0, "0/8": 200.0}


def test_fields_not_exposed_stay_none():
    text = '# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{gpu="3",UUID="GPU-y"} 50\n'
    (g,) = parse_dcgm_metrics(text, ts=0.0)
    assert g.util_ratio == 0.5
    assert (g.mem_total_mib, g.tensor_active_ratio, g.xid_last) == (None, None, None)


def test_garbage_line_raises_badinput(dcgm_two_gpus):
    with pytest.raises(BadInput, match=r"^line 1: "):
        parse_dcgm_metrics("DCGM_FI_DEV_GPU_UTIL{gpu=0} x\n" + dcgm_two_gpus, ts=0.0)
