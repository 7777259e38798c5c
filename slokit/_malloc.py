"""glibc's malloc arenas in a long-running process: two, instead of up to eight per core.

glibc gives a thread that allocates while another holds the main heap an arena of its own, up
to eight per core, and an arena keeps the pages it grew to. The sidecar's threads (the writer,
the event loop, the decoders in the default executor, DuckDB's and gRPC's) each grew one: 13
beside the main heap in a sidecar of 14 threads. With two, a 5-minute soak at 200 req/s ended
at 146.9 MB of ``RssAnon`` against 152.6 with glibc's default (side by side, CPU 2.42% against
2.57% of a core: ``benchmarks/soak_sidecar.py --sidecar-env MALLOC_ARENA_MAX=16``).

:func:`cap_malloc_arenas` calls ``mallopt(M_ARENA_MAX, n)`` where glibc's own
``MALLOC_ARENA_MAX`` is not set (glibc reads it at start; a user's value wins) and where the C
library is glibc (elsewhere, e.g. musl, it does nothing). Arenas already made stay; call it
before the process starts its threads.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

#: glibc's ``M_ARENA_MAX`` (malloc.h).
M_ARENA_MAX = -8
#: The arenas a sidecar keeps: the main heap and one that its other threads share.
SIDECAR_ARENAS = 2


def cap_malloc_arenas(arenas: int, environ: Mapping[str, str] | None = None) -> bool:
    """Cap glibc's arenas at ``arenas``; whether the cap was set (False: not glibc, or the
    environment sets ``MALLOC_ARENA_MAX``, or ``arenas`` below 1)."""
    env = os.environ if environ is None else environ
    if arenas < 1 or env.get("MALLOC_ARENA_MAX"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: its C library's
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))
