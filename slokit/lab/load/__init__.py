"""The load generator behind ``slokit load``.

Open loop (``rate``): send times are precomputed from the seed (Poisson or constant
spacing) and kept even when the server is slow; a request is sent at its scheduled time
whether or not earlier ones have answered, and how late each send was is recorded
(``send_ts - scheduled_ts``). Closed loop (``users``): N users each send their next
request as soon as the previous one finished.

Every request streams to an OpenAI-compatible ``/v1/completions`` or
``/v1/chat/completions`` and carries ``X-Request-Id: <run>-<seq>`` and a W3C
``traceparent``, so the client record joins the server's spans. Measured on the client:
TTFT (first content chunk), every inter-token gap, E2E, token counts from the final usage
chunk, HTTP status, errors and timeouts. When the duration is reached, sending stops and the
requests in flight get ``drain_s`` to finish; those still running then are cut and recorded
``incomplete`` (error type ``load_end``), apart from failures. With an OTLP endpoint a CLIENT span per request is
exported too; its ids are the ones sent in ``traceparent``. One JSON line per request
(:mod:`slokit.clientlog` defines the format) is written as the run goes and flushed in
small batches; ``slokit ingest requests`` reads these files.

Modules: :mod:`.schedule` (arrival schedules), :mod:`.clock`, :mod:`.config`
(:class:`LoadConfig`), :mod:`.urls`, :mod:`.records` (the client record and its writer),
:mod:`.stream` (an SSE answer into a record), :mod:`.tracing` (client spans),
:mod:`.runner` (:class:`Runner`), :mod:`.stats` (tallies and the summary), :mod:`.run`
(:func:`run_load`), :mod:`.sweep` (:func:`run_sweep`), :mod:`.report` (text output).
"""

from __future__ import annotations

from slokit.clientlog import RECORD_KEYS
from slokit.lab.load.clock import Clock, SystemClock
from slokit.lab.load.config import Endpoint, LoadConfig
from slokit.lab.load.records import RecordWriter
from slokit.lab.load.report import format_progress, format_summary, format_sweep_table
from slokit.lab.load.run import run_load
from slokit.lab.load.runner import LOAD_END, Runner
from slokit.lab.load.schedule import Arrival, constant_schedule, make_schedule, poisson_schedule
from slokit.lab.load.stats import LoadResult, LoadSummary, Progress, ProgressCallback, percentile
from slokit.lab.load.sweep import run_sweep, sweep_out_path
from slokit.lab.load.urls import discover_model, models_url, request_url

__all__ = [
    "LOAD_END",
    "RECORD_KEYS",
    "Arrival",
    "Clock",
    "Endpoint",
    "LoadConfig",
    "LoadResult",
    "LoadSummary",
    "Progress",
    "ProgressCallback",
    "RecordWriter",
    "Runner",
    "SystemClock",
    "constant_schedule",
    "discover_model",
    "format_progress",
    "format_summary",
    "format_sweep_table",
    "make_schedule",
    "models_url",
    "percentile",
    "poisson_schedule",
    "request_url",
    "run_load",
    "run_sweep",
    "sweep_out_path",
]
