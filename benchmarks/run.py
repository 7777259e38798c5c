"""Run every benchmark script in this folder in turn (``make bench``).

``python benchmarks/run.py [NAME ...]`` runs the named ones only (``NAME`` without ``.py``).
Each script runs in its own process with its defaults and prints its figures: medians over
repeats, with ratios against a baseline measured in the same run (these machines are noisy).
The sidecar soak runs 10 minutes.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    names = argv or sorted(
        p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_") and p.stem != "run"
    )
    failed = []
    for name in names:
        print(f"== {name}", flush=True)
        t = time.perf_counter()
        rc = subprocess.call([sys.executable, str(HERE / f"{name}.py")], cwd=HERE.parent)
        print(f"   ({time.perf_counter() - t:.1f} s, exit {rc})", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
