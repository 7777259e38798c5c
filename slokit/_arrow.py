"""pyarrow in a process that has not loaded pandas: keep it that way until pandas is imported.

pyarrow's first conversion of a Python list (``pa.array``) asks whether the list is a pandas
object and imports pandas to answer: about 50 MB of RSS and a second of CPU in a sidecar whose
writer converts lists at every commit and whose only pandas user, the periodic findings, may
be off (``diagnose_interval_s: 0``) or not due yet.

:func:`defer_pandas` lets that first question find no pandas (a finder refuses the import for
the length of one conversion), then watches for pandas being imported by anyone (the
findings, ``/api/diagnose``, ``/api/explain``): once it is, pyarrow is told again (its next
pandas check succeeds), before the importer gets the module, so pandas objects given to
pyarrow convert as they always do (NaN as null, Series by their values).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["defer_pandas"]

_lock = threading.Lock()
_deferred = False


class _Refuse(importlib.abc.MetaPathFinder):
    """Refuses pandas: pyarrow records it as absent."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "pandas":
            raise ModuleNotFoundError("pandas deferred by slokit._arrow", name=fullname)
        return None


class _Rearm(importlib.abc.MetaPathFinder):
    """On the import of pandas: finds it with the other finders, with a loader that, once the
    module has run, lets pyarrow see it and takes this finder out of the import system (a
    ``find_spec`` that imports nothing leaves it in place)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "pandas":
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _RearmingLoader(spec.loader, self)
                return spec
        return None


class _RearmingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, finder: _Rearm) -> None:
        self.loader = loader
        self.finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self.loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        _rearm()
        with _lock:
            if self.finder in sys.meta_path:
                sys.meta_path.remove(self.finder)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package...
        return getattr(self.loader, name)


def _rearm() -> None:
    """pyarrow looks for pandas again at its next pandas check; a conversion to pandas is one
    (the only public way to reach it), on an empty table."""
    import pyarrow as pa

    pa.table({"x": pa.array([], pa.int8())}).to_pandas()


def defer_pandas() -> bool:
    """Keep pyarrow from importing pandas until something else imports it; returns whether
    it did anything (not when pandas is loaded already, or after the first call). Call it
    before other threads start: while it runs, an import of pandas would fail."""
    global _deferred
    with _lock:
        if _deferred or "pandas" in sys.modules:
            return False
        _deferred = True
        import pyarrow as pa

        refuse = _Refuse()
        sys.meta_path.insert(0, refuse)
        try:
            pa.array([0])  # pyarrow's first pandas check: no pandas
        finally:
            sys.meta_path.remove(refuse)
        sys.meta_path.insert(0, _Rearm())
    return True
