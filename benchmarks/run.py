"""Run every benchmark in this folder (each ``benchmarks/<name>.py`` with a ``main()``) in turn.

``python benchmarks/run.py [NAME ...]`` runs the named ones only. Figures are medians over
repeats, with ratios against a baseline measured in the same run: these machines are noisy.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(HERE))
    names = argv or sorted(
        p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_") and p.stem != "run"
    )
    failed = 0
    for name in names:
        spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not hasattr(module, "main"):
            continue
        print(f"== {name}", flush=True)
        t = time.perf_counter()
        try:
            module.main([])
        except Exception as exc:  # report and go on to the next benchmark
            failed += 1
            print(f"   FAILED: {type(exc).__name__}: {exc}")
        print(f"   ({time.perf_counter() - t:.1f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
