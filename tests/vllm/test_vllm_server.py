"""slokit.lab.vllm_server without vLLM: the argv and environment it builds, and how it fails.

A failing "vLLM" here is a real subprocess (a small shell script standing in for the
interpreter), so start-up, log capture and process-group shutdown run for real.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slokit.lab.vllm_server import (
    VllmServer,
    VllmServerConfig,
    VllmServerPool,
    VllmStartError,
    process_tree_rss_bytes,
    server_command,
    server_env,
    start_together,
    vllm_available,
    vllm_python,
)

MODEL = Path("/models/tiny")


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _fake_interpreter(tmp_path: Path, script: str) -> Path:
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_command_runs_the_openai_api_server_module_of_the_given_interpreter() -> None:
    argv = server_command(VllmServerConfig(MODEL), Path("/venv/bin/python"), "127.0.0.1", 8123)
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(argv, "--model") == str(MODEL)
    assert _flag(argv, "--served-model-name") == "tiny"
    assert (_flag(argv, "--host"), _flag(argv, "--port")) == ("127.0.0.1", "8123")


def test_command_defaults_to_eager_and_a_short_context() -> None:
    argv = server_command(VllmServerConfig(MODEL), Path("python"), "127.0.0.1", 1)
    assert "--enforce-eager" in argv
    assert _flag(argv, "--max-model-len") == "2048"
    assert "--max-num-seqs" not in argv
    assert "--otlp-traces-endpoint" not in argv


def test_command_passes_capacity_tracing_and_extra_flags() -> None:
    config = VllmServerConfig(
        MODEL,
        max_num_seqs=4,
        num_gpu_blocks_override=16,
        otlp_traces_endpoint="http://127.0.0.1:4318/v1/traces",
        extra_args=("--seed", "7"),
    )
    argv = server_command(config, Path("python"), "127.0.0.1", 1)
    assert _flag(argv, "--max-num-seqs") == "4"
    assert _flag(argv, "--num-gpu-blocks-override") == "16"
    assert _flag(argv, "--otlp-traces-endpoint") == "http://127.0.0.1:4318/v1/traces"
    assert argv[-2:] == ["--seed", "7"]


def test_env_sizes_the_cpu_kv_cache_and_keeps_the_base_environment() -> None:
    env = server_env(VllmServerConfig(MODEL, kv_cache_space_gib=2), base={"HOME": "/root"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["HOME"] == "/root"
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


def test_env_names_the_otlp_protocol_and_the_replica_resource() -> None:
    config = VllmServerConfig(
        MODEL,
        otlp_traces_endpoint="http://127.0.0.1:4318/v1/traces",
        otlp_protocol="http/protobuf",
        otel_service_name="vllm",
        otel_resource_attributes=(("k8s.pod.name", "pod-a"), ("k8s.namespace.name", "ns")),
        otel_bsp_schedule_delay_ms=200,
    )
    env = server_env(config, base={})
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert env["OTEL_SERVICE_NAME"] == "vllm"
    assert env["OTEL_RESOURCE_ATTRIBUTES"] == "k8s.pod.name=pod-a,k8s.namespace.name=ns"
    assert env["OTEL_BSP_SCHEDULE_DELAY"] == "200"


def test_env_sets_no_otlp_protocol_without_an_endpoint() -> None:
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" not in server_env(VllmServerConfig(MODEL), base={})


def test_extra_env_overrides_the_defaults() -> None:
    config = VllmServerConfig(MODEL, extra_env=(("OMP_NUM_THREADS", "2"),))
    assert server_env(config, base={})["OMP_NUM_THREADS"] == "2"


def test_interpreter_comes_from_the_environment_variable_when_set(tmp_path: Path) -> None:
    python = _fake_interpreter(tmp_path, "exit 0")
    environ = {"SLOKIT_VLLM_PYTHON": str(python)}
    assert vllm_python(tmp_path / "repo", environ) == python
    assert vllm_available(tmp_path / "repo", environ)


def test_interpreter_defaults_to_the_repo_venv_vllm(tmp_path: Path) -> None:
    assert vllm_python(tmp_path, {}) == tmp_path / ".venv-vllm" / "bin" / "python"
    assert not vllm_available(tmp_path, {})


def test_start_without_an_interpreter_says_how_to_create_one(tmp_path: Path) -> None:
    server = VllmServer(VllmServerConfig(MODEL), python=tmp_path / "missing" / "python")
    with pytest.raises(VllmStartError, match=r"scripts/vllm-env\.sh"):
        server.start()


def test_a_server_that_dies_reports_its_exit_code_and_log_tail(tmp_path: Path) -> None:
    python = _fake_interpreter(tmp_path, 'echo "ValueError: head_dim 16 is not supported"; exit 3')
    server = VllmServer(VllmServerConfig(MODEL), python=python, log_path=tmp_path / "vllm.log")
    with pytest.raises(VllmStartError) as error:
        server.start()
    assert "exited with code 3" in str(error.value)
    assert "head_dim 16 is not supported" in str(error.value)
    assert server.pid is None


def test_a_server_that_never_gets_healthy_times_out_and_is_stopped(tmp_path: Path) -> None:
    python = _fake_interpreter(tmp_path, 'echo "loading forever"; exec sleep 600')
    now = [0.0]
    server = VllmServer(
        VllmServerConfig(MODEL),
        python=python,
        log_path=tmp_path / "vllm.log",
        startup_timeout_s=30,
        clock=lambda: now[0],
        sleep=lambda seconds: now.__setitem__(0, now[0] + seconds),
    )
    with pytest.raises(VllmStartError, match=r"not healthy after 30 s(.|\n)*loading forever"):
        server.start()
    assert server.pid is None


def test_the_command_line_opens_the_log(tmp_path: Path) -> None:
    python = _fake_interpreter(tmp_path, "exit 1")
    server = VllmServer(VllmServerConfig(MODEL), python=python, log_path=tmp_path / "vllm.log")
    with pytest.raises(VllmStartError):
        server.start()
    first_line = (tmp_path / "vllm.log").read_text().splitlines()[0]
    assert first_line.startswith(f"$ {python} -m vllm.entrypoints.openai.api_server")


def test_pool_remembers_a_failed_configuration_instead_of_starting_it_again(
    tmp_path: Path,
) -> None:
    python = _fake_interpreter(tmp_path, "exit 1")
    made: list[VllmServerConfig] = []

    def make(config: VllmServerConfig) -> VllmServer:
        made.append(config)
        return VllmServer(config, python=python, log_path=tmp_path / f"{len(made)}.log")

    pool = VllmServerPool(make)
    config = VllmServerConfig(MODEL, max_num_seqs=2)
    with pytest.raises(VllmStartError) as first:
        pool.get(config)
    with pytest.raises(VllmStartError) as second:
        pool.get(VllmServerConfig(MODEL, max_num_seqs=2))
    assert second.value is first.value
    assert made == [config]


_HEALTHY = """exec python3 - "$@" <<'EOF'
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
EOF"""


def test_start_together_starts_every_server(tmp_path: Path) -> None:
    python = _fake_interpreter(tmp_path, _HEALTHY)
    servers = [
        VllmServer(VllmServerConfig(MODEL), python=python, log_path=tmp_path / f"{i}.log")
        for i in range(2)
    ]
    try:
        start_together(servers)
        assert all(s.pid is not None for s in servers)
    finally:
        for s in servers:
            s.stop()


def test_start_together_stops_the_started_ones_when_one_fails(tmp_path: Path) -> None:
    (tmp_path / "ok").mkdir()
    (tmp_path / "bad").mkdir()
    healthy = VllmServer(
        VllmServerConfig(MODEL),
        python=_fake_interpreter(tmp_path / "ok", _HEALTHY),
        log_path=tmp_path / "ok.log",
    )
    failing = VllmServer(
        VllmServerConfig(MODEL),
        python=_fake_interpreter(tmp_path / "bad", "exit 3"),
        log_path=tmp_path / "bad.log",
    )
    with pytest.raises(VllmStartError, match="exited with code 3"):
        start_together([healthy, failing])
    assert healthy.pid is None and failing.pid is None


def test_configurations_that_differ_are_different_pool_keys() -> None:
    assert VllmServerConfig(MODEL, max_num_seqs=2) == VllmServerConfig(MODEL, max_num_seqs=2)
    assert VllmServerConfig(MODEL, max_num_seqs=2) != VllmServerConfig(MODEL, max_num_seqs=4)
    assert len({VllmServerConfig(MODEL), VllmServerConfig(MODEL, num_gpu_blocks_override=8)}) == 2


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_process_tree_rss_counts_this_process() -> None:
    rss = process_tree_rss_bytes(os.getpid())
    assert rss is not None and rss > 1024 * 1024


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_process_tree_rss_of_an_unknown_pid_is_none() -> None:
    assert process_tree_rss_bytes(2**22 + 1) is None


def test_worker_runs_inside_the_engine_process_by_default() -> None:
    assert server_env(VllmServerConfig(MODEL), base={})["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_a_separate_worker_process_can_be_asked_for() -> None:
    config = VllmServerConfig(MODEL, worker_in_engine_process=False)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in server_env(config, base={})


def test_automatic_thread_binding_requires_a_separate_worker_process() -> None:
    with pytest.raises(ValueError, match="separate worker process"):
        VllmServerConfig(MODEL, omp_threads=None)
    assert VllmServerConfig(MODEL, omp_threads=None, worker_in_engine_process=False)
