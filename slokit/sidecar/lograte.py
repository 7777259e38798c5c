"""A logging filter that collapses repeated lines, so nothing hostile can flood the log.

Each distinct message (logger, level and the message *template*, before its arguments) goes
through at most ``burst`` times per ``window_s``; the rest are counted and dropped. The next
line of that kind let through after the window says how many were suppressed. One bad actor
therefore costs a few lines per window, not a line (with a traceback) per request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass
class _Window:
    start: float
    passed: int = 0
    suppressed: int = 0


class RateLimitFilter(logging.Filter):
    """Let each kind of record through ``burst`` times per ``window_s``; count the rest."""

    def __init__(
        self,
        burst: int = 5,
        window_s: float = 10.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_kinds: int = 1024,
    ) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self.clock = clock
        self.max_kinds = max_kinds
        self._windows: dict[tuple[str, int, str], _Window] = {}
        #: Records dropped since the filter was made (all kinds).
        self.suppressed_total = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        kind = (record.name, record.levelno, str(record.msg)[:200])
        w = self._windows.get(kind)
        if w is None or now - w.start >= self.window_s:
            if w is None and len(self._windows) >= self.max_kinds:
                self._prune(now)
            carried = w.suppressed if w is not None else 0
            w = self._windows[kind] = _Window(start=now)
            if carried:
                # Appended text holds no "%", so the record's %-arguments still format.
                record.msg = f"{record.msg} [{carried} similar lines suppressed]"
        w.passed += 1
        if w.passed <= self.burst:
            return True
        w.suppressed += 1
        self.suppressed_total += 1
        return False

    def _prune(self, now: float) -> None:
        """Forget kinds whose window is over; if none is, forget them all (bounded memory)."""
        stale = [k for k, w in self._windows.items() if now - w.start >= self.window_s]
        for k in stale or list(self._windows):
            del self._windows[k]


def install(handlers: Iterable[logging.Handler], **kw: float) -> list[RateLimitFilter]:
    """Put a :class:`RateLimitFilter` on each handler (a handler's filter sees the records
    of every logger that reaches it, child loggers included)."""
    out = []
    for h in handlers:
        if any(isinstance(f, RateLimitFilter) for f in h.filters):
            continue  # installed already
        f = RateLimitFilter(**kw)  # type: ignore[arg-type]
        h.addFilter(f)
        out.append(f)
    return out
