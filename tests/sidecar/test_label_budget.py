"""Label budget: label values that come from the traffic never make unbounded series.

A real sidecar takes 20k distinct ``gen_ai.request.model`` values over OTLP; the accountant's
finer behaviours run on a real DuckDB store with a fake clock.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sidecar_harness import StartSidecar, post, wait_for_progress

from slokit.analysis.slo_spec import load_spec
from slokit.errors import BadInput
from slokit.records import RequestFragment
from slokit.sidecar.config import load_config
from slokit.sidecar.labels import MAX_VALUE_CHARS, OTHER, LabelLimit, label_limits
from slokit.sidecar.metrics import SidecarMetrics
from slokit.sidecar.sli import SliAccountant
from slokit.store.db import Store, open_store

SLO = Path(__file__).resolve().parents[2] / "examples" / "slo" / "chat.yaml"
SLI_FAMILIES = ("slokit_requests_total", "slokit_output_tokens_total")
T0 = 1_800_000_000.0


# -- helpers ------------------------------------------------------------------------------------
def _export(template: bytes, models: list[str], prefix: str) -> bytes:
    """One OTLP export with one ``llm_request`` span (copied from the real vLLM export) per
    entry of ``models``, each a new request of that ``gen_ai.request.model``."""
    rng = random.Random(prefix)
    src = ExportTraceServiceRequest()
    src.ParseFromString(template)
    span0 = src.resource_spans[0].scope_spans[0].spans[0]
    msg = ExportTraceServiceRequest()
    rs = msg.resource_spans.add()
    rs.resource.CopyFrom(src.resource_spans[0].resource)
    ss = rs.scope_spans.add()
    ss.scope.CopyFrom(src.resource_spans[0].scope_spans[0].scope)
    for i, model in enumerate(models):
        span = ss.spans.add()
        span.CopyFrom(span0)
        span.trace_id = rng.randbytes(16)
        span.span_id = rng.randbytes(8)
        for kv in span.attributes:
            if kv.key == "gen_ai.request.id":
                kv.value.string_value = f"cmpl-{prefix}-{i}-0"
        span.attributes.append(
            KeyValue(key="gen_ai.request.model", value=AnyValue(string_value=model))
        )
    return msg.SerializeToString()


def _series(text: str, families: tuple[str, ...] = SLI_FAMILIES) -> list[dict[str, str]]:
    """The label sets of ``families``' samples in an exposition."""
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in families:
                out.append(dict(s.labels))
    return out


def _total(text: str, name: str = "slokit_requests_total", **match: str) -> float:
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in match.items())
    )


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


class Books:
    """An accountant over a real DuckDB store on a fake clock; :meth:`count` ingests
    requests and ticks past the grace period."""

    def __init__(self, db: Path, **budget: object) -> None:
        self.clock = Clock()
        self.store: Store = open_store(db, clock=self.clock)
        self.registry = CollectorRegistry()
        self.acc = SliAccountant(SidecarMetrics(self.registry), load_spec(SLO), grace_s=30,
                                 clock=self.clock, **budget)  # type: ignore[arg-type]  # fmt: skip
        self._n = 0

    def count(self, models: list[str], replicas: list[str] | None = None) -> int:
        replicas = replicas or ["pod-a"] * len(models)
        frags = []
        for model, replica in zip(models, replicas, strict=True):
            self._n += 1
            rid = f"r{self._n}"
            frags.append(RequestFragment(rid, "vllm", f"vllm:{rid}", replica=replica,
                                         model=model, arrival_ts=self.clock.t, ttft_s=0.1,
                                         e2e_s=1.0, output_tokens=10))  # fmt: skip
        self.clock.t += 1
        self.store.append_fragments(frags)
        self.clock.t += 31
        cur = self.store.cursor()
        try:
            return self.acc.tick(cur)
        finally:
            cur.close()

    def text(self) -> str:
        return generate_latest(self.registry).decode()

    def models(self) -> set[str]:
        return {s["model"] for s in _series(self.text(), ("slokit_requests_total",))}


MakeBooks = Callable[..., Books]


