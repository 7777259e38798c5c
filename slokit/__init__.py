"""slokit: observability and SLO toolkit for LLM inference serving.

The library behind the ``slokit`` command. Each job reads a *source*: a slokit DuckDB file's
path, an open :class:`Store`, or any :class:`Reader`::

    import slokit

    diagnosis = slokit.diagnose("slokit.duckdb", since="15m")
    for finding in diagnosis.findings:
        print(finding.severity, finding.rule, finding.summary)
    print(slokit.explain("slokit.duckdb", "r24").cause)
    print(slokit.slo_report("slokit.duckdb", "slo.yaml").render_text())

Jobs: :func:`diagnose`, :func:`explain`, :func:`slo_report`, :func:`html_report`,
:func:`gate`. Data: :func:`open_store`, :class:`Store`, :class:`Reader`,
:class:`LocalReader`, :func:`window` / :class:`Window`, :func:`load_spec`.
Results are dataclasses; ``to_dict()`` gives the JSON document the CLI prints.

Names load on first use, so ``import slokit`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it (imported on first use).
_EXPORTS: dict[str, str] = {
    "diagnose": "slokit._jobs",
    "explain": "slokit._jobs",
    "slo_report": "slokit._jobs",
    "html_report": "slokit._jobs",
    "gate": "slokit._jobs",
    "window": "slokit._jobs",
    "load_spec": "slokit._jobs",
    "open_store": "slokit._jobs",
    "SloResult": "slokit.analysis.slo_result",
    "HtmlReport": "slokit._jobs",
    "Diagnosis": "slokit.analysis.diagnose",
    "DiagnoseOptions": "slokit.analysis.rules._context",
    "Explanation": "slokit.analysis.explain",
    "ExplainOptions": "slokit.analysis.explain",
    "Finding": "slokit.records",
    "SloSpec": "slokit.analysis.slo_spec",
    "SloReport": "slokit.analysis.slo",
    "CostReport": "slokit.analysis.cost",
    "GateResult": "slokit.analysis.gate",
    "Store": "slokit.store.db",
    "Reader": "slokit.store.reader",
    "LocalReader": "slokit.store.reader",
    "Window": "slokit.store.window",
    "BadInput": "slokit.errors",
    "NotFound": "slokit.errors",
    "SlokitError": "slokit.errors",
}

__all__ = [
    "BadInput",
    "CostReport",
    "DiagnoseOptions",
    "Diagnosis",
    "ExplainOptions",
    "Explanation",
    "Finding",
    "GateResult",
    "HtmlReport",
    "LocalReader",
    "NotFound",
    "Reader",
    "SloReport",
    "SloResult",
    "SloSpec",
    "SlokitError",
    "Store",
    "Window",
    "diagnose",
    "explain",
    "gate",
    "html_report",
    "load_spec",
    "open_store",
    "slo_report",
    "window",
]

if TYPE_CHECKING:
    from slokit._jobs import (
        HtmlReport,
        diagnose,
        explain,
        gate,
        html_report,
        load_spec,
        open_store,
        slo_report,
        window,
    )
    from slokit.analysis.cost import CostReport
    from slokit.analysis.diagnose import Diagnosis
    from slokit.analysis.explain import ExplainOptions, Explanation
    from slokit.analysis.gate import GateResult
    from slokit.analysis.rules._context import DiagnoseOptions
    from slokit.analysis.slo import SloReport
    from slokit.analysis.slo_result import SloResult
    from slokit.analysis.slo_spec import SloSpec
    from slokit.errors import BadInput, NotFound, SlokitError
    from slokit.records import Finding
    from slokit.store.db import Store
    from slokit.store.reader import LocalReader, Reader
    from slokit.store.window import Window


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'slokit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
