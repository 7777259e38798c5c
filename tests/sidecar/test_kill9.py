"""``kill -9`` during heavy ingest, three times: the sidecar restarts, the DuckDB file opens,
and every span that was answered 200 is in ``requests``: committed to DuckDB before the
answer, or (with ``commit_interval_s``) synced in the journal and stored at the restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from sidecar_harness import closed_port_url, relabel, wait_for

from slokit.store.db import open_store

pytestmark = pytest.mark.slow


def _port() -> int:
    return int(closed_port_url().split(":")[2].split("/")[0])


class SidecarProcess:
    def __init__(self, db: Path, log: Path, commit_interval_s: str = "0") -> None:
        self.api_port, self.otlp_port = _port(), _port()
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "slokit.sidecar", "--db", str(db), "--replica", "kill9",
             "--listen", f"127.0.0.1:{self.api_port}",
             "--otlp-http", f"127.0.0.1:{self.otlp_port}", "--otlp-grpc", ""],
            stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "SLOKIT_COMMIT_INTERVAL_S": commit_interval_s},
        )  # fmt: skip
        self.otlp = f"http://127.0.0.1:{self.otlp_port}/v1/traces"

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            assert self.proc.poll() is None, "sidecar exited"
            try:
                return httpx.get(f"http://127.0.0.1:{self.api_port}/readyz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout, "readyz")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _ingest(url: str, body: bytes, prefix: str, acked: list[str], stop: threading.Event) -> None:
    i = 0
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            data, ids = relabel(body, f"{prefix}-{i}")
            i += 1
            try:
                resp = client.post(url, content=data,
                                   headers={"Content-Type": "application/x-protobuf"})  # fmt: skip
            except httpx.HTTPError:
                return  # the sidecar is gone
            if resp.status_code == 200:
                acked.extend(ids)


@pytest.mark.parametrize("commit_interval_s", ["0", "1"], ids=["commit-per-batch", "journal"])
def test_kill_9_during_ingest_loses_no_acknowledged_span(
    tmp_path: Path, export_body: bytes, commit_interval_s: str
) -> None:
    db, log = tmp_path / "kill.duckdb", tmp_path / "sidecar.log"
    acked: list[str] = []
    for round_ in range(3):
        sp = SidecarProcess(db, log, commit_interval_s)
        try:
            sp.wait_ready()
            stop = threading.Event()
            threads = [
                threading.Thread(target=_ingest,
                                 args=(sp.otlp, export_body, f"k{round_}{t}", acked, stop))
                for t in range(4)
            ]  # fmt: skip
            before = len(acked)
            for t in threads:
                t.start()
            target = before + 64 * 8
            wait_for(lambda: len(acked) >= target, 20, "acknowledged spans")  # noqa: B023
            os.kill(sp.proc.pid, signal.SIGKILL)
            sp.proc.wait()
            stop.set()
            for t in threads:
                t.join(15)
        finally:
            sp.close()
    # a clean restart opens the file after the third crash, then stops cleanly
    sp = SidecarProcess(db, log, commit_interval_s)
    try:
        sp.wait_ready()
        sp.proc.send_signal(signal.SIGTERM)
        assert sp.proc.wait(30) == 0
    finally:
        sp.close()
    with open_store(db, read_only=True) as store:
        stored = {r[0] for r in store.con.execute("SELECT request_id FROM requests").fetchall()}
    missing = set(acked) - stored
    assert len(acked) >= 3 * 64 * 8
    assert not missing, f"{len(missing)} acknowledged requests lost, e.g. {sorted(missing)[:5]}"
    if commit_interval_s != "0":  # the crashes left acknowledged spans only in the journal
        assert b"fragments from the journal" in log.read_bytes()