@pytest.fixture
def books(tmp_path: Path) -> Iterator[MakeBooks]:
    made: list[Books] = []

    def make(**budget: object) -> Books:
        b = Books(tmp_path / f"sli{len(made)}.duckdb", **budget)
        made.append(b)
        return b

    yield make
    for b in made:
        b.store.close()


# -- the real sidecar -------------------------------------------------------------------------
def test_twenty_thousand_model_names_stay_under_the_series_budget_in_a_real_sidecar(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    budget, top_n = 200, 20
    heavy = {"llama-70b": 400, "qwen-7b": 300, "mistral-7b": 200}
    models = [f"flood-{i}" for i in range(20_000)]
    for name, n in heavy.items():
        models += [name] * n
    random.Random(7).shuffle(models)  # the heavy models arrive among the flood, not first
    sc = start_sidecar(metrics_max_models=top_n, metrics_max_series=budget)
    for i in range(0, len(models), 2000):
        resp = post(sc.otlp, _export(export_body, models[i : i + 2000], f"b{i}"))
        assert resp.status_code == 200, resp.text

    sli = sc.sidecar.sli
    assert sli is not None
    wait_for_progress(lambda: sli.counted, len(models), what="requests counted")
    assert sli.counted == len(models)
    t = time.perf_counter()
    text = httpx.get(f"{sc.api}/metrics", timeout=30).text
    took = time.perf_counter() - t
    series = _series(text)
    print(f"/metrics: {len(text)} bytes in {took * 1000:.0f} ms, {len(series)} SLI series")
    assert len(series) <= budget
    assert _total(text, "slokit_label_values_folded_total", label="model") > 0
    own = {s["model"] for s in series}
    assert set(heavy) <= own
    assert len(own - {OTHER}) <= top_n


# -- top-N by traffic -------------------------------------------------------------------------
def test_busy_models_take_the_places_of_a_flood_of_names_that_came_first(
    books: MakeBooks,
) -> None:
    b = books(labels={"model": LabelLimit(10)})
    b.count([f"flood-{i}" for i in range(1000)])
    assert len(b.models() - {OTHER}) == 10
    b.count(["busy-a"] * 50 + ["busy-b"] * 30)
    models = b.models()
    assert {"busy-a", "busy-b"} <= models
    assert len(models - {OTHER}) == 10


def test_a_displaced_value_loses_its_series_and_is_counted_as_other_from_then_on(
    books: MakeBooks,
) -> None:
    b = books(labels={"model": LabelLimit(1)})
    b.count(["old"])
    b.count(["new"] * 20)
    assert b.models() == {"new", OTHER}
    before = _total(b.text(), model=OTHER)
    b.count(["old"])
    assert _total(b.text(), model=OTHER) == before + 1
    assert "old" not in b.models()


def test_recent_traffic_outweighs_old_traffic(books: MakeBooks) -> None:
    b = books(labels={"model": LabelLimit(1)})
    b.count(["yesterday"] * 200)
    b.clock.t += 24 * 3600  # 24 half-lives later its 200 requests weigh almost nothing
    b.count(["today"] * 10)
    assert "today" in b.models()


def test_a_value_with_traffic_like_the_weakest_does_not_churn_the_series(
    books: MakeBooks,
) -> None:
    b = books(labels={"model": LabelLimit(1)})
    b.count(["first"] * 10)
    b.count(["second"] * 15)  # busier, but not twice as busy
    assert b.models() == {"first", OTHER}


def test_every_request_is_counted_once_whatever_is_folded(books: MakeBooks) -> None:
    b = books(labels={"model": LabelLimit(5), "replica": LabelLimit(2)}, max_series=60)
    rng = random.Random(3)
    models = [rng.choice(["m1", "m2"]) if rng.random() < 0.5 else f"x{i}" for i in range(3000)]
    replicas = [f"pod-{rng.randrange(6)}" for _ in models]
    assert b.count(models, replicas) == len(models)
    text = b.text()
    assert _total(text) == len(models)
    assert _total(text, "slokit_output_tokens_total") == 10 * len(models)


# -- allow-lists ------------------------------------------------------------------------------
def test_an_allow_list_keeps_only_the_listed_values(books: MakeBooks) -> None:
    b = books(labels={"model": LabelLimit(allow=frozenset({"a", "b"}))})
    b.count(["a", "b", "c", "d", "a"])
    assert b.models() == {"a", "b", OTHER}
    assert _total(b.text(), "slokit_label_values_folded_total", label="model",
                  reason="not_allowed") == 2  # fmt: skip


# -- the overall series budget ----------------------------------------------------------------
def test_the_series_budget_folds_new_label_sets_into_other(books: MakeBooks) -> None:
    spec = load_spec(SLO)
    reserve = 2 * (len(spec.classes) + 1) * 4  # families x classes (+unclassified) x outcomes
    budget = reserve + 20
    b = books(labels={"model": LabelLimit(1000), "replica": LabelLimit(1000)}, max_series=budget)
    models = [f"m{i}" for i in range(50)] * 4
    replicas = [f"pod-{i % 7}" for i in range(len(models))]
    assert b.count(models, replicas) == len(models)
    text = b.text()
    assert len(_series(text)) <= budget
    assert _total(text) == len(models)
    folded = _total(text, "slokit_label_values_folded_total", reason="series_budget")
    assert folded > 0
    assert _total(text, model=OTHER, replica=OTHER) > 0


def test_a_series_budget_below_what_other_needs_is_refused(books: MakeBooks) -> None:
    with pytest.raises(BadInput, match="metrics_max_series"):
        books(max_series=8)


def test_the_sidecar_refuses_to_start_with_a_series_budget_below_what_other_needs(
    start_sidecar: StartSidecar,
) -> None:
    with pytest.raises(BadInput, match="metrics_max_series"):
        start_sidecar(metrics_max_series=4)


# -- hostile values ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sent", "exported"),
    [
        ("", ""),
        ("x" * (MAX_VALUE_CHARS + 1), OTHER),
        ("x" * 100_000, OTHER),
        ('quote" back\\slash\nnewline', 'quote" back\\slash\nnewline'),
        ("модель/模型 🚀", "модель/模型 🚀"),
        ("} 1\nslokit_injected_total 99", "} 1\nslokit_injected_total 99"),
    ],
    ids=["empty", "one-too-long", "huge", "escapes", "unicode", "injection"],
)
def test_hostile_model_names_are_exported_safely(
    books: MakeBooks, sent: str, exported: str
) -> None:
    b = books()
    b.count([sent, "plain"])
    text = b.text()
    assert {s["model"] for s in _series(text, ("slokit_requests_total",))} == {exported, "plain"}
    assert "slokit_injected_total" not in {f.name for f in text_string_to_metric_families(text)}
    assert len(text) < 20_000


