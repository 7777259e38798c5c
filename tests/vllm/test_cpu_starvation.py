"""cpu_starvation: the check that tells a frontend_bound finding the machine caused (the pod
starved of CPU) from a false alarm, on a fake ``/proc`` and on made-up diagnoses."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from cpu_starvation import LoopWaits, frontend_checks, loops_wait_s, starved_frontends

from slokit.timeutil import iso


def _thread(proc: Path, pid: int, tid: int, wait_ns: int, children: str = "") -> None:
    """A thread's ``/proc`` entries; the main thread's (tid == pid) also as the process's."""
    task = proc / str(pid) / "task" / str(tid)
    task.mkdir(parents=True)
    stat = f"123456 {wait_ns} 789\n"
    (task / "schedstat").write_text(stat)
    (task / "children").write_text(children)
    if tid == pid:
        (proc / str(pid) / "schedstat").write_text(stat)


def test_loops_wait_counts_the_main_threads_of_the_server_and_of_its_children(
    tmp_path: Path,
) -> None:
    _thread(tmp_path, 10, 10, 1_000_000_000, children="20 ")
    _thread(tmp_path, 10, 11, 7_000_000_000)  # a helper thread of the API server: not a loop
    _thread(tmp_path, 20, 20, 500_000_000)  # the engine core
    _thread(tmp_path, 20, 21, 9_000_000_000)  # e.g. a polling thread of the engine core
    assert loops_wait_s(10, tmp_path) == 1.5


def test_loops_wait_of_a_process_that_is_gone_is_zero(tmp_path: Path) -> None:
    assert loops_wait_s(99, tmp_path) == 0.0


def _waits(series: list[tuple[float, float]]) -> LoopWaits:
    """pod-a's loops had waited ``wait`` seconds in all at each ``(time, wait)``."""
    values = iter(series)
    current = [(0.0, 0.0)]

    def clock() -> float:  # the recorder reads its clock, then each pod's waits
        current[0] = next(values)
        return current[0][0]

    recorder = LoopWaits({"pod-a": 1}, clock=clock, read=lambda pid: current[0][1])
    for _ in series:
        recorder.sample()
    return recorder


def test_waited_interpolates_between_samples() -> None:
    waits = _waits([(0.0, 0.0), (10.0, 1.0), (20.0, 3.0)])
    assert waits.waited_s("pod-a", 5.0, 15.0) == 1.5


def test_sample_reads_every_pod_at_the_clocks_time() -> None:
    reads = iter([0.25, 0.5])
    waits = LoopWaits({"pod-a": 1, "pod-b": 2}, clock=lambda: 7.0, read=lambda pid: next(reads))
    waits.sample()
    assert waits.samples == {"pod-a": [(7.0, 0.25)], "pod-b": [(7.0, 0.5)]}


def _doc(rise_s: float) -> dict[str, Any]:
    """A diagnosis with one frontend_bound finding on pod-a: baseline [0, 40) with 80
    requests and 5 ms of frontend time, episode [40, 60) with 40 requests."""
    return {
        "window": {"baseline": {"since": iso(0.0), "until": iso(40.0)}},
        "findings": [
            {
                "id": "frontend_bound@pod-a",
                "rule": "frontend_bound",
                "replica": "pod-a",
                "start": iso(40.0),
                "end": iso(60.0),
                "evidence": {
                    "baseline": {"n": 80, "frontend_mean": 0.005},
                    "episode": {"n": 40, "frontend_mean": 0.005 + rise_s},
                },
            },
            {"id": "telemetry_gap", "rule": "telemetry_gap", "replica": None},
        ],
    }


#: 0.4 s of waiting in the baseline (5 ms per request), then 0.6 s in the episode (15 ms).
_RUN = [(0.0, 0.0), (40.0, 0.4), (60.0, 1.0)]


def test_a_rise_the_episodes_waiting_covers_half_of_is_confirmed() -> None:
    # 15 ms of waiting per request covers half of a 29 ms rise
    assert starved_frontends(_doc(0.029), _waits(_RUN)) == {"frontend_bound@pod-a"}


def test_a_rise_more_than_twice_the_episodes_waiting_is_not_confirmed() -> None:
    assert starved_frontends(_doc(0.031), _waits(_RUN)) == set()


def test_a_baseline_that_waited_longer_does_not_hide_the_episodes_waiting() -> None:
    # 2.4 s in the baseline (30 ms per request), 0.6 s in the episode (15 ms per request)
    eased = [(0.0, 0.0), (40.0, 2.4), (60.0, 3.0)]
    assert starved_frontends(_doc(0.01), _waits(eased)) == {"frontend_bound@pod-a"}


def test_loops_that_barely_waited_confirm_nothing() -> None:
    quiet = [(0.0, 0.0), (40.0, 0.04), (60.0, 0.08)]  # 1 ms per request in the episode
    assert starved_frontends(_doc(0.01), _waits(quiet)) == set()


def test_the_check_reports_its_figures() -> None:
    (check,) = frontend_checks(_doc(0.019), _waits(_RUN))
    assert check["wait_per_request_s"] == pytest.approx({"baseline": 0.005, "episode": 0.015})
    assert check["frontend_rise_s"] == pytest.approx(0.019)
    assert check["confirmed"] is True


def test_sample_until_samples_until_stopped_and_once_more() -> None:
    stop = asyncio.Event()
    reads: list[int] = []

    def read(pid: int) -> float:
        reads.append(pid)
        if len(reads) == 3:
            stop.set()
        return 0.0

    asyncio.run(LoopWaits({"pod-a": 1}, read=read).sample_until(stop, every_s=0.0))
    assert len(reads) == 4
