"""SLO evaluation: classify requests, attainment, burn rate, goodput, latency percentiles.

The spec itself (YAML, ``slokit: v1``) is loaded and validated by
:mod:`slokit.analysis.slo_spec`; this module judges merged ``requests`` records against it.

Outcome of one request (:func:`classify`), first rule that applies:

``incomplete``
    ``status`` is ``incomplete``: the request was still in flight when a load test ended
    (``slokit load`` cut it after its drain, GuideLLM's ``incomplete``, AIPerf's
    ``was_cancelled``). It is neither good nor bad: it is counted apart and left out of
    attainment, burn rate, goodput and percentiles, as the load tools do. A run cut heavily
    at its end therefore reads better than it was; the report shows how many were cut.
``error``
    ``status`` is not ``ok`` (error, timeout, cancelled, rejected, or no status at all: a
    request nobody saw finish is not good).
``quality_fail``
    ``quality_pass`` is False and the spec sets ``quality.require_pass`` (a correctness
    failure outranks slowness). Unknown quality (NULL) is not a failure.
``slow``
    it finished ok but missed a ``good_when`` bound of its class. A bound whose
    measurement is missing counts as **not met** (the request could not be shown to be
    good); such requests are counted per bound as ``unmeasurable``. One exception, as in
    vLLM's ``bench serve`` goodput: TPOT is undefined for a request with at most one output
    token, and such a request meets any TPOT bound (vLLM takes its TPOT as 0).
``good``
    otherwise.

Measurements: TTFT is the client's (``client_ttft_s``) when present, else the server's
(``ttft_s``); E2E likewise (``client_e2e_s`` else ``e2e_s``); TPOT is ``tpot_s``, i.e.
``(e2e - ttft) / (output_tokens - 1)``; ITL is each request's own p95 inter-token gap
(``itl_p95_s``, the store keeps no per-token gaps), so "ITL p99" is the p99 over requests
of their p95 gap.

Attainment = good / judged requests of the class (every outcome but ``incomplete``). Burn
rate over a window = (1 - attainment) / (1 - objective): 1 spends the error budget exactly
over the SLO period, 14.4 spends 2% of a 30-day budget in an hour.

Two goodputs, never to be confused:

* **observed goodput** (``observed_goodput``): what the run delivered, good requests per
  second and output tokens of good requests per second, over the window's duration.
* **max goodput** (``max_goodput``, DistServe): from a rate sweep, the highest offered
  arrival rate at which every class still meets its objective. Sweep steps are told apart
  by run (``slokit load`` names requests ``<run-id>-<seq>``; ``--sweep`` gives each rate its
  own run id) or by fixed time windows.

Windows: a request belongs to ``[since, until)`` by its ``arrival_ts``; with no window,
all records are used and the duration is the data's own span (first arrival to last
finish), never wall-clock now.
"""

from __future__ import annotations

from slokit.analysis.slo._classify import (
    BURN_WINDOWS_S,
    INCOMPLETE,
    LATENCY_METRICS,
    OUTCOMES,
    PERCENTILES,
    UNCLASSIFIED,
    bound_results,
    classify,
    measurement,
    sli_labels,
)
from slokit.analysis.slo._render import (
    render_text,
)
from slokit.analysis.slo._report import (
    GroupReport,
    SloReport,
    burn_rate,
    evaluate,
    fmt_window,
)
from slokit.analysis.slo._stats import (
    Percentile,
    latency_percentiles,
    quantile,
    quantile_ci,
)
from slokit.analysis.slo._sweep import (
    MaxGoodput,
    SweepPoint,
    max_goodput,
    run_of,
    sweep_points,
)
from slokit.analysis.slo._window import (
    Window,
    in_window,
    resolve_window,
)

__all__ = [
    "BURN_WINDOWS_S",
    "INCOMPLETE",
    "LATENCY_METRICS",
    "OUTCOMES",
    "PERCENTILES",
    "UNCLASSIFIED",
    "GroupReport",
    "MaxGoodput",
    "Percentile",
    "SloReport",
    "SweepPoint",
    "Window",
    "bound_results",
    "burn_rate",
    "classify",
    "evaluate",
    "fmt_window",
    "in_window",
    "latency_percentiles",
    "max_goodput",
    "measurement",
    "quantile",
    "quantile_ci",
    "render_text",
    "resolve_window",
    "run_of",
    "sli_labels",
    "sweep_points",
]
