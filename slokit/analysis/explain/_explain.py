"""The steps of explaining one request, from its record to the :class:`Explanation`."""

from __future__ import annotations

from typing import Any

from slokit.analysis.explain._cause import cause, choose_runbook, is_unusual, root_cause
from slokit.analysis.explain._components import components, dominant, gateway_view, timeline
from slokit.analysis.explain._context import gather
from slokit.analysis.explain._model import Explanation, Tokens
from slokit.analysis.explain._options import ExplainOptions
from slokit.analysis.explain._slo import judge
from slokit.analysis.slo_spec import SloSpec
from slokit.errors import NotFound
from slokit.ids import checked_request_id
from slokit.store.reader import Reader


def explain(
    reader: Reader,
    request_id: str,
    *,
    spec: SloSpec | None = None,
    options: ExplainOptions | None = None,
) -> Explanation:
    """Explain one request (either id form: ``r24`` or ``cmpl-r24-0``). Raises NotFound, or
    :class:`~slokit.ids.InvalidRequestId` (BadInput) for an id no request can have (empty
    once normalized, too long, control characters: ingest refuses those)."""
    opt = options or ExplainOptions()
    checked_request_id(request_id)
    rec = reader.request(request_id)
    if rec is None:
        shown = request_id if len(request_id) <= 80 else request_id[:80] + "..."
        raise NotFound(f"no request {shown!r} in the store")
    comps = components(rec)
    found = gather(reader, rec, comps, opt)
    dom = dominant(comps, found.preempted)
    slo = judge(rec, spec)
    unusual = is_unusual(found.context, slo, opt)
    root = root_cause(found.linked, dom)
    runbook = choose_runbook(found.findings, dom, unusual, root)
    actionable = any(f.actionable for f in found.findings)
    return Explanation(
        request_id=rec["request_id"],
        trace_id=rec.get("trace_id"),
        replica=rec.get("replica"),
        model=rec.get("model"),
        slo_class=rec.get("slo_class"),
        status=rec.get("status"),
        sources=tuple(rec["sources"]),
        tokens=Tokens(
            prompt_tokens=rec.get("prompt_tokens"),
            output_tokens=rec.get("output_tokens"),
            cached_tokens=rec.get("cached_tokens"),
            max_tokens=rec.get("max_tokens"),
        ),
        timeline=timeline(rec),
        components=comps,
        dominant=dom,
        cause=cause(
            rec,
            comps,
            dom,
            found.context,
            runbook,
            typical=not unusual and not actionable,
            root=root,
        ),
        context=found.context,
        findings=found.findings,
        slo=slo,
        runbook=runbook,
        unknown=found.unknown,
        root_cause=root,
        gateway=gateway_view(rec, comps),
    )


def explain_request(
    reader: Reader,
    request_id: str,
    *,
    spec: SloSpec | None = None,
    options: ExplainOptions | None = None,
) -> dict[str, Any]:
    """The explain document for one request (docs/schema/explain.schema.json). Raises NotFound."""
    return explain(reader, request_id, spec=spec, options=options).to_dict()
