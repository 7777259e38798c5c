"""Model and GPU profiles, and the roofline that turns one engine step into seconds.

A step's time is ``max(memory_time, compute_time) + overhead`` where

* ``memory_time = (weight_bytes + kv_bytes_read) / (HBM bandwidth * bw_efficiency)``:
  every step streams all weights once plus the KV cache of every scheduled sequence
  (this is what makes decode memory-bound and TPOT grow with the running batch);
* ``compute_time = 2 * params * scheduled_tokens / (peak bf16 FLOP/s * mfu * clock_ratio)``:
  dense matmul FLOPs (this is what makes prefill compute-bound and TTFT grow with the prompt);
* ``overhead`` is a fixed per-step CPU/launch cost.

A throttled GPU (``clock_ratio`` < 1: SM clock below its maximum) slows compute in
proportion and memory-bound kernels by a smaller amount (``0.5 + 0.5 * clock_ratio``).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class ModelProfile:
    """A dense decoder-only transformer, enough to size weights and KV cache."""

    key: str
    served_name: str
    params: float
    num_layers: int
    num_kv_heads: int
    head_dim: int
    bytes_per_param: int = 2
    kv_bytes_per_elem: int = 2

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_bytes_per_elem


@dataclass(frozen=True)
class GpuProfile:
    key: str
    model_name: str  # as NVML/DCGM report it (modelName label)
    hbm_gbps: float  # GB/s (1e9 bytes)
    bf16_tflops: float  # dense
    memory_mib: int  # as DCGM reports FB total
    tdp_w: float
    idle_w: float
    max_sm_clock_mhz: int
    mem_clock_mhz: int

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


MODELS: dict[str, ModelProfile] = {
    # Qwen2.5-7B-Instruct: 28 layers, GQA with 4 KV heads of 128.
    "7b": ModelProfile("7b", "Qwen/Qwen2.5-7B-Instruct", 7.62e9, 28, 4, 128),
    # Qwen2.5-32B-Instruct: 64 layers, GQA with 8 KV heads of 128.
    "32b": ModelProfile("32b", "Qwen/Qwen2.5-32B-Instruct", 32.8e9, 64, 8, 128),
}

GPUS: dict[str, GpuProfile] = {
    "h100": GpuProfile("h100", "NVIDIA H100 80GB HBM3", 3350, 989, 81559, 700, 70, 1980, 2619),
    "h200": GpuProfile("h200", "NVIDIA H200", 4800, 989, 143771, 700, 75, 1980, 3201),
    "a100": GpuProfile("a100", "NVIDIA A100-SXM4-80GB", 2039, 312, 81920, 400, 55, 1410, 1593),
    "l4": GpuProfile("l4", "NVIDIA L4", 300, 121, 23034, 72, 16, 2040, 6251),
}


@dataclass(frozen=True)
class Roofline:
    model: ModelProfile
    gpu: GpuProfile
    bw_efficiency: float = 0.8
    mfu: float = 0.6
    step_overhead_s: float = 0.0015

    def step_seconds(
        self, scheduled_tokens: int, kv_tokens_read: int, clock_ratio: float = 1.0
    ) -> float:
        """Seconds for one forward pass over ``scheduled_tokens`` new tokens whose
        attention reads ``kv_tokens_read`` cached tokens in total."""
        if scheduled_tokens <= 0:
            return 0.0
        clock = min(max(clock_ratio, 0.05), 1.0)
        read = self.model.weight_bytes + kv_tokens_read * self.model.kv_bytes_per_token
        mem_s = read / (self.gpu.hbm_gbps * 1e9 * self.bw_efficiency) / (0.5 + 0.5 * clock)
        compute_s = self.flops(scheduled_tokens) / (self.gpu.bf16_tflops * 1e12 * self.mfu * clock)
        return max(mem_s, compute_s) + self.step_overhead_s

    def flops(self, scheduled_tokens: int) -> float:
        return 2.0 * self.model.params * scheduled_tokens

    def read_bytes(self, kv_tokens_read: int) -> float:
        return self.model.weight_bytes + kv_tokens_read * self.model.kv_bytes_per_token

    def write_bytes(self, scheduled_tokens: int) -> float:
        return float(scheduled_tokens * self.model.kv_bytes_per_token)


def num_gpu_blocks(
    model: ModelProfile,
    gpu: GpuProfile,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: int = 2 * GIB,
) -> int:
    """KV blocks that fit beside the weights, as vLLM's memory profiling would size them.

    Raises ValueError when the weights alone do not fit."""
    budget = gpu.memory_bytes * gpu_memory_utilization - model.weight_bytes
    budget -= activation_reserve_bytes
    if budget <= 0:
        raise ValueError(
            f"model {model.key} ({model.weight_bytes / GIB:.1f} GiB of weights) does not fit "
            f"on one {gpu.key} ({gpu.memory_mib} MiB)"
        )
    return int(budget // (block_size * model.kv_bytes_per_token))
