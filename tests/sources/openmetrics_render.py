"""A Prometheus text exposition re-rendered as OpenMetrics 1.0, as the same server would answer
``Accept: application/openmetrics-text`` (prometheus_client 0.26, what vLLM 0.32 serves with).

The text format writes each counter's and histogram's start time as a ``*_created`` gauge
family of its own; a live registry holds it in the metric itself, and OpenMetrics writes it as
the metric point's last sample. The families are parsed, each ``*_created`` gauge is folded
back into its metric (after the samples of its label set), and the registry rebuilt from them
is rendered with ``prometheus_client.openmetrics.exposition.generate_latest``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Sample

_WITH_CREATED = ("counter", "histogram", "summary")


def _point(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in ("le", "quantile")))


def _fold_created(metric: Metric, created: Metric) -> None:
    starts = {_point(s.labels): s for s in created.samples}
    out: list[Sample] = []
    for i, s in enumerate(metric.samples):
        out.append(s)
        nxt = metric.samples[i + 1] if i + 1 < len(metric.samples) else None
        point = _point(s.labels)
        if (nxt is None or _point(nxt.labels) != point) and point in starts:
            c = starts.pop(point)
            out.append(Sample(metric.name + "_created", c.labels, c.value))
    assert not starts, f"{created.name}: start times without a metric point"
    metric.samples = out


class _Replay(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


def openmetrics_of(text: str) -> str:
    """``text`` (Prometheus text 0.0.4 from prometheus_client) as OpenMetrics 1.0."""
    metrics = list(text_string_to_metric_families(text))
    by_name = {m.name: m for m in metrics}
    folded: set[str] = set()
    for m in metrics:
        created = by_name.get(m.name + "_created")
        if m.type in _WITH_CREATED and created is not None and created.type == "gauge":
            _fold_created(m, created)
            folded.add(created.name)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Replay([m for m in metrics if m.name not in folded]))
    return generate_latest(registry).decode()
