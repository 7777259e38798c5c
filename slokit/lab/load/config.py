"""One load run's settings (:class:`LoadConfig`) and their validation."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from slokit.errors import BadInput
from slokit.lab.load.schedule import Arrival, check_rate
from slokit.lab.workload import DEFAULT_WORKLOAD, Workload

Endpoint = Literal["completions", "chat"]


@dataclass(slots=True)
class LoadConfig:
    """One load run. Exactly one of ``rate`` (open loop) and ``users`` (closed loop)."""

    url: str
    duration_s: float
    rate: float | None = None
    #: Further replicas: requests go round-robin over ``(url, *more_urls)``.
    more_urls: tuple[str, ...] = ()
    users: int | None = None
    workload: Workload = field(default_factory=lambda: DEFAULT_WORKLOAD)
    arrival: Arrival = "poisson"
    seed: int = 0
    model: str | None = None
    endpoint: Endpoint = "completions"
    timeout_s: float = 300.0
    #: At the end of the run (duration reached) sending stops and the requests in flight get
    #: this long to finish; those still running then are cut and recorded ``incomplete``
    #: (``inf``: wait for every answer, each bounded only by ``timeout_s``).
    drain_s: float = 30.0
    headers: dict[str, str] = field(default_factory=dict)
    run_id: str | None = None
    otlp_endpoint: str | None = None
    out: Path | None = None
    keep_records: bool = True
    progress_interval_s: float = 1.0

    def validate(self) -> None:
        if (self.rate is None) == (self.users is None):
            raise BadInput("give exactly one of --rate (open loop) and --users (closed loop)")
        if self.rate is not None:
            check_rate(self.rate, self.duration_s)
        if self.users is not None and self.users < 1:
            raise BadInput(f"--users must be at least 1, got {self.users}")
        if not self.duration_s > 0:
            raise BadInput(f"--duration must be positive, got {self.duration_s}")
        if not self.timeout_s > 0:
            raise BadInput(f"--timeout must be positive, got {self.timeout_s}")
        if not self.drain_s >= 0:
            raise BadInput(f"--drain must be zero or positive, got {self.drain_s}")
        if self.endpoint not in ("completions", "chat"):
            raise BadInput(f"--endpoint must be completions or chat, got {self.endpoint!r}")
        if self.arrival not in ("poisson", "constant"):
            raise BadInput(f"--arrival must be poisson or constant, got {self.arrival!r}")
        for url in (self.url, *self.more_urls):
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise BadInput(f"--url must be an http(s) URL, got {url!r}")
