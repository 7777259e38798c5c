"""How a CLI command finds the running sidecar that holds a DuckDB file.

DuckDB allows one read-write process per file, so ``slokit explain --db F`` fails on the lock
while a sidecar writes ``F``. The sidecar leaves ``F.sidecar.json`` (its API URL and pid)
next to the file while it runs; :func:`find_sidecar` reads it back, checking that the pid is
alive, so the command can ask the API instead (:class:`slokit.client.SidecarClient`).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path


def discovery_path(db: str | Path) -> Path:
    return Path(f"{db}.sidecar.json")


def write_discovery(db: str | Path, api_url: str, *, pid: int | None = None) -> Path:
    """Write the file atomically; OSError (a full or read-only volume) leaves nothing behind."""
    p = discovery_path(db)
    tmp = p.with_name(p.name + ".tmp")
    try:
        tmp.write_text(json.dumps({"api": api_url, "pid": pid or os.getpid()}))
        tmp.replace(p)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    return p


def remove_discovery(db: str | Path) -> None:
    discovery_path(db).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_sidecar(db: str | Path) -> str | None:
    """The API URL of the live sidecar holding ``db``, or None."""
    try:
        doc = json.loads(discovery_path(db).read_text())
        url, pid = str(doc["api"]), int(doc["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return url if _alive(pid) else None
