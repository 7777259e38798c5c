"""The cyclic garbage collector's schedule for a long-running slokit process (the sidecar).

CPython's default schedule suits short scripts: a young collection every 700 net container
allocations, a full one once ten middle ones have run and the objects that survived since the
last full collection reach a quarter of the old heap. A sidecar allocates in bursts that live
as long as one batch: a parsed scrape (60,000 series make 300,000 containers), a decoded
export, the writer's records. A burst is alive while it is processed, so it survives the young
collections, counts as new old heap and brings the next full collection forward; a full
collection walks every container in the process (modules, classes, metrics, duckdb's and
pyarrow's import-time objects) holding the GIL, so the event loop (``/healthz``, the OTLP
acknowledgements) waits for it. Measured on 1 s scrapes of a 60,000-series target (no sample
limit): about 50 full collections in 16 s, 150-300 ms each; a scrape took 2.1-2.8 s and
``/healthz`` waited up to 164-410 ms. With this schedule: no full collection, a scrape 1.0-1.2 s,
``/healthz`` up to 72-162 ms (the middle collections that remain walk the scrape's records).

:func:`tune_gc` changes two things, nothing else:

- the young threshold goes from 700 to :data:`YOUNG_THRESHOLD` (50,000), and a full collection
  needs :data:`FULL_AFTER` (100) middle ones instead of 10. A batch's records are freed by
  reference counting once the batch is done (they make no cycles), mostly before they count
  towards a collection. The cost is at most one threshold's worth of young garbage held in
  cycles until the next young collection: a few MB;
- with ``freeze=True`` (the sidecar's entry point, once it has started), what startup built
  is moved to the permanent generation (``gc.freeze``): it is still freed by reference counting,
  but collections no longer walk it.

:func:`restore_gc` undoes both (tests that run a sidecar inside their own process).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

__all__ = ["FULL_AFTER", "YOUNG_THRESHOLD", "GcSchedule", "restore_gc", "tune_gc"]

#: Net container allocations between young collections (CPython's default: 700).
YOUNG_THRESHOLD = 50_000
#: Middle collections that make a full one due (CPython's default: 10).
FULL_AFTER = 100


@dataclass(frozen=True)
class GcSchedule:
    """The schedule :func:`tune_gc` replaced, for :func:`restore_gc`."""

    thresholds: tuple[int, int, int]
    froze: bool


def tune_gc(*, freeze: bool = False) -> GcSchedule:
    """Raise the collector's thresholds (never lowers one already higher); with ``freeze``,
    collect once and move every surviving object to the permanent generation."""
    before = gc.get_threshold()
    young, middle, full = before
    gc.set_threshold(max(young, YOUNG_THRESHOLD), middle, max(full, FULL_AFTER))
    if freeze:
        gc.collect()
        gc.freeze()
    return GcSchedule(thresholds=before, froze=freeze)


def restore_gc(schedule: GcSchedule) -> None:
    """Put back the thresholds :func:`tune_gc` replaced; unfreeze what it froze."""
    gc.set_threshold(*schedule.thresholds)
    if schedule.froze:
        gc.unfreeze()
