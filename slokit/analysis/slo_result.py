"""The result of an SLO report: the report, its cost, and the records it judged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slokit.analysis.cost import CostReport
from slokit.analysis.cost import render_text as render_cost
from slokit.analysis.slo import SloReport, render_text

__all__ = ["SloResult"]


@dataclass(frozen=True)
class SloResult:
    """An SLO report over a window and, when the spec prices GPUs, its cost."""

    report: SloReport
    cost: CostReport | None
    records: list[dict[str, Any]]
    #: ``"records"`` (judged request by request) or ``"counts"`` (from SLI counters alone).
    basis: str = "records"
    #: What a counts-only report cannot say, and why (None for records).
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``slokit slo report --json`` document."""
        doc = self.report.to_json()
        doc["cost"] = self.cost.to_json() if self.cost else None
        if self.note is not None:
            doc["basis"], doc["note"] = self.basis, self.note
        return doc

    def render_text(self) -> str:
        text = render_text(self.report)
        if self.cost is not None:
            text += "\n\n" + render_cost(self.cost)
        return text if self.note is None else text + f"\n\nnote: {self.note}"
