"""The knobs of explain: how peers are chosen and when a request counts as slow."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExplainOptions:
    #: Peers are requests of the same class arriving within +/- the first of these windows
    #: that holds ``enough_peers`` (the last one otherwise).
    peer_windows_s: tuple[float, ...] = (60.0, 300.0, 1800.0)
    enough_peers: int = 200
    max_sample_age_s: float = 30.0  # an engine sample older than this at arrival is stale
    prefix_window_s: float = 60.0  # prefix-hit ratio over this long before arrival
    preemption_tpot_factor: float = 1.5  # TPOT this far above the peer median + preemptions
    min_peers: int = 10  # fewer peers than this: cannot call the request typical
    unusual_rank: float = 0.75  # E2E percentile rank at or above which a request is "slow"
