"""The simulator's text exposition: prometheus_client's ``generate_latest``, byte for byte, at
a fraction of its cost.

vLLM (and dcgm-exporter's format, as the simulator writes it) answers ``/metrics`` with
prometheus_client's ``generate_latest``: the simulator must too. That function formats every
series' name and labels again on every scrape (escaping and validating each label name), which
is most of a simulated replica's CPU under 1 s scrapes. :class:`TextExposition` formats each
series' ``name{labels}`` and each family's ``# HELP``/``# TYPE`` lines once, *with
generate_latest itself* (a one-series registry), and on a scrape only looks them up and
formats the values. So the text is generate_latest's by construction, whatever version of
prometheus_client is installed; a sample with a timestamp (which the simulator never writes)
is formatted in full each time.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

__all__ = ["TextExposition"]

#: Samples generate_latest moves out of their family into a gauge family of their own, after
#: it, in this order (it sorts the suffixes).
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")


class _One(Collector):
    """A registry of one family (what generate_latest is given to format one piece)."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterable[Metric]:
        return [self.metric]


def _render(metric: Metric) -> list[str]:
    """generate_latest's lines for one family, each with its line feed."""
    return generate_latest(_One(metric)).decode("utf-8").splitlines(keepends=True)


class TextExposition:
    """``render()`` is ``generate_latest(registry)``; series and families seen before cost a
    dictionary look-up. The caches grow with the series a registry has ever had (a simulated
    replica's: a few hundred)."""

    def __init__(self, registry: Collector) -> None:
        self.registry = registry
        self._heads: dict[tuple[str, str, str], str] = {}
        self._om_heads: dict[tuple[str, str], str] = {}
        self._prefixes: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}

    def render(self) -> bytes:
        out: list[str] = []
        for metric in self.registry.collect():
            out.append(self._head(metric))
            om: dict[str, list[str]] = {}
            for s in metric.samples:
                for suffix in _OM_SUFFIXES:
                    if s.name == metric.name + suffix:
                        om.setdefault(suffix, []).append(self._line(s))
                        break
                else:
                    out.append(self._line(s))
            for suffix, lines in sorted(om.items()):
                out.append(self._om_head(metric, suffix))
                out.extend(lines)
        return "".join(out).encode("utf-8")

    def _head(self, metric: Metric) -> str:
        key = (metric.name, metric.type, metric.documentation)
        head = self._heads.get(key)
        if head is None:
            family = Metric(metric.name, metric.documentation, metric.type)
            head = self._heads[key] = "".join(_render(family))
        return head

    def _om_head(self, metric: Metric, suffix: str) -> str:
        """The ``# HELP``/``# TYPE`` lines of the gauge family generate_latest makes of a
        family's ``suffix`` samples."""
        key = (metric.name + suffix, metric.documentation)
        head = self._om_heads.get(key)
        if head is None:
            probe = Metric(metric.name, metric.documentation, "gauge")
            probe.add_sample(metric.name + suffix, {}, 0.0)
            lines = _render(probe)  # the family's head, then the suffix family's, its sample
            head = self._om_heads[key] = "".join(lines[2:4])
        return head

    def _line(self, s: Sample) -> str:
        if s.timestamp is not None:
            return self._sample_text(s)
        key = (s.name, tuple(s.labels.items()))
        prefix = self._prefixes.get(key)
        if prefix is None:
            text = self._sample_text(s._replace(value=0.0))
            if not text.endswith(" 0.0\n"):  # not the line shape this relies on
                return self._sample_text(s)
            prefix = self._prefixes[key] = text[: -len("0.0\n")]
        return f"{prefix}{floatToGoString(s.value)}\n"

    @staticmethod
    def _sample_text(s: Sample) -> str:
        """generate_latest's line for one sample, in a family whose name it cannot match."""
        probe = Metric(s.name + "_probe_", "", "unknown")
        probe.samples.append(s)
        return _render(probe)[2]
