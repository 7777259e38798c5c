"""Sidecar configuration: a YAML file < ``SLOKIT_*`` environment < command-line flags.

Keys (YAML and flags share names; env is ``SLOKIT_`` + upper-case key, lists comma-separated):
``vllm_urls``, ``dcgm_urls``, ``router_urls``, ``nvml``, ``otlp_http``, ``otlp_grpc``, ``listen``, ``db``,
``slo``, ``replica``, ``scrape_interval_s``, ``token``, ``forward_otlp``, ``forward_content``,
``parquet_dir``, ``max_body_bytes``, ``otlp_body_budget_bytes``, ``queue_capacity``, ``batch_max``, ``batch_linger_s``,
``commit_interval_s``, ``journal``, ``sample_commit_interval_s``,
``sli_grace_s``, ``sli_interval_s``, ``diagnose_interval_s``, ``ack_timeout_s``,
``scrape_timeout_s``, ``db_memory_limit``, ``scrape_sample_limit``, ``scrape_body_limit_bytes``,
``db_threads``, ``native_threads``, ``db_allocator_background_threads``, ``retention_requests``,
``retention_s``, ``lake_hold_requests``,
``metrics_max_models``, ``metrics_max_replicas``, ``metrics_allow_models``, ``metrics_allow_replicas``,
``metrics_max_series`` (docs/metrics.md).
Connection hygiene: ``header_timeout_s``, ``body_timeout_s``, ``idle_timeout_s``,
``api_max_connections``, ``otlp_max_connections``, ``api_threads`` (docs/sidecar.md).
A vLLM or dcgm URL may be given as ``NAME=URL`` to name its replica; a router URL (the llm-d
router / Inference Extension EPP's ``/metrics``) as ``NAME=URL`` to name the router (default:
its ``host:port``). ``router_urls`` also takes a comma-separated list in one flag.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from slokit.errors import BadInput

DEFAULT_OTLP_HTTP = "127.0.0.1:4318"
DEFAULT_OTLP_GRPC = "127.0.0.1:4317"
DEFAULT_LISTEN = "127.0.0.1:9464"


@dataclass(frozen=True)
class Target:
    """One scrape target: its URL, what it is, and the replica its samples belong to."""

    url: str
    kind: str  # "vllm" | "dcgm" | "router"
    replica: str


@dataclass(frozen=True)
class SidecarConfig:
    vllm_urls: tuple[str, ...] = ()
    dcgm_urls: tuple[str, ...] = ()
    router_urls: tuple[str, ...] = ()  # gateway router (EPP) /metrics: router_samples
    nvml: bool = False
    otlp_http: str | None = DEFAULT_OTLP_HTTP
    otlp_grpc: str | None = DEFAULT_OTLP_GRPC
    listen: str = DEFAULT_LISTEN
    db: str = "slokit.duckdb"
    slo: str | None = None
    replica: str = field(default_factory=lambda: os.environ.get("POD_NAME") or socket.gethostname())
    scrape_interval_s: float = 1.0
    scrape_timeout_s: float | None = None  # default: 80% of the interval
    token: str | None = None
    forward_otlp: str | None = None
    forward_content: bool = False  # forward prompt/completion content (never stored)
    parquet_dir: str | None = None  # the lake: closed minutes as hive Parquet (docs/lake.md)
    # One OTLP body (decompressed), as the OpenTelemetry Collector's OTLP/HTTP receiver takes
    # by default (20 MiB). Decoding takes about six times a body's bytes while it runs: one
    # 59 MiB body (the default was 64 MiB) took the sidecar's RSS from 198 to 560 MB.
    max_body_bytes: int = 20 * 1024 * 1024
    # The bytes of export bodies both OTLP receivers hold at once, a compressed body counted
    # at what it inflates to. A body waits for room up to 5 s, then gets 503 (UNAVAILABLE)
    # with Retry-After; one larger than this takes all of it (benchmarks/body_budget.py)
    otlp_body_budget_bytes: int = 32 * 1024 * 1024
    queue_capacity: int = 100_000
    batch_max: int = 5000
    # Gather concurrent exports into one transaction. 10 ms, not 50: at 200 spans/s in
    # exports of 20 the ack p50 fell 63 -> 25 ms at the same CPU (benchmarks/soak_sidecar.py),
    # and an exporter that waits for each ack is not throttled by the linger.
    batch_linger_s: float = 0.01
    # > 0: acknowledge fragments once in the journal (synced), commit them to DuckDB about
    # this often in one transaction (docs/sidecar.md, "What a 200 means"); 0: commit each batch
    # before its ack. 1 s: at 200 spans/s in exports of 20, 0.78x the CPU of 0 and ack p50
    # 17.5 vs 27 ms; 5 s: 0.85x the CPU of 1 s (a commit costs DuckDB about 5.5 ms of CPU
    # however few its rows), ack p50 alike (benchmarks/soak_sidecar.py, side by side). API
    # reads commit first; the SLI counters wait sli_grace_s (30 s) anyway
    commit_interval_s: float = 5.0
    journal: str | None = None  # the journal's path (default: the db's path + ".journal")
    # Scraped samples (engine, GPU, router, scrape health) are held and committed together
    # this often, one statement per kind (0: each scrape tick). An insert costs DuckDB about
    # 2.3 ms of CPU per statement and 0.15 ms per engine row: with two vLLM replicas scraped
    # every second, 5 s held 10 rows per statement instead of 2 (benchmarks/writer_append.py)
    sample_commit_interval_s: float = 5.0
    db_memory_limit: str | None = "128MB"  # DuckDB's buffer pool bound (None: DuckDB's default)
    # The store keeps at most this many requests, the oldest deleted first (0: all). DuckDB
    # holds the request tables' indexes in memory, 190-280 bytes a request; past
    # db_memory_limit its commits fail. 150,000: 31-42 MB of index, flat (slokit.store.retention)
    retention_requests: int = 150_000
    # ... and none first seen longer ago than this, nor any sample, scrape or finding older
    # (0: no age bound)
    retention_s: float = 86_400.0
    # With a lake (parquet_dir), requests it has not written, or still revisits (30 min), are
    # kept past retention_requests, up to this many more; past that the oldest go anyway (a
    # lake that cannot write must not grow the indexes until DuckDB's commits fail), counted in
    # slokit_requests_pruned_before_lake_total. 100,000: 19-28 MB more index at most
    lake_hold_requests: int = 100_000
    # DuckDB's worker threads (0: one per core, DuckDB's default). 1: the sidecar at 200
    # spans/s in exports of 20 used 0.84x the CPU of 0 (13.7-14.0% vs 15.8-17.1% of a core,
    # benchmarks/soak_sidecar.py, taking turns); its queries are over one pod's data
    db_threads: int = 1
    # The threads each native library's pool may start: DuckDB's async I/O threads (four per
    # core by default), Arrow's CPU pool and numpy's BLAS (one per core each). They count the
    # node's cores, not the pod's CPU limit: on a 64-core node a sidecar ran 331 threads where
    # it runs 18 on 2 cores (benchmarks/threads_by_cores.py). 0: each library's default.
    # OPENBLAS_NUM_THREADS, OMP_NUM_THREADS and MKL_NUM_THREADS in the environment win
    native_threads: int = 1
    # DuckDB's allocator (jemalloc) keeps what its statements freed until a later allocation
    # purges it; its background thread returns it to the OS once it has lain unused about a
    # second. One setting for the whole process. Off: 3-14 MB more RssAnon in the soaks
    # (docs/sidecar.md#memory-and-imports)
    db_allocator_background_threads: bool = True
    sli_grace_s: float = 30.0
    sli_interval_s: float = 5.0
    diagnose_interval_s: float = 30.0  # periodic findings; 0: off (pandas never loads)
    ack_timeout_s: float = 30.0
    # connection hygiene (each HTTP listener; OTLP/gRPC where grpcio has the knob)
    header_timeout_s: float = 10.0  # a request's headers must be complete within this
    body_timeout_s: float = 30.0  # a request body that stalls this long is dropped
    idle_timeout_s: float = 75.0  # keep-alive connections idle this long are closed
    api_max_connections: int = 128  # open connections on the API listener (9464)
    # Threads answering the API's reads (explain, diagnose, the data endpoints), apart from
    # the ones that decode exports and parse scrapes: 12 clients looping /api/diagnose took
    # the ack p50 of 512-span exports from 8 to 298 ms when they shared Python's default
    # executor (benchmarks/api_flood.py). 0: share it, as before
    api_threads: int = 2
    otlp_max_connections: int = 256  # on each OTLP listener (4318, 4317)
    scrape_sample_limit: int = 10_000  # more samples fail a scrape whole (0: no limit)
    scrape_body_limit_bytes: int = 16 * 1024 * 1024  # reading a scrape stops past this
    metrics_max_models: int = 100  # top-N model label values exported, the rest "other"
    metrics_max_replicas: int = 100
    metrics_allow_models: tuple[str, ...] = ()  # when set: only these, the rest "other"
    metrics_allow_replicas: tuple[str, ...] = ()
    metrics_max_series: int = 10_000  # series of slokit_requests_total + output_tokens

    # -- derived ---------------------------------------------------------------------------
    def journal_path(self) -> str | None:
        """Where the writer's journal lives, or None when there is none (no commit
        interval, or a database in memory, which a journal could not make durable)."""
        if self.commit_interval_s <= 0 or self.db == ":memory:":
            return None
        return self.journal or f"{self.db}.journal"

    @property
    def timeout_s(self) -> float:
        t = (
            self.scrape_timeout_s
            if self.scrape_timeout_s is not None
            else self.scrape_interval_s * 0.8
        )
        return min(t, self.scrape_interval_s * 0.95)

    def targets(self) -> list[Target]:
        out: list[Target] = []
        for kind, urls in (("vllm", self.vllm_urls), ("dcgm", self.dcgm_urls)):
            for url in urls:
                name, sep, rest = url.partition("=")
                if sep and "://" not in name:
                    out.append(Target(rest, kind, name))
                else:
                    replica = (
                        self.replica
                        if len(self.vllm_urls) <= 1 or kind == "dcgm"
                        else _host_port(url)
                    )
                    out.append(Target(url, kind, replica))
        for url in self.router_urls:
            name, sep, rest = url.partition("=")
            if sep and "://" not in name:
                out.append(Target(rest, "router", name))
            else:
                out.append(Target(url, "router", _host_port(url)))
        return out

    def endpoints(self) -> list[str]:
        return [a for a in (self.listen, self.otlp_http, self.otlp_grpc) if a]

    def validate(self) -> SidecarConfig:
        """Check values; a non-loopback listener without a token is refused."""
        if self.scrape_interval_s <= 0:
            raise BadInput(f"scrape interval must be > 0, got {self.scrape_interval_s}")
        if not math.isfinite(self.diagnose_interval_s) or self.diagnose_interval_s < 0:
            raise BadInput(f"diagnose_interval_s must be >= 0 (0: off), "
                           f"got {self.diagnose_interval_s}")  # fmt: skip
        if not math.isfinite(self.commit_interval_s) or not 0 <= self.commit_interval_s <= 60:
            raise BadInput(f"commit_interval_s must be 0 (commit each batch) to 60 seconds, "
                           f"got {self.commit_interval_s}")  # fmt: skip
        if (
            not math.isfinite(self.sample_commit_interval_s)
            or not 0 <= self.sample_commit_interval_s <= 60
        ):
            raise BadInput(f"sample_commit_interval_s must be 0 (each scrape tick) to 60 "
                           f"seconds, got {self.sample_commit_interval_s}")  # fmt: skip
        if self.max_body_bytes <= 0 or self.queue_capacity <= 0:
            raise BadInput("max_body_bytes and queue_capacity must be > 0")
        if self.otlp_body_budget_bytes <= 0:
            raise BadInput(f"otlp_body_budget_bytes must be > 0, got {self.otlp_body_budget_bytes}")
        for key in ("header_timeout_s", "body_timeout_s", "idle_timeout_s"):
            v = getattr(self, key)
            if not math.isfinite(v) or v <= 0:
                raise BadInput(f"{key} must be a number of seconds > 0, got {v}")
        if not 0 <= self.api_threads <= 64:
            raise BadInput(f"api_threads must be 0 (Python's default executor) to 64, "
                           f"got {self.api_threads}")  # fmt: skip
        for key in ("api_max_connections", "otlp_max_connections"):
            if getattr(self, key) < MIN_CONNECTIONS:
                raise BadInput(f"{key} must be >= {MIN_CONNECTIONS}, got {getattr(self, key)}")
        if self.token is not None:
            check_token(self.token)
        if self.retention_requests != 0 and self.retention_requests < MIN_RETENTION_REQUESTS:
            raise BadInput(f"retention_requests must be 0 (keep all) or >= "
                           f"{MIN_RETENTION_REQUESTS}, got {self.retention_requests}")  # fmt: skip
        if self.lake_hold_requests < 0:
            raise BadInput(f"lake_hold_requests must be >= 0, got {self.lake_hold_requests}")
        if not math.isfinite(self.retention_s) or (
            self.retention_s != 0 and self.retention_s < MIN_RETENTION_S
        ):
            raise BadInput(f"retention_s must be 0 (no age bound) or >= {MIN_RETENTION_S:g} "
                           f"seconds, got {self.retention_s}")  # fmt: skip
        if not 0 <= self.db_threads <= 1024:
            raise BadInput(f"db_threads must be 0 (one per core) to 1024, got {self.db_threads}")
        if not 0 <= self.native_threads <= 1024:
            raise BadInput(f"native_threads must be 0 (each library's default) to 1024, "
                           f"got {self.native_threads}")  # fmt: skip
        if self.scrape_sample_limit < 0 or self.scrape_body_limit_bytes <= 0:
            raise BadInput("scrape_sample_limit must be >= 0, scrape_body_limit_bytes > 0")
        if min(self.metrics_max_models, self.metrics_max_replicas, self.metrics_max_series) < 1:
            raise BadInput("metrics_max_models, _replicas and _series must be >= 1")
        for addr in self.endpoints():
            host, _ = split_host_port(addr)
            if not is_loopback(host) and not self.token:
                raise BadInput(
                    f"refusing to listen on {addr} without a bearer token: pass --token "
                    "(or SLOKIT_TOKEN), or bind 127.0.0.1"
                )
        for url in (*self.vllm_urls, *self.dcgm_urls, *self.router_urls):
            t = url.partition("=")[2] if "=" in url and "://" not in url.partition("=")[0] else url
            if not t.startswith(("http://", "https://")):
                raise BadInput(f"scrape target must be an http(s) URL, got {url!r}")
        return self


#: The least requests and age the store may be told to keep: what the periodic findings read
#: (their 15-minute window) must stay.
MIN_RETENTION_REQUESTS = 1_000
MIN_RETENTION_S = 900.0
#: The least connections a listener may be capped at (probes need room beside clients).
MIN_CONNECTIONS = 8
_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")


def check_token(token: str) -> None:
    """Refuse a bearer token that is blank or could not travel in an HTTP header as sent
    (``Authorization: Bearer <token>``): whitespace, control or non-ASCII characters."""
    if not token.strip():
        raise BadInput("the bearer token is blank: pass a real secret with --token or SLOKIT_TOKEN")
    if not _TOKEN_CHARS.fullmatch(token):
        raise BadInput(
            "the bearer token may hold only visible ASCII characters (no spaces, control or "
            "non-ASCII characters): it travels in the Authorization header"
        )


def _host_port(url: str) -> str:
    rest = url.split("://", 1)[-1]
    return rest.split("/", 1)[0]


def split_host_port(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise BadInput(f"expected HOST:PORT, got {addr!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_LISTS = {"vllm_urls", "dcgm_urls", "router_urls", "metrics_allow_models", "metrics_allow_replicas"}
#: Lists whose every value may itself be a comma-separated list (``--router-url A,B``).
_COMMA_LISTS = {"router_urls"}
#: Receivers that an empty value ("" flag or env, null in YAML) turns off.
_OPTIONAL = {"otlp_http", "otlp_grpc"}
_FIELDS = {f.name: f for f in fields(SidecarConfig)}


def _coerce(key: str, value: Any, where: str) -> Any:
    if value is None:
        return None
    typ = str(_FIELDS[key].type)
    try:
        if key in _LISTS:
            if isinstance(value, str):
                return tuple(v.strip() for v in value.split(",") if v.strip())
            if key in _COMMA_LISTS:
                return tuple(u.strip() for v in value for u in str(v).split(",") if u.strip())
            return tuple(str(v) for v in value)
        if typ == "bool":
            if isinstance(value, str):
                low = value.strip().lower()
                if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError(value)
                return low in ("1", "true", "yes", "on")
            return bool(value)
        if typ == "int":
            return int(value)
        if "float" in typ:
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise BadInput(f"{where}: {key}: cannot use {value!r}") from None


def load_config(
    file: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> SidecarConfig:
    """Merge YAML ``file`` < ``env`` (``SLOKIT_*``) < ``flags`` (None means not given)."""
    values: dict[str, Any] = {}
    if file is not None:
        p = Path(file)
        try:
            doc = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise BadInput(f"cannot read sidecar config {p}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise BadInput(f"{p}: not valid YAML: {exc}") from None
        if not isinstance(doc, dict):
            raise BadInput(f"{p}: the sidecar config must be a YAML mapping")
        unknown = sorted(set(doc) - set(_FIELDS))
        if unknown:
            raise BadInput(f"{p}: unknown keys {unknown}; known: {sorted(_FIELDS)}")
        values.update({k: _coerce(k, v, str(p)) for k, v in doc.items()})
    environ = os.environ if env is None else env
    for key in _FIELDS:
        raw = environ.get("SLOKIT_" + key.upper())
        if raw == "" and key in _OPTIONAL:
            values[key] = None
        elif raw is not None and raw != "":
            values[key] = _coerce(key, raw, "SLOKIT_" + key.upper())
    for key, v in (flags or {}).items():
        if v == "" and key in _OPTIONAL:
            values[key] = None
            continue
        if v is None or (key in _LISTS and not v):
            continue
        if key not in _FIELDS:
            raise BadInput(f"unknown sidecar option {key}")
        values[key] = _coerce(key, v, "--" + key.replace("_", "-"))
    return replace(SidecarConfig(), **values)
