"""The ingest journal: with ``commit_interval_s`` an export is acknowledged once its fragments
are in the synced journal, and DuckDB gets them about once per interval in one transaction.
Nothing acknowledged is lost: not on a crash before the commit, not on a failing database,
not when the store refuses a fragment after the acknowledgement."""

from __future__ import annotations

import errno
import math
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry
from sidecar_harness import FakeClock, StartSidecar, post, relabel, stored_request_ids, tick

from slokit.records import RequestFragment
from slokit.sidecar.journal import Journal, JournalError, read_frames
from slokit.sidecar.metrics import SidecarMetrics
from slokit.sidecar.write_errors import QueueFull, RecordsRefused
from slokit.sidecar.writer import Writer
from slokit.store.append import fragments_table
from slokit.store.db import Store, open_store

NOW = 1_795_958_000.0


def _frag(rid: str, **values: Any) -> RequestFragment:
    fields = {"arrival_ts": NOW, "e2e_s": 1.0, **values}
    return RequestFragment(request_id=rid, source="vllm", fragment_id=f"vllm:{rid}", **fields)


@dataclass
class Journaled:
    writer: Writer
    journal: Journal
    store: Store
    clock: FakeClock
    registry: CollectorRegistry

    def stored(self) -> set[str]:
        return stored_request_ids(self.store)

    def tick(self, seconds: float) -> None:
        """Advance the writer's clock and wake it."""
        tick(self.writer, self.clock, seconds)


def _writer(store: Store, journal: Journal, clock: FakeClock, **kw: Any) -> Writer:
    return Writer(store, metrics=SidecarMetrics(CollectorRegistry()), journal=journal,
                  commit_interval_s=1.0, clock=clock, **kw)  # fmt: skip


@pytest.fixture
def journaled(tmp_path: Path) -> Iterator[Journaled]:
    store = open_store(tmp_path / "j.duckdb")
    journal = Journal(tmp_path / "j.duckdb.journal")
    clock = FakeClock()
    registry = CollectorRegistry()
    writer = Writer(store, metrics=SidecarMetrics(registry), journal=journal,
                    commit_interval_s=1.0, clock=clock)  # fmt: skip
    writer.start()
    yield Journaled(writer, journal, store, clock, registry)
    writer.stop()
    journal.close()
    store.close()


# -- the journal file ----------------------------------------------------------------------


def test_frames_read_back_as_the_tables_appended(tmp_path: Path) -> None:
    j = Journal(tmp_path / "a.journal")
    tables = [fragments_table([_frag("a"), _frag("b")]), fragments_table([_frag("c")])]
    j.append(tables)
    got, end = read_frames((tmp_path / "a.journal").read_bytes())
    assert [t.equals(e) for t, e in zip(got, tables, strict=True)] == [True, True]
    assert end == j.size
    j.close()


def test_a_torn_tail_is_cut_and_kept_beside_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "a.journal"
    j = Journal(path)
    j.append([fragments_table([_frag("a")])])
    whole = path.read_bytes()
    j.append([fragments_table([_frag("b")])])
    j.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 7])  # a crash in the middle of the second write
    j = Journal(path)
    tables = j.replay()
    assert [t["request_id"].to_pylist() for t in tables] == [["a"]]
    assert path.read_bytes() == whole
    (torn,) = tmp_path.glob("a.journal.torn-*")
    assert torn.read_bytes() == data[len(whole) : len(data) - 7]
    j.close()


def test_a_damaged_frame_ends_the_replay_and_nothing_after_it_is_deleted(tmp_path: Path) -> None:
    path = tmp_path / "a.journal"
    j = Journal(path)
    for rid in "abc":
        j.append([fragments_table([_frag(rid)])])
    j.close()
    data = bytearray(path.read_bytes())
    third = len(data) // 3
    data[third + 20] ^= 0xFF  # a flipped bit in the second frame
    path.write_bytes(bytes(data))
    j = Journal(path)
    assert [t["request_id"].to_pylist() for t in j.replay()] == [["a"]]
    (torn,) = tmp_path.glob("a.journal.torn-*")
    assert len(torn.read_bytes()) == len(data) - third
    j.close()


