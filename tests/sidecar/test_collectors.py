"""The deployment recipe: the manifest is valid Kubernetes (checked against the official
client's models, field by field) and wires vLLM to the sidecar the way the sidecar listens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient

from slokit.cli.sidecar import command as sidecar_command
from slokit.sidecar.config import load_config

COLLECTORS = Path(__file__).resolve().parents[2] / "collectors"
MANIFEST = COLLECTORS / "kubernetes" / "vllm-slokit.yaml"


def _docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def _model(doc: dict[str, Any]) -> Any:
    group_version = doc["apiVersion"].split("/")[-1].capitalize()
    return ApiClient().deserialize(
        json.dumps(doc), f"{group_version}{doc['kind']}", "application/json"
    )


def _strip_nulls(o: Any) -> Any:
    if isinstance(o, dict):
        return {k: _strip_nulls(v) for k, v in o.items() if v is not None}
    if isinstance(o, list):
        return [_strip_nulls(x) for x in o]
    return o


@pytest.mark.parametrize("index", range(3))
def test_each_document_round_trips_through_the_kubernetes_models(index: int) -> None:
    doc = _docs()[index]
    model = _model(doc)
    back = _strip_nulls(ApiClient().sanitize_for_serialization(model))
    # a misspelled or misplaced field is dropped by the models and shows up here
    assert back == doc


def _pod() -> Any:
    sts = next(_model(d) for d in _docs() if d["kind"] == "StatefulSet")
    return sts.spec.template.spec


def _container(name: str) -> Any:
    return next(c for c in _pod().containers if c.name == name)


def test_the_sidecar_has_probes_limits_and_a_volume_for_the_db() -> None:
    c = _container("slokit")
    assert c.readiness_probe.http_get.path == "/readyz"
    assert c.liveness_probe.http_get.path == "/healthz"
    assert c.resources.limits["memory"] and c.resources.limits["cpu"]
    assert any(m.mount_path == "/data" for m in c.volume_mounts)
    assert any(e.name == "SLOKIT_TOKEN" and e.value_from.secret_key_ref for e in c.env)


def test_the_sidecar_args_and_config_are_what_slokit_sidecar_accepts(tmp_path: Path) -> None:
    c = _container("slokit")
    ctx = sidecar_command.make_context("sidecar", list(c.args))
    cm = next(d for d in _docs() if d["kind"] == "ConfigMap")
    conf = tmp_path / "sidecar.yaml"
    conf.write_text(cm["data"]["sidecar.yaml"])
    cfg = load_config(conf, env={"SLOKIT_TOKEN": "t"}, flags={"replica": "vllm-0"}).validate()
    assert ctx.params["config_file"] == "/etc/slokit/sidecar.yaml"
    assert cfg.db.startswith("/data/")
    assert cfg.listen.endswith(":9464")
    from slokit.analysis.slo_spec import parse_spec

    parse_spec(yaml.safe_load(cm["data"]["slo.yaml"]))
    # vLLM exports to the sidecar's gRPC receiver; the sidecar scrapes vLLM's port
    vllm = _container("vllm")
    assert f"--otlp-traces-endpoint=http://{cfg.otlp_grpc}" in vllm.args
    assert cfg.vllm_urls == ("http://127.0.0.1:8000/metrics",)
    assert vllm.ports[0].container_port == 8000


def test_the_sample_config_loads() -> None:
    cfg = load_config(COLLECTORS / "sidecar.yaml", env={})
    assert cfg.validate().otlp_grpc == "127.0.0.1:4317"
