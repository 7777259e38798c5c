"""The typed context of an explanation: the replica's engine state at arrival and during the
request's life, the GPU at arrival, and the request's rank among its peers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ReplicaState:
    """The replica's last engine sample before arrival."""

    ts: str | None
    age_s: float
    running: float | None
    waiting: float | None
    kv_usage_ratio: float | None
    prefix_hit_ratio: float | None
    num_gpu_blocks: float | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class During:
    """The replica during the request's life (engine samples between arrival and finish)."""

    preemptions: float | None
    counter_resets: int
    kv_usage_max: float | None
    waiting_max: float | None
    running_avg: float | None
    samples: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class GpuState:
    gpu: str | int | None
    util_ratio: float | None
    mem_used_mib: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    xid_last: float | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class PeerRank:
    """The request's percentile rank among its peers (0..1) and the peers' p50 and p95."""

    rank: float | None
    p50: float | None
    p95: float | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Peers:
    """Requests of the same class arriving within +/- ``window_s`` of this one."""

    window_s: float
    count: int
    ranks: Mapping[str, PeerRank]  # metric (ttft_s, tpot_s, e2e_s) -> rank


@dataclass(frozen=True)
class Context:
    replica_state_at_arrival: ReplicaState | None = None
    during: During | None = None
    gpu_at_arrival: GpuState | None = None
    peers: Peers | None = None  # None when the arrival is unknown

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "replica_state_at_arrival": _or_none(self.replica_state_at_arrival),
            "during": _or_none(self.during),
            "gpu_at_arrival": _or_none(self.gpu_at_arrival),
        }
        if self.peers is not None:
            out["peer_window_s"] = self.peers.window_s
            out["peers"] = self.peers.count
            out["percentile_rank"] = {k: r.to_dict() for k, r in self.peers.ranks.items()}
        return out


def _or_none(part: ReplicaState | During | GpuState | None) -> dict[str, object] | None:
    return None if part is None else part.to_dict()