def test_a_finding_on_a_replica_without_a_place_is_exported_as_other(books: MakeBooks) -> None:
    b = books(labels={"replica": LabelLimit(1)})
    b.count(["m"], ["pod-a"])
    assert b.acc.label("replica", "pod-a") == "pod-a"
    assert b.acc.label("replica", "pod-z") == OTHER
    assert _total(b.text(), "slokit_label_values_folded_total") == 0  # a look-up counts nothing


# -- configuration ----------------------------------------------------------------------------
def test_label_budget_keys_come_from_the_environment() -> None:
    cfg = load_config(env={"SLOKIT_METRICS_ALLOW_MODELS": "a, b", "SLOKIT_METRICS_MAX_REPLICAS":
                           "7", "SLOKIT_METRICS_MAX_SERIES": "500"})  # fmt: skip
    limits = label_limits(cfg)
    assert limits["model"].allow == frozenset({"a", "b"})
    assert limits["replica"].max_values == 7
    assert cfg.metrics_max_series == 500


@pytest.mark.parametrize(
    "bad",
    [{"metrics_max_models": 0}, {"metrics_max_series": -1}, {"metrics_max_replicas": "many"}],
    ids=["no-models", "negative-series", "not-a-number"],
)
def test_bad_label_budget_values_are_refused(tmp_path: Path, bad: dict[str, object]) -> None:
    import yaml

    p = tmp_path / "sidecar.yaml"
    p.write_text(yaml.safe_dump(bad))
    with pytest.raises(BadInput):
        load_config(p, env={}).validate()
