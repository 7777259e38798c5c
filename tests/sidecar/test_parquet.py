"""The sidecar's Parquet export of closed minutes (the lake), on a fake clock: when a minute
closes, that it is written once, that an interrupted export is redone without duplicates,
that changed records are written again, and that replicas survive the round trip."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import duckdb
import pytest

from slokit.records import Finding, GpuSample, RequestFragment
from slokit.sources.otlp import decode_traces
from slokit.store import lake_export
from slokit.store.db import Store, open_store
from slokit.store.lake_export import ParquetExporter
from slokit.store.retention import prune_past_lake_hold

T0 = 1_700_000_040.0  # 22:14:00 UTC, a minute's start


def _read(out: Path, table: str, what: str = "count(*)") -> object:
    row = duckdb.execute(
        f"SELECT {what} FROM read_parquet('{out}/{table}/**/*.parquet', hive_partitioning = true, "
        "hive_types = {'replica': VARCHAR})"
    ).fetchone()
    assert row is not None
    return row[0] if len(row) == 1 else row


def _request(
    i: int, arrival: float, replica: str | None = "pod-a", **kw: object
) -> RequestFragment:
    return RequestFragment(
        fragment_id=f"f{i}-{kw.get('status', 'x')}", request_id=f"r{i}", source="vllm",
        replica=replica, model="m", arrival_ts=arrival, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_closed_minutes_are_exported_once_in_hive_layout(
    tmp_path: Path, export_body: bytes
) -> None:
    store = open_store(tmp_path / "p.duckdb")
    store.append_fragments(decode_traces(export_body, default_replica="pod-a").fragments)
    (newest,) = store.con.execute("SELECT epoch(max(arrival_ts)) FROM requests").fetchall()[0]
    out = tmp_path / "lake"
    now = [newest]  # the minute of the newest data is still open
    exp = ParquetExporter(str(out), grace_s=50, writer="sidecar-a", clock=lambda: now[0])
    early = exp.export_closed_minutes(store.con)
    assert all(w.split("/")[1] < _minute_of(newest) for w in early)
    now[0] = (newest // 60 + 1) * 60 + 49  # the minute ended, the grace not yet
    assert exp.export_closed_minutes(store.con) == []
    now[0] += 1
    written = exp.export_closed_minutes(store.con)
    assert {w.split("/")[0] for w in early + written} == {"requests"}
    files = sorted(p.relative_to(out / "requests").as_posix() for p in out.rglob("*.parquet"))
    date, hour, minute, replica, name = files[0].split("/")
    assert (date[:5], hour[:5], minute[:7]) == ("date=", "hour=", "minute=")
    assert (replica, name) == ("replica=pod-a", "part_sidecar-a.parquet")
    assert _read(out, "requests", "count(*), any_value(replica)") == (64, "pod-a")
    assert exp.export_closed_minutes(store.con) == []  # once
    # A restarted sidecar reads its markers: nothing again.
    again = ParquetExporter(str(out), grace_s=50, writer="sidecar-a", clock=lambda: now[0])
    assert again.export_closed_minutes(store.con) == []
    store.close()


def _minute_of(ts: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M", time.gmtime(ts))


@pytest.fixture
def store() -> Store:
    return open_store(":memory:")


def test_an_interrupted_export_is_redone_without_duplicates(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.append_fragments([_request(i, T0 + i, replica=f"pod-{i % 2}") for i in range(10)])
    exp = ParquetExporter(str(tmp_path), writer="w", clock=lambda: T0 + 600)
    real = ParquetExporter._write
    calls = []

    def dies_on_the_second(self: ParquetExporter, *a: object) -> None:
        calls.append(a)
        if len(calls) == 2:
            raise OSError("killed")
        real(self, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(ParquetExporter, "_write", dies_on_the_second)
    with pytest.raises(OSError):
        exp.export_closed_minutes(store.con)
    monkeypatch.setattr(ParquetExporter, "_write", real)
    assert _read(tmp_path, "requests") == 5  # one replica's file, no marker
    restarted = ParquetExporter(str(tmp_path), writer="w", clock=lambda: T0 + 600)
    assert restarted.export_closed_minutes(store.con) == ["requests/2023-11-14T22:14"]
    assert _read(tmp_path, "requests") == 10
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_record_completed_after_its_minute_was_written_is_written_again(
    tmp_path: Path, store: Store
) -> None:
    store.append_fragments([_request(1, T0 + 1), _request(2, T0 + 2)])
    now = [T0 + 120]
    exp = ParquetExporter(str(tmp_path), writer="w", clock=lambda: now[0])
    assert exp.export_closed_minutes(store.con) == ["requests/2023-11-14T22:14"]
    assert _read(tmp_path, "requests", "count(finish_ts)") == 0
    store.append_fragments([_request(1, T0 + 1, finish_ts=T0 + 150, status="ok")])
    now[0] += 10
    assert exp.export_closed_minutes(store.con) == ["requests/2023-11-14T22:14"]
    assert _read(tmp_path, "requests", "count(*), count(finish_ts)") == (2, 1)
    assert exp.export_closed_minutes(store.con) == []


def _four_written(tmp_path: Path, store: Store) -> tuple[ParquetExporter, list[float]]:
    """Four requests of minute 22:14 written to the lake; the exporter and its clock."""
    store.append_fragments([_request(i, T0 + i) for i in range(4)])
    now = [T0 + 120]
    exp = ParquetExporter(str(tmp_path), writer="w", clock=lambda: now[0])
    assert exp.export_closed_minutes(store.con) == ["requests/2023-11-14T22:14"]
    return exp, now


def test_a_minute_no_longer_revisited_keeps_the_rows_written_when_the_store_deletes_them(
    tmp_path: Path, store: Store
) -> None:
    exp, now = _four_written(tmp_path, store)
    with exp.paused(1.0) as paused:  # the store needs room: the two oldest go
        assert paused
        store.con.execute("DELETE FROM requests WHERE request_id IN ('r0', 'r1')")
        exp.stop_revisiting("requests", T0 + 1)
    now[0] += 10
    assert exp.export_closed_minutes(store.con) == []  # not written again without them
    assert _read(tmp_path, "requests") == 4
    assert exp.settled_before("requests") == T0 + 60
    again = ParquetExporter(str(tmp_path), writer="w", clock=lambda: now[0])  # restarted
    assert again.export_closed_minutes(store.con) == []


def test_stopping_revisits_past_what_is_written_leaves_the_minutes_to_come_revisited(
    tmp_path: Path, store: Store
) -> None:
    store.append_fragments([_request(1, T0 + 1)])
    now = [T0 + 120]
    exp = ParquetExporter(str(tmp_path), writer="w", clock=lambda: now[0])
    exp.export_closed_minutes(store.con)
    with exp.paused(1.0):
        exp.stop_revisiting("requests", T0 + 86_400)  # a deleted request a sender dated ahead
    store.append_fragments([_request(2, T0 + 61)])  # the next minute, written, then completed
    now[0] += 60
    assert exp.export_closed_minutes(store.con) == ["requests/2023-11-14T22:15"]
    store.append_fragments([_request(2, T0 + 61, finish_ts=T0 + 200, status="ok")])
    now[0] += 10
    assert exp.export_closed_minutes(store.con) == ["requests/2023-11-14T22:15"]
    assert _read(tmp_path, "requests", "count(finish_ts)") == 1


def test_a_request_dated_ahead_deleted_past_the_hold_leaves_the_written_minutes_revisited(
    tmp_path: Path, store: Store
) -> None:
    """A sender's clock a day ahead, its request the oldest the store saw: deleted past the
    hold, it lost no row of a written minute, which is still revisited (the store keeps its
    rows for that) and written again whole when it changes."""
    store.append_fragments([_request(0, T0 + 86_400)])  # first seen first: the first to go
    store.append_fragments([_request(1, T0 + 1), _request(2, T0 + 2)])
    now = [T0 + 120]
    exp = ParquetExporter(str(tmp_path), writer="w", clock=lambda: now[0])
    assert exp.export_closed_minutes(store.con) == ["requests/2023-11-14T22:14"]
    gone = prune_past_lake_hold(store, exp, max_requests=2, wait_s=1.0)
    assert gone is not None and (gone.requests, gone.unwritten) == (1, 1)
    assert exp.settled_before("requests") == T0  # 22:14 is still revisited
    store.append_fragments([_request(1, T0 + 1, finish_ts=T0 + 150, status="ok")])
    now[0] += 10
    assert exp.export_closed_minutes(store.con) == ["requests/2023-11-14T22:14"]
    assert _read(tmp_path, "requests", "count(*), count(finish_ts)") == (2, 1)


def test_a_written_minute_that_lost_rows_past_the_hold_keeps_them_when_a_change_is_merged(
    tmp_path: Path, store: Store
) -> None:
    exp, now = _four_written(tmp_path, store)
    gone = prune_past_lake_hold(store, exp, max_requests=2, wait_s=1.0)
    assert gone is not None and (gone.requests, gone.newest_written) == (2, T0 + 1)
    now[0] += 10
    assert exp.export_closed_minutes(store.con) == []  # not written again without r0, r1
    store.append_fragments([_request(3, T0 + 3, finish_ts=T0 + 150, status="ok")])
    assert exp.export_closed_minutes(store.con) == ["requests/2023-11-14T22:14"]
    assert _read(tmp_path, "requests", "count(*), count(finish_ts)") == (4, 1)
    assert _read(tmp_path, "requests", "list(request_id ORDER BY request_id)") == [
        "r0", "r1", "r2", "r3"
    ]  # fmt: skip


def _schema(out: Path) -> list[tuple[object, ...]]:
    (path,) = out.rglob("*.parquet")
    return duckdb.execute(
        f"DESCRIBE SELECT * FROM read_parquet('{path}', hive_partitioning = false)"
    ).fetchall()


def _past_the_revisits(exp: ParquetExporter, store: Store, now: list[float]) -> None:
    """Move the exporter's clock on until 22:14 is no longer revisited."""
    now[0] += 31 * 60
    exp.export_closed_minutes(store.con)
    st = exp._state["requests"]  # type: ignore[index]
    assert st.through is not None and exp._revisited_from(st, st.through) > T0 // 60


