"""Was a pod starved of CPU while a ``frontend_bound`` finding says its frontend slowed?

On a machine whose cores other work keeps busy (CI shares them), vLLM's request loops wait
for a CPU like a container at its CPU limit, and the time outside the engine rises: a true
frontend-bound incident, not a false alarm of the scenario under test. The kernel says how
long a process's main thread was runnable but waiting for a CPU (``/proc/PID/schedstat``, its
second field). :class:`LoopWaits` samples that, during a run, for the two loops every
request passes through before its first token:

- the API server's main thread: its event loop reads the request, tokenizes it, hands it to
  the engine and turns the engine's outputs into tokens and spans;
- the engine core's main thread (the API server's child process): its busy loop picks the
  request up from its input queue, schedules it and runs the model. A request that arrives
  while this loop waits for a CPU waits in the queue before vLLM stamps it QUEUED, which is
  time outside the engine in vLLM's span.

:func:`starved_frontends` confirms a ``frontend_bound`` finding when, per request of the
finding's episode, those loops waited for a CPU at least half the rise in frontend time the
finding reports: the starvation alone could then account for the rise, and the run cannot
tell it from a rule that misfired. The baseline's waiting is reported, not subtracted: the
other work on the machine comes and goes, so a baseline can wait longer than the episode
(32 ms against 19 ms per request in one CI run, with a rise in frontend time all the same)
and is no reference for what the episode's waiting added. The check is loose where the
machine is small: on 2 cores, two servers and the load alone make those loops wait 10-20 ms
per request, so a rise under about 40 ms is confirmed whatever its cause (docs/diagnose.md,
"The same incidents on real vLLM").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from slokit.timeutil import parse_time

#: The share of a finding's rise in frontend time that the loops' waiting during its
#: episode must cover.
CONFIRM_SHARE = 0.5


def _children(pid: int, proc: Path) -> list[int]:
    """The child processes of ``pid`` (each of its threads' ``children``: cheaper than the
    scan of all of ``/proc`` that slokit.lab.vllm_server.process_tree_rss_bytes makes)."""
    out: list[int] = []
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def _main_thread_wait_s(pid: int, proc: Path) -> float:
    try:
        return int((proc / str(pid) / "schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def loops_wait_s(pid: int, proc: Path = Path("/proc")) -> float:
    """Seconds the main threads of ``pid`` (vLLM's API server) and of its child processes
    (the engine core) have spent runnable but waiting for a CPU; 0 where the kernel does
    not say."""
    return sum(_main_thread_wait_s(p, proc) for p in (pid, *_children(pid, proc)))


@dataclass
class LoopWaits:
    """Per pod, samples of (time, :func:`loops_wait_s`) over a run (:meth:`sample` every
    second or so; the cumulative wait is interpolated between samples)."""

    pids: Mapping[str, int]
    clock: Callable[[], float] = time.time
    read: Callable[[int], float] = loops_wait_s
    samples: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def sample(self) -> None:
        now = self.clock()
        for pod, pid in self.pids.items():
            self.samples.setdefault(pod, []).append((now, self.read(pid)))

    async def sample_until(self, stop: asyncio.Event, every_s: float = 1.0) -> None:
        """:meth:`sample` every ``every_s`` until ``stop`` is set, and once more then."""
        while not stop.is_set():
            self.sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)
        self.sample()

    def waited_s(self, pod: str, since: float, until: float) -> float:
        """Seconds the pod's loops waited for a CPU over [since, until)."""
        got = self.samples.get(pod, [])
        if len(got) < 2:
            return 0.0
        ts, cum = np.array(got).T
        start, end = np.interp([since, until], ts, cum)
        return float(end - start)


def frontend_checks(doc: dict[str, Any], waits: LoopWaits) -> list[dict[str, Any]]:
    """Per ``frontend_bound`` finding of ``doc`` (a diagnosis): its rise in frontend time,
    the seconds per request the pod's loops waited for a CPU during the baseline and during
    the finding's episode, and whether the episode's waiting covers :data:`CONFIRM_SHARE`
    of the rise."""
    base = doc["window"]["baseline"]
    out = []
    for f in doc["findings"]:
        if f["rule"] != "frontend_bound":
            continue
        ev, pod = f["evidence"], f["replica"]
        rise = (ev["episode"]["frontend_mean"] or 0.0) - (ev["baseline"]["frontend_mean"] or 0.0)
        per_request = [
            waits.waited_s(pod, parse_time(since), parse_time(until)) / max(1, n or 0)
            for since, until, n in (
                (base["since"], base["until"], ev["baseline"]["n"]),
                (f["start"], f["end"], ev["episode"]["n"]),
            )
        ]
        out.append(
            {
                "id": f["id"],
                "frontend_rise_s": rise,
                "wait_per_request_s": {"baseline": per_request[0], "episode": per_request[1]},
                "confirmed": per_request[1] >= CONFIRM_SHARE * rise,
            }
        )
    return out


def starved_frontends(doc: dict[str, Any], waits: LoopWaits) -> set[str]:
    """The ids of the ``frontend_bound`` findings of ``doc`` that the kernel confirms: per
    request of the finding's episode, the pod's loops waited for a CPU at least
    :data:`CONFIRM_SHARE` of the finding's rise in frontend time (:func:`frontend_checks`)."""
    return {c["id"] for c in frontend_checks(doc, waits) if c["confirmed"]}