def test_a_failed_sync_cuts_the_journal_back_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.journal"
    j = Journal(path)
    j.append([fragments_table([_frag("a")])])
    before = path.read_bytes()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fdatasync", full)
    with pytest.raises(JournalError, match="No space left on device"):
        j.append([fragments_table([_frag("b")])])
    assert path.read_bytes() == before
    j.close()


# -- the writer with a journal ---------------------------------------------------------------


def test_fragments_are_acknowledged_before_duckdb_has_them(journaled: Journaled) -> None:
    fut = journaled.writer.submit("fragments", [_frag("a"), _frag("b")])
    assert fut.result(10) == 2
    assert journaled.journal.size > 0
    assert journaled.stored() == set()  # the interval has not passed on the writer's clock


def test_the_interval_commits_them_and_empties_the_journal(journaled: Journaled) -> None:
    w = journaled.writer
    for i in range(5):
        w.submit("fragments", [_frag(f"r{i}")]).result(10)
    batches = w.committed_batches
    journaled.tick(1.0)
    assert w.flush(10)
    assert journaled.stored() == {f"r{i}" for i in range(5)}
    assert w.committed_batches == batches + 1  # one transaction for the five exports
    assert journaled.journal.size == 0


def test_flush_lets_a_reader_see_what_was_acknowledged(journaled: Journaled) -> None:
    journaled.writer.submit("fragments", [_frag("a")]).result(10)
    assert journaled.writer.flush(10)  # no tick: flushing does not wait for the interval
    assert journaled.stored() == {"a"}


def test_journaled_fragments_keep_their_weight_on_the_bound_until_committed(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path / "j.duckdb")
    journal = Journal(tmp_path / "j.journal")
    clock = FakeClock()
    writer = _writer(store, journal, clock, capacity=3)
    writer.start()
    try:
        writer.submit("fragments", [_frag("a"), _frag("b"), _frag("c")]).result(10)
        with pytest.raises(QueueFull):
            writer.submit("fragments", [_frag("d")])
        assert writer.flush(10)
        assert writer.submit("fragments", [_frag("d")]).result(10) == 1
    finally:
        writer.stop()
        journal.close()
        store.close()


def test_stop_commits_what_the_journal_holds(tmp_path: Path) -> None:
    store = open_store(tmp_path / "j.duckdb")
    journal = Journal(tmp_path / "j.journal")
    writer = _writer(store, journal, FakeClock())
    writer.start()
    writer.submit("fragments", [_frag("a")]).result(10)
    writer.stop()
    assert store.con.execute("SELECT request_id FROM requests").fetchall() == [("a",)]
    assert journal.size == 0
    journal.close()
    store.close()


def test_a_journal_left_by_a_crash_is_stored_at_the_next_start(tmp_path: Path) -> None:
    # what a sidecar killed after acknowledging, before committing, leaves behind
    crashed = Journal(tmp_path / "j.journal")
    crashed.append([fragments_table([_frag("a"), _frag("b")]), fragments_table([_frag("c")])])
    crashed.close()
    store = open_store(tmp_path / "j.duckdb")
    journal = Journal(tmp_path / "j.journal")
    writer = _writer(store, journal, FakeClock())
    writer.start()
    try:
        assert writer.replayed_fragments == 3
        rows = store.con.execute("SELECT request_id FROM requests ORDER BY 1").fetchall()
        assert rows == [("a",), ("b",), ("c",)]
        assert journal.size == 0
    finally:
        writer.stop()
        journal.close()
        store.close()


