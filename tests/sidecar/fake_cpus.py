"""A process that believes it runs on N CPUs: an ``LD_PRELOAD`` library, built with the system's
C compiler, that answers glibc's CPU counts (``sysconf``, ``get_nprocs``, ``sched_getaffinity``)
with ``FAKE_NCPU``. What each native library sizes its pools by (numpy's OpenBLAS and the
affinity mask, DuckDB and Arrow through ``std::thread::hardware_concurrency``, Python's
``os.cpu_count``) then sees a big node's cores on a 2-core machine; the threads still run on the
real ones. Used by the sidecar's thread tests and ``benchmarks/threads_by_cores.py``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int ncpu(void) {
    const char *s = getenv("FAKE_NCPU");
    int n = s ? atoi(s) : 0;
    return n > 0 ? n : 1;
}

int get_nprocs(void) { return ncpu(); }
int get_nprocs_conf(void) { return ncpu(); }

long sysconf(int name) {
    static long (*real)(int);
    if (name == _SC_NPROCESSORS_ONLN || name == _SC_NPROCESSORS_CONF) return ncpu();
    if (!real) real = (long (*)(int))dlsym(RTLD_NEXT, "sysconf");
    return real(name);
}

int sched_getaffinity(pid_t pid, size_t size, cpu_set_t *mask) {
    (void)pid;
    memset(mask, 0, size);
    for (int i = 0; i < ncpu() && (size_t)i < size * 8; i++) CPU_SET_S(i, size, mask);
    return 0;
}
"""


def build(directory: Path) -> Path:
    """Compile the library into ``directory``; RuntimeError when no C compiler is installed
    (``scripts/system-deps.sh`` installs gcc)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc) to build the fake-CPU library")
    src = directory / "fake_cpus.c"
    lib = directory / "fake_cpus.so"
    src.write_text(SOURCE)
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(src), "-ldl"],
                   check=True, capture_output=True)  # fmt: skip
    return lib


def environment(lib: Path, ncpu: int) -> dict[str, str]:
    """What a child process's environment needs to believe it has ``ncpu`` CPUs."""
    return {"LD_PRELOAD": str(lib), "FAKE_NCPU": str(ncpu)}
