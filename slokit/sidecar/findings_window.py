"""Which window the sidecar's periodic diagnosis looks at.

Normally the newest ``window_s`` (15 minutes) of data, judged against the hour before it (the
diagnosis's baseline, :mod:`slokit.analysis.rules._context`). A window that slides on its own
would let a long incident become its own baseline: 15 minutes in, the hour before the window
starts to hold the incident, and a few minutes later the rules see nothing unusual and its
findings stop, while the incident goes on. So while findings are still going on (one ended
within ``ongoing_s`` of the newest data), the window starts when the earliest of them began,
and the baseline stays the hour before the incident: for up to ``hold_s``, after which the
window slides again (an incident that long has become what the baseline is).

"Newest" is the newest data up to the sidecar's own clock (plus :data:`FUTURE_SLACK_S`): a
span stamped hours ahead (a client whose clock is wrong, or that stamps local time as UTC;
spans up to a day ahead are accepted) would otherwise move the window to its own time, where
nothing else is, and blind the findings until the sidecar's clock caught up with it.

"Oldest" is the oldest data, or ``requests_from`` where retention deleted the requests before
it: the store keeps its newest ``retention_requests`` (150,000: 12.5 minutes at 200 req/s)
while the engine and GPU samples go back a day, so a window and baseline placed by the
samples alone would compare the window's requests with a baseline that has none left, and the
request rules would go blind on every busy pod. The window and its baseline then share the
requests the store still holds (``run_diagnosis(requests_from=...)``).
"""

from __future__ import annotations

from slokit.store.reader import Reader

__all__ = [
    "FINDINGS_HOLD_S",
    "FINDINGS_WINDOW_S",
    "FUTURE_SLACK_S",
    "diagnosis_since",
    "diagnosis_window",
]

#: How far back the periodic diagnosis looks from the newest data.
FINDINGS_WINDOW_S = 900.0
#: How long an incident still going on holds the window's start at its own.
FINDINGS_HOLD_S = 7200.0
#: Data stamped up to this much after the sidecar's clock counts as now (other hosts' clocks
#: drift by seconds); later data waits until the clock reaches it.
FUTURE_SLACK_S = 60.0


def diagnosis_window(
    reader: Reader,
    now: float,
    *,
    ongoing_s: float,
    window_s: float = FINDINGS_WINDOW_S,
    hold_s: float = FINDINGS_HOLD_S,
    requests_from: float | None = None,
) -> tuple[float | None, float] | None:
    """``(since, until)`` for the diagnosis at ``now`` (the sidecar's clock): ``until`` the
    newest data, or ``now`` where the newest is more than ``FUTURE_SLACK_S`` ahead of it;
    ``since`` as :func:`diagnosis_since` picks it, from ``requests_from`` on where that is
    later than the oldest data. None when the store holds no data up to then."""
    oldest, newest = reader.bounds()
    if oldest is None or newest is None:
        return None
    if requests_from is not None:
        oldest = max(oldest, requests_from)
    # data from a clock well ahead of ours: the window ends at ours instead
    until = newest if newest <= now + FUTURE_SLACK_S else now
    if oldest >= until:
        return None
    since = diagnosis_since(reader, oldest, until, ongoing_s=ongoing_s, window_s=window_s,
                            hold_s=hold_s)  # fmt: skip
    return since, until


def diagnosis_since(
    reader: Reader,
    oldest: float,
    newest: float,
    *,
    ongoing_s: float,
    window_s: float = FINDINGS_WINDOW_S,
    hold_s: float = FINDINGS_HOLD_S,
) -> float | None:
    """The window's start (None: all the data, when there is no more than a window of it,
    so that the rules' baseline is the data's first part)."""
    if oldest >= newest - window_s:
        return None
    since = newest - window_s
    ongoing = reader.findings(newest - ongoing_s, None, limit=1000)
    began = min((float(f["start"]) for f in ongoing), default=since)
    if began < since:
        since = max(began, newest - hold_s)
        if since <= oldest:  # the incident since the data began: no history to judge it by
            return None
    return since