def test_a_request_that_changes_after_its_minute_left_the_revisits_is_merged_into_its_file(
    tmp_path: Path, store: Store
) -> None:
    """A request longer than the revisits: its record completes after its minute was last
    looked at, and the store has since deleted an older one of that minute."""
    exp, now = _four_written(tmp_path, store)
    _past_the_revisits(exp, store, now)
    with exp.paused(1.0):
        store.con.execute("DELETE FROM requests WHERE request_id = 'r0'")
    written = _schema(tmp_path)
    store.append_fragments([_request(1, T0 + 1, finish_ts=T0 + 2000, status="ok")])
    assert exp.export_closed_minutes(store.con) == ["requests/2023-11-14T22:14"]
    assert _read(tmp_path, "requests", "count(*), count(finish_ts)") == (4, 1)
    assert _read(tmp_path, "requests", "any_value(status) FILTER (WHERE request_id = 'r1')") == "ok"
    assert _schema(tmp_path) == written  # the same columns and types as a minute written whole
    assert exp.export_closed_minutes(store.con) == []  # once


def test_a_request_first_seen_long_after_its_minute_is_added_to_its_file(
    tmp_path: Path, store: Store
) -> None:
    """A sender whose clock is 40 minutes behind: its request lands in a minute written and
    no longer revisited, and in one that was never written (it had no rows)."""
    exp, now = _four_written(tmp_path, store)
    _past_the_revisits(exp, store, now)
    store.append_fragments([_request(7, T0 + 7), _request(8, T0 + 61, replica="pod-b")])
    assert exp.export_closed_minutes(store.con) == [
        "requests/2023-11-14T22:14", "requests/2023-11-14T22:15"
    ]  # fmt: skip
    assert _read(tmp_path, "requests", "count(*)") == 6
    assert _read(tmp_path, "requests", "count(*) FILTER (WHERE replica = 'pod-b')") == 1


