"""What shapes a simulated replica: model, GPU, engine knobs, telemetry targets, faults.

:class:`SimSettings` is the same for every replica of a run; :meth:`SimSettings.engine_config`
derives replica ``i``'s engine (its seed differs per replica).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slokit.lab.sim.engine import EngineConfig
from slokit.lab.sim.faults import Faults, scenario_faults
from slokit.lab.sim.roofline import GPUS, MODELS, GpuProfile, ModelProfile, num_gpu_blocks


@dataclass
class SimSettings:
    """Everything that shapes one replica (the same for all replicas of a run)."""

    model: str = "7b"
    gpu: str = "h100"
    served_model_name: str | None = None
    max_model_len: int = 4096
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    num_gpu_blocks: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True
    speed: float = 1.0
    # How far (wall s) the engine timeline may trail wall time before it resyncs:
    # small = reported times match delivery, host CPU starvation shows as latency;
    # large = the roofline timeline survives short starvation, tokens arrive in bursts.
    max_lag_s: float = 0.005
    otlp_endpoint: str | None = None
    otlp_protocol: str = "grpc"
    service_name: str = "vllm"
    hostname_prefix: str = "sim-node"  # replica i's GPU sits on host "<prefix>-<i>"
    namespace: str = "default"
    name_prefix: str = "sim-vllm"
    seed: int = 0
    faults: Faults = field(default_factory=Faults)
    scenario: str = "healthy"
    # The gateway router in front of the replicas (:mod:`slokit.lab.sim.router`): off by
    # default; its ``/metrics`` on ``router_port`` (0: an ephemeral port), its InferencePool.
    router: bool = False
    router_port: int = 0
    router_pool: str = "sim-pool"

    @classmethod
    def for_scenario(cls, scenario: str = "healthy", **overrides: Any) -> SimSettings:
        """Settings of a named preset (faults and engine knobs); explicit non-None
        ``overrides`` win over the preset's engine knobs. FaultError for an unknown name."""
        faults, engine = scenario_faults(scenario)
        kwargs: dict[str, Any] = {**engine}
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        return cls(faults=faults, scenario=scenario, **kwargs)

    def model_profile(self) -> ModelProfile:
        return MODELS[self.model]

    def gpu_profile(self) -> GpuProfile:
        return GPUS[self.gpu]

    def engine_config(self, replica_index: int = 0) -> EngineConfig:
        gpu = self.gpu_profile()
        big = gpu.memory_mib >= 70 * 1024
        blocks = self.num_gpu_blocks or num_gpu_blocks(
            self.model_profile(), gpu, block_size=self.block_size
        )
        return EngineConfig(
            max_num_seqs=self.max_num_seqs or (1024 if big else 256),
            max_num_batched_tokens=self.max_num_batched_tokens or (8192 if big else 2048),
            num_gpu_blocks=blocks,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            enable_prefix_caching=self.enable_prefix_caching,
            seed=self.seed + replica_index,
        )

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_profile().served_name
