"""Native libraries' thread pools in a long-running process, sized by what it needs.

numpy's OpenBLAS starts one thread per core when it loads (up to 64), Arrow's CPU pool one per
core at its first parallel kernel, and DuckDB four async I/O threads per core at connect. Each
counts the machine's cores: a sidecar in a pod on a 64-core GPU node ran 331 threads where it
runs 18 on 2 cores, with more memory in their stacks and malloc arenas, and every thread counts
against the pod's process limit (``pids.max``), which it shares with vLLM.

:func:`bound_native_threads` sets the environment variables that OpenBLAS, OpenMP, MKL and
Arrow read when they load or size their pools. It must run before numpy and pyarrow are
imported (the sidecar's command does it first thing); a value the user exported wins. DuckDB's
pools are set per database at connect (:func:`slokit.store.db.open_store`'s ``settings``).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

#: What each library reads: OpenBLAS (numpy's BLAS), OpenMP (and Arrow's CPU pool), MKL.
THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def bound_native_threads(
    threads: int, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Default each of :data:`THREAD_ENV` to ``threads`` (0 or less: leave the libraries'
    defaults); returns the variables as they now are, the user's values kept."""
    env = os.environ if environ is None else environ
    if threads > 0:
        for key in THREAD_ENV:
            if not env.get(key):
                env[key] = str(threads)
    return {key: env[key] for key in THREAD_ENV if key in env}