def test_late_changes_still_to_merge_survive_a_restart(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after merging one of two minutes: the other is merged after the restart, though
    the changes that put it there are older than what the first run looked at."""
    exp, now = _four_written(tmp_path, store)
    _past_the_revisits(exp, store, now)
    store.append_fragments([_request(1, T0 + 1, finish_ts=T0 + 2000, status="ok")])
    store.append_fragments([_request(9, T0 - 60)])  # and one in the minute before
    real = ParquetExporter._merge_minute
    merged: list[int] = []

    def dies_on_the_second(self: ParquetExporter, con: object, table: object, minute: int) -> None:
        if merged:
            raise OSError("killed")
        merged.append(minute)
        real(self, con, table, minute)  # type: ignore[arg-type]

    monkeypatch.setattr(ParquetExporter, "_merge_minute", dies_on_the_second)
    with pytest.raises(OSError):
        exp.export_closed_minutes(store.con)
    monkeypatch.undo()
    restarted = ParquetExporter(str(tmp_path), writer="w", clock=lambda: now[0])
    assert restarted.export_closed_minutes(store.con) == ["requests/2023-11-14T22:14"]
    assert _read(tmp_path, "requests", "count(*), count(finish_ts)") == (5, 1)


def test_a_late_change_made_while_the_exporter_was_stopped_is_merged_after_its_restart(
    tmp_path: Path, store: Store
) -> None:
    exp, now = _four_written(tmp_path, store)
    _past_the_revisits(exp, store, now)
    store.append_fragments([_request(1, T0 + 1, finish_ts=T0 + 2000, status="ok")])
    restarted = ParquetExporter(str(tmp_path), writer="w", clock=lambda: now[0])
    assert restarted.export_closed_minutes(store.con) == ["requests/2023-11-14T22:14"]
    assert _read(tmp_path, "requests", "count(finish_ts)") == 1


def test_markers_from_before_late_merges_start_looking_from_now(
    tmp_path: Path, store: Store
) -> None:
    """A lake written by a slokit that did not merge late changes: what changed before the
    upgrade is not looked for (it cannot be told apart), what changes after is."""
    exp, now = _four_written(tmp_path, store)
    _past_the_revisits(exp, store, now)
    store.append_fragments([_request(1, T0 + 1, finish_ts=T0 + 2000, status="ok")])
    state = tmp_path / "_exported" / "w.json"
    doc = json.loads(state.read_text())
    for st in doc["tables"].values():
        del st["seen_to"], st["late"]
    state.write_text(json.dumps(doc))
    upgraded = ParquetExporter(str(tmp_path), writer="w", clock=lambda: now[0])
    assert upgraded.export_closed_minutes(store.con) == []
    store.append_fragments([_request(2, T0 + 2, finish_ts=T0 + 2000, status="ok")])
    assert upgraded.export_closed_minutes(store.con) == ["requests/2023-11-14T22:14"]
    assert _read(tmp_path, "requests", "count(finish_ts)") == 2


def test_past_max_late_minutes_the_oldest_are_given_up_with_a_warning(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(lake_export, "MAX_LATE_MINUTES", 2)
    exp, now = _four_written(tmp_path, store)
    _past_the_revisits(exp, store, now)
    store.append_fragments([_request(10 + m, T0 - 60 * m) for m in range(3)])  # 3 old minutes
    assert exp.export_closed_minutes(store.con) == [
        "requests/2023-11-14T22:13", "requests/2023-11-14T22:14"
    ]  # fmt: skip
    assert "1 minutes of requests with late changes given up" in caplog.text


def test_past_the_hold_nothing_goes_while_a_lake_tick_runs(tmp_path: Path, store: Store) -> None:
    exp, _ = _four_written(tmp_path, store)
    with exp.paused(1.0):  # as a tick writing to a slow bucket holds it
        done: list[object] = []
        t = threading.Thread(
            target=lambda: done.append(
                prune_past_lake_hold(store, exp, max_requests=2, wait_s=0.05)
            )
        )
        t.start()
        t.join()
    assert done == [None]
    assert store.con.execute("SELECT count(*) FROM requests").fetchall() == [(4,)]


def test_a_revisited_minute_whose_rows_were_deleted_is_written_again_without_them(
    tmp_path: Path, store: Store
) -> None:
    """What stop_revisiting prevents: a revisit sees the minute changed."""
    exp, now = _four_written(tmp_path, store)
    store.con.execute("DELETE FROM requests WHERE request_id IN ('r0', 'r1')")
    now[0] += 10
    assert exp.export_closed_minutes(store.con) == ["requests/2023-11-14T22:14"]
    assert _read(tmp_path, "requests") == 2


class _WatchedLock:
    """The exporter's lock, which says when a thread other than the test's asks for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.asked = threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if threading.current_thread() is not threading.main_thread():
            self.asked.set()
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_tick_waits_for_whoever_paused_the_lake(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp = ParquetExporter(str(tmp_path), writer="w", clock=lambda: T0 + 120)
    lock = _WatchedLock()
    exp._lock = lock  # type: ignore[assignment]
    events: list[str] = []
    real = ParquetExporter._export_closed_minutes

    def tick(self: ParquetExporter, con: duckdb.DuckDBPyConnection) -> list[str]:
        events.append("tick")
        return real(self, con)

    monkeypatch.setattr(ParquetExporter, "_export_closed_minutes", tick)
    with exp.paused(1.0) as paused:
        assert paused
        with exp.paused(0.01) as again:  # held: a second pause times out
            assert not again
        thread = threading.Thread(target=exp.export_closed_minutes, args=(store.con.cursor(),))
        thread.start()
        assert lock.asked.wait(30), "the tick never asked for the lock"
        events.append("resumed")  # the tick asked, and cannot run until the pause ends
    thread.join(30)
    assert events == ["resumed", "tick"]


def test_replaced_findings_replace_their_files(tmp_path: Path, store: Store) -> None:
    def finding(replica: str | None) -> Finding:
        return Finding("error_burst", "warning", 0.9, replica, T0, T0 + 30, "s", {}, "rb")

    store.replace_findings([finding("pod-a"), finding(None)], (T0, T0 + 60))
    exp = ParquetExporter(str(tmp_path), writer="w", clock=lambda: T0 + 600)
    assert exp.export_closed_minutes(store.con) == ["findings/2023-11-14T22:14"]
    assert _read(tmp_path, "findings", "list(replica ORDER BY replica NULLS FIRST)") == [
        None,
        "pod-a",
    ]
    store.replace_findings([finding(None)], (T0, T0 + 60))  # the next diagnosis: fleet only
    assert exp.export_closed_minutes(store.con) == ["findings/2023-11-14T22:14"]
    assert _read(tmp_path, "findings", "list(replica)") == [None]
    assert not list(tmp_path.glob("findings/**/replica=pod-a/*.parquet"))


def test_replicas_survive_the_round_trip(tmp_path: Path, store: Store) -> None:
    names = [None, "", "a/b=c d%", "007", "pod-é"]
    store.append_gpu_samples(
        [
            GpuSample(ts=T0 + i, node="n", gpu=str(i), replica=r, source="dcgm")
            for i, r in enumerate(names)
        ]
    )
    ParquetExporter(str(tmp_path), writer="w", clock=lambda: T0 + 600).export_closed_minutes(
        store.con
    )
    got = _read(tmp_path, "gpu_samples", "list(replica ORDER BY ts)")
    assert got == names


def test_work_per_tick_is_bounded(tmp_path: Path, store: Store) -> None:
    store.append_fragments([_request(i, T0 + 60 * i) for i in range(5)])
    exp = ParquetExporter(str(tmp_path), writer="w", max_minutes=2, clock=lambda: T0 + 3600)
    assert [len(exp.export_closed_minutes(store.con)) for _ in range(4)] == [2, 2, 1, 0]
    assert _read(tmp_path, "requests") == 5
