"""A dcgm-exporter-compatible exposition for one simulated GPU.

Counter names, Prometheus types and HELP texts are those of dcgm-exporter's
``etc/default-counters.csv`` (3.x, with the DCP profiling fields it enables by default);
each series carries the exporter's labels ``gpu, UUID, pci_bus_id, device, modelName,
Hostname`` and, with Kubernetes pod mapping, ``container, namespace, pod``. Like the Go
exporter, counters are exposed without a ``_total`` suffix and without ``_created``.

Values follow the simulated work (an engine listener): utilisation is the busy fraction
of the last second, power rises from idle to TDP with utilisation (capped when the clock
is throttled), temperature follows power, FB used = weights + activation reserve + KV
blocks in use, SM clock is the maximum times the throttle ratio under load (idle clock
otherwise), XID is the last injected XID error.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable

from slokit.lab.sim.engine import SimRequest, StepStats
from slokit.lab.sim.roofline import GIB, MIB, GpuProfile, ModelProfile

# (field, type, help) in default-counters.csv order.
DEFAULT_COUNTERS: list[tuple[str, str, str]] = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active sending or receiving data."),
]  # fmt: skip

LABEL_KEYS = (
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "container",
    "namespace",
    "pod",
)
UTIL_WINDOW_S = 1.0
IDLE_SM_CLOCK_MHZ = 345
FB_RESERVED_MIB = 520


class GpuModel:
    """Telemetry of one simulated GPU; an engine listener."""

    def __init__(
        self,
        gpu: GpuProfile,
        model: ModelProfile,
        block_size: int,
        clock: Callable[[], float],
        pod: str,
        index: int = 0,
        hostname: str = "sim-node-0",
        namespace: str = "default",
        container: str = "vllm",
        activation_reserve_bytes: int = 2 * GIB,
    ):
        self.gpu = gpu
        self.model = model
        self.clock = clock
        self.block_bytes = block_size * model.kv_bytes_per_token
        self.static_bytes = model.weight_bytes + activation_reserve_bytes
        self.kv_blocks_used = 0
        self.clock_ratio = 1.0
        self.xid = 0
        self._busy: deque[tuple[float, float, float, float]] = deque()  # start, end, tensor, dram
        self._t0 = self._temp_t = clock()
        self._busy_energy_j = 0.0
        self._temp = 32.0
        uid = uuid.uuid5(uuid.NAMESPACE_URL, f"slokit-sim/{hostname}/{pod}/{index}")
        self.labels = {
            "gpu": str(index),
            "UUID": f"GPU-{uid}",
            "pci_bus_id": f"00000000:{0x18 + 0x10 * index:02X}:00.0",
            "device": f"nvidia{index}",
            "modelName": gpu.model_name,
            "Hostname": hostname,
            "container": container,
            "namespace": namespace,
            "pod": pod,
        }

    # ---- engine listener --------------------------------------------------------------
    def on_step(self, s: StepStats) -> None:
        busy = max(s.gpu_busy_s, 1e-9)
        clock = max(s.clock_ratio, 0.05)
        tensor = min(1.0, s.flops / (self.gpu.bf16_tflops * 1e12 * clock) / busy)
        dram = min(1.0, s.read_bytes / (self.gpu.hbm_gbps * 1e9) / busy)
        log = self._busy
        log.append((s.start, s.start + s.gpu_busy_s, tensor, dram))
        if len(log) > 4096:  # nobody reads: keep memory bounded
            log.popleft()
        self.kv_blocks_used = s.kv_blocks_used
        self._busy_energy_j += (self._power_cap_w() - self.gpu.idle_w) * s.gpu_busy_s

    def on_finish(self, req: SimRequest) -> None:
        return None

    # ---- readings ---------------------------------------------------------------------
    def _window(self) -> tuple[float, float, float]:
        """(busy fraction, tensor-active ratio, DRAM-active ratio) over the last second."""
        now = self.clock()
        lo = now - UTIL_WINDOW_S
        while self._busy and self._busy[0][1] < lo:
            self._busy.popleft()
        busy = tensor = dram = 0.0
        for start, end, t, d in self._busy:
            overlap = min(end, now) - max(start, lo)
            if overlap > 0:
                busy += overlap
                tensor += overlap * t
                dram += overlap * d
        w = UTIL_WINDOW_S
        return min(1.0, busy / w), min(1.0, tensor / w), min(1.0, dram / w)

    def _power_cap_w(self) -> float:
        """Board power at full load: TDP, lower when the clock is throttled."""
        return self.gpu.tdp_w * (0.35 + 0.65 * self.clock_ratio)

    def power_w(self, util: float) -> float:
        return self.gpu.idle_w + (self._power_cap_w() - self.gpu.idle_w) * util

    def energy_mj(self) -> int:
        """Idle power over the whole life plus the extra power of every busy second."""
        return int((self.gpu.idle_w * (self.clock() - self._t0) + self._busy_energy_j) * 1000)

    def _update_temperature(self, power_w: float) -> None:
        now = self.clock()
        dt = max(0.0, now - self._temp_t)
        self._temp_t = now
        target = 30.0 + 50.0 * power_w / self.gpu.tdp_w
        self._temp += (target - self._temp) * min(1.0, dt / 30.0)

    def readings(self) -> dict[str, float | int]:
        util, tensor, dram = self._window()
        power = self.power_w(util)
        self._update_temperature(power)
        total_mib = self.gpu.memory_mib
        used_mib = int((self.static_bytes + self.kv_blocks_used * self.block_bytes) / MIB)
        used_mib = min(used_mib, total_mib - FB_RESERVED_MIB)
        loaded = util > 0.05
        sm_clock = (
            int(self.gpu.max_sm_clock_mhz * self.clock_ratio) if loaded else IDLE_SM_CLOCK_MHZ
        )
        return {
            "DCGM_FI_DEV_SM_CLOCK": sm_clock,
            "DCGM_FI_DEV_MEM_CLOCK": self.gpu.mem_clock_mhz,
            "DCGM_FI_DEV_MEMORY_TEMP": int(self._temp + 4),
            "DCGM_FI_DEV_GPU_TEMP": int(self._temp),
            "DCGM_FI_DEV_POWER_USAGE": round(power, 3),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": self.energy_mj(),
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
            "DCGM_FI_DEV_GPU_UTIL": round(util * 100),
            "DCGM_FI_DEV_MEM_COPY_UTIL": round(dram * 100),
            "DCGM_FI_DEV_ENC_UTIL": 0,
            "DCGM_FI_DEV_DEC_UTIL": 0,
            "DCGM_FI_DEV_XID_ERRORS": self.xid,
            "DCGM_FI_DEV_FB_FREE": total_mib - FB_RESERVED_MIB - used_mib,
            "DCGM_FI_DEV_FB_USED": used_mib,
            "DCGM_FI_DEV_FB_RESERVED": FB_RESERVED_MIB,
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 0,
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(util, 6),
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(tensor, 6),
            "DCGM_FI_PROF_DRAM_ACTIVE": round(dram, 6),
        }

    def render(self) -> bytes:
        values = self.readings()
        lbl = ",".join(f'{k}="{self.labels[k]}"' for k in LABEL_KEYS)
        lines: list[str] = []
        for name, kind, doc in DEFAULT_COUNTERS:
            v = values[name]
            lines.append(f"# HELP {name} {doc}")
            lines.append(f"# TYPE {name} {kind}")
            text = str(v) if isinstance(v, int) else f"{v:.6f}"
            lines.append(f"{name}{{{lbl}}} {text}")
        return ("\n".join(lines) + "\n").encode()
