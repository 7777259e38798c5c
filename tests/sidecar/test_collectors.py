"""The deployment recipe: the manifest is valid Kubernetes (checked against the official
client's models, field by field) and wires vLLM to the sidecar the way the sidecar listens.
The fleet's pieces (a headless Service for ``--fleet dns://``, a PodMonitor, a plain scrape
config) select those pods and name their ports."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kubernetes.client import ApiClient

from slokit.cli.sidecar import command as sidecar_command
from slokit.sidecar.config import load_config

COLLECTORS = Path(__file__).resolve().parents[2] / "collectors"
MANIFEST = COLLECTORS / "kubernetes" / "vllm-slokit.yaml"
FLEET_SERVICE = COLLECTORS / "kubernetes" / "fleet-service.yaml"
POD_MONITOR = COLLECTORS / "kubernetes" / "podmonitor.yaml"
SCRAPE_CONFIG = COLLECTORS / "prometheus" / "scrape-config.yaml"


def _docs(path: Path = MANIFEST) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


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


# --- the fleet: headless Service, PodMonitor, scrape config --------------------------------


def _template_labels() -> dict[str, str]:
    sts = next(d for d in _docs() if d["kind"] == "StatefulSet")
    labels: dict[str, str] = sts["spec"]["template"]["metadata"]["labels"]
    return labels


def _named_ports() -> dict[str, int]:
    return {p.name: p.container_port for c in _pod().containers for p in c.ports or []}


def test_the_fleet_service_is_headless_and_selects_the_sidecars() -> None:
    (doc,) = _docs(FLEET_SERVICE)
    svc = _model(doc)
    assert _strip_nulls(ApiClient().sanitize_for_serialization(svc)) == doc
    assert svc.spec.cluster_ip == "None"  # the pods' own A records, not one virtual IP
    assert svc.spec.publish_not_ready_addresses is True
    assert svc.spec.selector.items() <= _template_labels().items()
    (port,) = svc.spec.ports
    assert _named_ports()[port.target_port] == port.port == 9464


#: The part of the PodMonitor CRD (monitoring.coreos.com/v1) the manifest uses: unknown or
#: misspelled fields fail, as the models catch them for built-in kinds.
_POD_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "podMetricsEndpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        }
                    },
                },
                "namespaceSelector": {"type": "object"},
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "honorLabels": {"type": "boolean"},
                            "authorization": {
                                "type": "object",
                                "required": ["credentials"],
                                "additionalProperties": False,
                                "properties": {
                                    "type": {"type": "string"},
                                    "credentials": {
                                        "type": "object",
                                        "required": ["name", "key"],
                                        "additionalProperties": False,
                                        "properties": {
                                            "name": {"type": "string"},
                                            "key": {"type": "string"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def test_the_pod_monitor_scrapes_vllm_dcgm_and_the_sidecar() -> None:
    (doc,) = _docs(POD_MONITOR)
    jsonschema.validate(doc, _POD_MONITOR_SCHEMA)
    spec = doc["spec"]
    assert spec["selector"]["matchLabels"].items() <= _template_labels().items()
    endpoints = {e["port"]: e for e in spec["podMetricsEndpoints"]}
    ports = _named_ports()
    assert (ports["http"], ports["dcgm"], ports["slokit"]) == (8000, 9400, 9464)
    assert set(endpoints) == {"http", "dcgm", "slokit"}
    # the sidecar's /metrics wants the token the sidecar reads from its Secret
    token = next(e for e in _container("slokit").env if e.name == "SLOKIT_TOKEN")
    ref = token.value_from.secret_key_ref
    assert endpoints["slokit"]["authorization"]["credentials"] == {"name": ref.name, "key": ref.key}
    # dcgm-exporter listens beyond loopback, or Prometheus could not reach it
    dcgm = _container("dcgm-exporter")
    listen = next(e.value for e in dcgm.env if e.name == "DCGM_EXPORTER_LISTEN")
    assert listen == ":9400"


def test_the_scrape_config_keeps_each_port_and_names_the_pod() -> None:
    cfg = yaml.safe_load(SCRAPE_CONFIG.read_text())
    ports = _named_ports()
    kept = set()
    for job in cfg["scrape_configs"]:
        (sd,) = job["kubernetes_sd_configs"]
        assert sd["role"] == "pod"
        (sel,) = sd["selectors"]
        name, _, value = sel["label"].partition("=")
        assert sel["role"] == "pod" and _template_labels()[name] == value
        rules = job["relabel_configs"]
        keep = next(r for r in rules if r.get("action") == "keep")
        assert keep["source_labels"] == ["__meta_kubernetes_pod_container_port_name"]
        assert keep["regex"] in ports
        kept.add(keep["regex"])
        assert {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"} in rules
    assert kept == {"http", "dcgm", "slokit"}
    slokit_job = next(j for j in cfg["scrape_configs"] if j["job_name"] == "slokit")
    assert slokit_job["authorization"]["credentials_file"].endswith("/slokit-token/token")


@pytest.mark.prometheus
def test_promtool_accepts_the_scrape_config(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found: install the Debian package 'prometheus'")
    cfg = yaml.safe_load(SCRAPE_CONFIG.read_text())
    token = tmp_path / "token"
    token.write_text("t")
    for job in cfg["scrape_configs"]:
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token)
    checked = tmp_path / "scrape-config.yaml"
    checked.write_text(yaml.safe_dump(cfg))
    res = subprocess.run([promtool, "check", "config", str(checked)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    if "field kubernetes_sd_configs not found" in res.stdout + res.stderr:
        # Debian builds Prometheus without Kubernetes discovery: check the rest of the
        # config with the same relabelling over static targets carrying the pod metadata
        for job in cfg["scrape_configs"]:
            del job["kubernetes_sd_configs"]
            job["static_configs"] = [{
                "targets": ["10.0.0.7:9464"],
                "labels": {"__meta_kubernetes_pod_name": "vllm-0",
                           "__meta_kubernetes_pod_container_port_name": "slokit"},
            }]  # fmt: skip
        checked.write_text(yaml.safe_dump(cfg))
        res = subprocess.run([promtool, "check", "config", str(checked)],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
