"""PromQL building blocks shared by the dashboard and alert generators.

``Labels`` names the Prometheus labels that identify a replica: vLLM and dcgm-exporter do
not name the pod themselves, the scrape does (a PodMonitor adds ``pod``; dcgm-exporter's
Kubernetes mapping adds ``pod`` to each GPU's series, or ``exported_pod`` when the
ServiceMonitor does not honor labels). slokit's own series carry ``replica``.

The rest turns a Grafana dashboard back into plain PromQL: every panel's expressions with
the template variables replaced by concrete values, so that promtool can parse them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from slokit.errors import BadInput

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True)
class Labels:
    """Which label names a replica on vLLM series and on DCGM series."""

    replica: str = "pod"
    gpu_replica: str = "pod"

    def __post_init__(self) -> None:
        for name in (self.replica, self.gpu_replica):
            if not _LABEL_NAME.match(name):
                raise BadInput(f"not a Prometheus label name: {name!r}")


def selector(matchers: Mapping[str, str]) -> str:
    """``{"pod": "=~$replica", "bound": "ttft"}`` -> ``{pod=~"$replica",bound="ttft"}``.

    A value starting with an operator (``=~``, ``!~``, ``!=``, ``=``) keeps it; otherwise
    ``=``: pass ``"=" + value`` for a value that may itself start with one. The value is
    quoted as a PromQL string literal (:func:`quote`).
    """
    parts = []
    for name, value in matchers.items():
        op = "="
        for candidate in ("=~", "!~", "!=", "="):
            if value.startswith(candidate):
                op, value = candidate, value[len(candidate) :]
                break
        parts.append(f"{name}{op}{quote(value)}")
    return "{" + ",".join(parts) + "}"


def quote(value: str) -> str:
    """A PromQL double-quoted string literal (Go's escapes): ``a"b`` -> ``"a\\"b"``; control
    characters become ``\\n``, ``\\t``, ... or ``\\xNN``, which promtool reads back as is."""
    return '"' + value.translate(_ESCAPES) + '"'


_ESCAPES: dict[int, str] = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F]}
_ESCAPES.update(
    {ord("\\"): "\\\\", ord('"'): '\\"', ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}
)


#: Concrete stand-ins for Grafana's variables, used to check expressions outside Grafana.
DEFAULT_SUBSTITUTIONS: dict[str, str] = {
    "__rate_interval": "1m",
    "__interval": "30s",
    "__range": "1h",
    "replica": ".*",
    "model": ".*",
    "class": ".*",
}

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def substitute(expr: str, values: Mapping[str, str] = DEFAULT_SUBSTITUTIONS) -> str:
    """Replace ``$name`` and ``${name}`` with ``values[name]``; unknown variables are an error."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no substitution for dashboard variable ${name} in {expr!r}")
        return values[name]

    return _VARIABLE.sub(repl, expr)


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref_id: str
    expr: str


def panel_queries(dashboard: Mapping[str, Any]) -> Iterator[PanelQuery]:
    """Every Prometheus expression of a dashboard's panels (rows included), in order."""
    title = str(dashboard.get("title", ""))

    def walk(panels: list[Any]) -> Iterator[PanelQuery]:
        for panel in panels:
            for target in panel.get("targets") or []:
                expr = target.get("expr")
                if expr:
                    yield PanelQuery(
                        title, str(panel.get("title", "")), str(target.get("refId", "")), expr
                    )
            yield from walk(panel.get("panels") or [])

    yield from walk(list(dashboard.get("panels") or []))


def check_rule_file(
    queries: list[PanelQuery], values: Mapping[str, str] = DEFAULT_SUBSTITUTIONS
) -> dict[str, Any]:
    """A throwaway rule file holding each query as a recording rule, for ``promtool check rules``."""
    rules = [
        {"record": f"slokit_check:panel_{i}", "expr": substitute(q.expr, values)}
        for i, q in enumerate(queries)
    ]
    return {"groups": [{"name": "dashboard-queries", "rules": rules}]}