def test_replaying_fragments_duckdb_already_holds_stores_nothing_twice(tmp_path: Path) -> None:
    # a crash after DuckDB's commit and before the journal was emptied
    store = open_store(tmp_path / "j.duckdb")
    store.append_fragments([_frag("a", ttft_s=0.2), _frag("b")])
    journal = Journal(tmp_path / "j.journal")
    journal.append([fragments_table([_frag("a", ttft_s=0.2), _frag("b")])])
    writer = _writer(store, journal, FakeClock())
    writer.start()
    try:
        assert store.con.execute("SELECT count(*) FROM requests").fetchone() == (2,)
        assert store.con.execute("SELECT count(*) FROM request_fragments").fetchone() == (2,)
    finally:
        writer.stop()
        journal.close()
        store.close()


def test_a_fragment_the_store_refuses_after_the_ack_is_kept_and_counted(
    journaled: Journaled,
) -> None:
    w = journaled.writer
    good = [w.submit("fragments", [_frag(f"ok{i}")]) for i in range(4)]
    poison = w.submit("fragments", [_frag("poison", e2e_s=math.nan)])
    assert [f.result(10) for f in good] == [1] * 4
    assert poison.result(10) == 1  # acknowledged: it is in the synced journal
    assert w.flush(10)
    assert journaled.stored() == {f"ok{i}" for i in range(4)}
    refused = journaled.journal.path.with_name(journaled.journal.path.name + ".refused")
    tables, _ = read_frames(refused.read_bytes())
    assert [t["request_id"].to_pylist() for t in tables] == [["poison"]]
    reg = journaled.registry
    assert reg.get_sample_value("slokit_write_refused_total", {"kind": "fragments"}) == 1


def test_a_fragment_arrow_cannot_hold_is_refused_before_the_ack(journaled: Journaled) -> None:
    fut = journaled.writer.submit("fragments", [_frag("big", output_tokens=2**70)])
    with pytest.raises(RecordsRefused):
        fut.result(10)
    assert journaled.journal.size == 0


def test_a_failing_database_keeps_the_journal_and_refuses_new_exports_until_it_recovers(
    journaled: Journaled, monkeypatch: pytest.MonkeyPatch
) -> None:
    w, store = journaled.writer, journaled.store
    real = store.append_fragment_table
    failing = threading.Event()
    failing.set()

    def append(table: pa.Table) -> Any:
        if failing.is_set():
            raise duckdb.IOException("IO Error: No space left on device")
        return real(table)

    monkeypatch.setattr(store, "append_fragment_table", append)
    assert w.submit("fragments", [_frag("a")]).result(10) == 1
    assert not w.flush(0.5)  # the commit fails: the fragment stays in the journal
    size = journaled.journal.size
    assert size > 0
    with pytest.raises(duckdb.IOException):  # a new export is told to retry later
        w.submit("fragments", [_frag("b")]).result(10)
    assert journaled.journal.size == size
    failing.clear()
    journaled.tick(1.0)  # the next interval retries
    assert w.flush(10)
    assert journaled.stored() == {"a"}
    assert journaled.journal.size == 0
    assert w.submit("fragments", [_frag("b")]).result(10) == 1


def test_a_full_journal_volume_is_reported_until_an_append_succeeds(
    journaled: Journaled, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = journaled.writer
    real = os.fdatasync
    full = threading.Event()
    full.set()

    def sync(fd: int) -> None:
        if full.is_set():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", sync)
    with pytest.raises(JournalError):  # the export is told to retry later
        w.submit("fragments", [_frag("a")]).result(10)
    assert w.journal_fault is not None and "No space left on device" in w.journal_fault
    full.clear()
    assert w.submit("fragments", [_frag("a")]).result(10) == 1
    assert w.journal_fault is None


# -- the sidecar -----------------------------------------------------------------------------


def test_an_acknowledged_span_is_explained_at_once_with_a_long_commit_interval(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    import httpx

    r = start_sidecar(commit_interval_s=60.0)
    body, ids = relabel(export_body, "jr")
    assert post(r.otlp, body).status_code == 200
    assert Path(f"{r.db}.journal").stat().st_size > 0
    resp = httpx.get(f"{r.api}/api/explain/{ids[0]}", timeout=30)
    assert resp.status_code == 200, resp.text
    assert Path(f"{r.db}.journal").stat().st_size == 0
