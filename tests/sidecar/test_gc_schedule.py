"""The sidecar's collector schedule (slokit._gc): a huge scrape's parse brings on no full
collection, which would walk the whole process holding the GIL while /healthz waits."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from slokit._gc import FULL_AFTER, YOUNG_THRESHOLD, restore_gc, tune_gc

#: Counts collections by generation while a callable runs, printed as JSON (run in a fresh
#: process: the default schedule's full collections depend on the size of the old heap).
COUNT = """
import gc, json, sys
from slokit._gc import tune_gc
from slokit.sources.vllm_metrics import parse_vllm_metrics
body = "".join(f'vllm:num_requests_running{{engine="0",model_name="m{i}"}} 1.0\\n'
               for i in range(60_000)).encode()
if sys.argv[1] == "tuned":
    tune_gc(freeze=True)
gc.collect()
seen = [0, 0, 0]
gc.callbacks.append(lambda phase, info: phase == "stop" and seen.__setitem__(
    info["generation"], seen[info["generation"]] + 1))
samples = parse_vllm_metrics(body, ts=1.0, replica="r")
assert len(samples) == 60_000
print(json.dumps(seen))
"""


@pytest.fixture
def default_schedule() -> Iterator[None]:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def _collections(schedule: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", COUNT, schedule], capture_output=True,
                         text=True, timeout=300, check=True)  # fmt: skip
    return list(json.loads(out.stdout))


def test_tune_gc_raises_the_young_and_full_thresholds_and_restore_puts_them_back(
    default_schedule: None,
) -> None:
    schedule = tune_gc()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, FULL_AFTER)
    restore_gc(schedule)
    assert gc.get_threshold() == (700, 10, 10)


def test_tune_gc_never_lowers_a_threshold_set_higher(default_schedule: None) -> None:
    gc.set_threshold(YOUNG_THRESHOLD * 2, 5, FULL_AFTER * 3)
    tune_gc()
    assert gc.get_threshold() == (YOUNG_THRESHOLD * 2, 5, FULL_AFTER * 3)


def test_freeze_takes_what_exists_out_of_the_collections_until_restored() -> None:
    assert gc.get_freeze_count() == 0
    schedule = tune_gc(freeze=True)
    try:
        assert gc.get_freeze_count() > 1000  # this process's modules, classes, functions...
    finally:
        restore_gc(schedule)
    assert gc.get_freeze_count() == 0


def test_a_60k_series_parse_brings_on_full_collections_under_pythons_default() -> None:
    """The contrast that shows the count below can see one."""
    assert _collections("default")[2] >= 1


def test_a_60k_series_parse_brings_on_no_full_collection_under_the_sidecars_schedule() -> None:
    young, _, full = _collections("tuned")
    assert young >= 1  # the parse did bring on collections (and the count saw them)
    assert full == 0
