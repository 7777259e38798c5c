"""Retention: the store deletes its oldest requests, with all their fragments, past a count or
an age (by when the store first saw them, on its own clock), never those a lake still needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slokit.records import RequestFragment
from slokit.store import retention
from slokit.store.db import Store, open_store
from slokit.store.merge import merge_sql
from slokit.store.migrations import MIGRATIONS
from slokit.store.retention import prune_past_hold, prune_requests, requests_whole_from

T0 = 1_795_958_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _frag(rid: str, source: str = "vllm", arrival: float | None = T0) -> RequestFragment:
    return RequestFragment(
        rid, source, f"{source}:{rid}", trace_id="ab" * 16, arrival_ts=arrival, ttft_s=0.2
    )  # type: ignore[arg-type]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> Store:
    s = open_store(tmp_path / "r.duckdb", clock=clock)
    yield s  # type: ignore[misc]
    s.close()


def _ingest(store: Store, clock: Clock, ids: list[str], at: float, **kw: Any) -> None:
    """One batch of ``ids`` (a vLLM and a client fragment each) first seen at ``at``."""
    clock.now = at
    store.append_fragments([f for r in ids for f in (_frag(r, **kw), _frag(r, "client", **kw))])


def _ids(store: Store, table: str) -> list[str]:
    rows = store.con.execute(f"SELECT DISTINCT request_id FROM {table} ORDER BY 1").fetchall()
    return [r[0] for r in rows]


def test_past_the_count_the_first_seen_are_deleted_with_all_their_fragments(
    store: Store, clock: Clock
) -> None:
    for i in range(5):
        _ingest(store, clock, [f"r{i}a", f"r{i}b"], T0 + i)
    pruned = prune_requests(store, now=T0 + 10, max_requests=6)
    assert (pruned.requests, pruned.fragments) == (4, 8)
    kept = ["r2a", "r2b", "r3a", "r3b", "r4a", "r4b"]
    assert _ids(store, "requests") == kept
    assert _ids(store, "request_fragments") == kept


def test_pruning_says_from_which_arrival_the_requests_kept_are_whole(
    store: Store, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newest arrival deleted, over every chunk (a diagnosis starts there)."""
    monkeypatch.setattr(retention, "PRUNE_CHUNK", 2)
    for i, arrival in enumerate((-30, -90, -10, -20, -5)):  # chunks r0 r1 | r2 r3 | r4
        _ingest(store, clock, [f"r{i}"], T0 + i, arrival=T0 + arrival)
    _ingest(store, clock, ["nil"], T0 + 5, arrival=None)
    assert prune_requests(store, now=T0 + 10, max_requests=1).whole_from == T0 - 5
    assert prune_requests(store, now=T0 + 10, max_requests=1).whole_from is None  # none went


def test_an_arrival_stamped_ahead_of_the_stores_clock_says_nothing_of_what_is_whole(
    store: Store, clock: Clock
) -> None:
    """A sender's clock a day ahead: its request deleted, the requests kept are not taken
    for whole only from tomorrow on (a diagnosis would have nothing left to read)."""
    _ingest(store, clock, ["skewed"], T0, arrival=T0 + 86_000)
    _ingest(store, clock, ["r"], T0 + 1, arrival=T0 - 1)
    _ingest(store, clock, ["kept"], T0 + 2, arrival=T0 + 1)
    pruned = prune_requests(store, now=T0 + 10, max_requests=1)
    assert pruned.requests == 2
    assert pruned.whole_from == T0 - 1


def test_past_the_hold_it_says_from_which_arrival_the_requests_kept_are_whole(
    store: Store, clock: Clock
) -> None:
    _ingest(store, clock, ["a"], T0, arrival=T0 - 20)
    _ingest(store, clock, ["ahead"], T0 + 1, arrival=T0 + 86_000)
    _ingest(store, clock, ["kept"], T0 + 2, arrival=T0 + 1)
    gone = prune_past_hold(store, max_requests=1, written_before=T0 - 60)
    assert gone.whole_from == T0 - 20


def test_past_the_hold_a_request_stamped_in_a_minute_not_written_does_not_say_how_far_the_written_lost_rows(
    store: Store, clock: Clock
) -> None:
    """A sender's clock a day ahead: its request's minute is not written, so it must not end
    the lake's revisits of the minutes that are (late fragments still land there)."""
    _ingest(store, clock, ["old"], T0, arrival=T0 - 90)
    _ingest(store, clock, ["ahead"], T0 + 1, arrival=T0 + 86_000)
    _ingest(store, clock, ["kept"], T0 + 2, arrival=T0 + 1)
    gone = prune_past_hold(store, max_requests=1, written_before=T0 - 60)
    assert (gone.requests, gone.unwritten, gone.newest_written) == (2, 1, T0 - 90)


def test_the_file_keeps_from_which_arrival_its_requests_are_whole(
    tmp_path: Path, clock: Clock
) -> None:
    """Kept in the file with the delete: a stopped sidecar's file (opened read-only, as
    ``slokit diagnose --db`` does) and its reader say it."""
    path = tmp_path / "w.duckdb"
    with open_store(path, clock=clock) as store:
        assert requests_whole_from(store.con) is None  # nothing deleted yet
        for i, arrival in enumerate((-30, -10, 0)):
            _ingest(store, clock, [f"r{i}"], T0 + i, arrival=T0 + arrival)
        prune_requests(store, now=T0 + 10, max_requests=1)
    with open_store(path, read_only=True) as stopped:
        assert requests_whole_from(stopped.con) == T0 - 10
        assert stopped.reader().requests_from == T0 - 10


def test_the_kept_mark_never_moves_back(store: Store, clock: Clock) -> None:
    """A later deletion of requests stamped earlier (a sender's clock behind) leaves the
    requests whole from where the first one said, not from before it."""
    _ingest(store, clock, ["late"], T0, arrival=T0 - 5)
    _ingest(store, clock, ["kept1"], T0 + 1, arrival=T0 + 1)
    assert prune_requests(store, now=T0 + 2, max_requests=1).whole_from == T0 - 5
    _ingest(store, clock, ["behind"], T0 + 3, arrival=T0 - 600)
    gone = prune_past_hold(store, max_requests=1, written_before=T0 - 3600)
    assert gone.whole_from == T0 + 1  # kept1, the oldest first seen
    _ingest(store, clock, ["behind2"], T0 + 4, arrival=T0 - 900)
    clock.now = T0 + 100
    assert prune_requests(store, now=T0 + 100, max_age_s=50).whole_from == T0 - 600
    assert requests_whole_from(store.con) == T0 + 1


def test_a_file_of_a_schema_before_the_mark_has_none(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.duckdb"
    with monkeypatch.context() as m:
        m.setattr("slokit.store.db.MIGRATIONS", MIGRATIONS[:10])
        with open_store(path, clock=clock) as old:
            _ingest(old, clock, ["r"], T0)
    with open_store(path, read_only=True) as stopped:  # read as it is, not migrated
        assert stopped.schema_version() == 10
        assert requests_whole_from(stopped.con) is None
        assert stopped.reader().requests_from is None


def test_past_the_age_the_first_seen_are_deleted(store: Store, clock: Clock) -> None:
    _ingest(store, clock, ["old"], T0)
    _ingest(store, clock, ["new"], T0 + 3600)
    pruned = prune_requests(store, now=T0 + 3600 + 60, max_age_s=3600)
    assert pruned.requests == 1
    assert _ids(store, "requests") == ["new"]


def test_a_request_is_as_old_as_its_first_fragment_not_its_last(store: Store, clock: Clock) -> None:
    _ingest(store, clock, ["r"], T0)
    clock.now = T0 + 3000
    store.append_fragments([_frag("r", "gateway")])  # a late fragment does not renew it
    assert prune_requests(store, now=T0 + 3700, max_age_s=3600).fragments == 3
    assert _ids(store, "request_fragments") == []


def test_the_age_is_the_stores_clock_not_the_senders(store: Store, clock: Clock) -> None:
    _ingest(store, clock, ["skewed"], T0, arrival=T0 - 30 * 86400)  # a sender a month behind
    assert prune_requests(store, now=T0 + 60, max_age_s=3600).requests == 0


def test_within_both_bounds_nothing_is_deleted(store: Store, clock: Clock) -> None:
    _ingest(store, clock, ["a", "b"], T0)
    assert prune_requests(store, now=T0 + 1, max_age_s=3600, max_requests=2).requests == 0
    assert prune_requests(store, now=T0 + 1).requests == 0
    assert _ids(store, "requests") == ["a", "b"]


def test_requests_a_lake_has_not_settled_are_kept(store: Store, clock: Clock) -> None:
    _ingest(store, clock, ["written"], T0, arrival=T0 - 120)
    _ingest(store, clock, ["pending"], T0 + 1, arrival=T0)
    _ingest(store, clock, ["no_arrival"], T0 + 2, arrival=None)  # never exported: prunable
    pruned = prune_requests(store, now=T0 + 10, max_requests=0, keep_arrivals_from=T0 - 60)
    assert pruned.requests == 2
    assert _ids(store, "requests") == ["pending"]


def test_a_backlog_is_deleted_in_chunks_to_the_bound(
    store: Store, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention, "PRUNE_CHUNK", 3)
    _ingest(store, clock, [f"r{i:02d}" for i in range(20)], T0)
    _ingest(store, clock, ["last"], T0 + 1)
    assert prune_requests(store, now=T0 + 2, max_requests=1).requests == 20
    assert _ids(store, "requests") == ["last"]


def test_past_the_hold_the_oldest_go_whatever_a_lake_has_written(
    store: Store, clock: Clock
) -> None:
    for i in range(4):  # arrived a minute apart; the lake wrote the first two minutes
        _ingest(store, clock, [f"r{i}"], T0 + i, arrival=T0 + 60 * i)
    gone = prune_past_hold(store, max_requests=1, written_before=T0 + 120)
    assert (gone.requests, gone.fragments) == (3, 6)
    assert gone.unwritten == 1  # r2 arrived in a minute the lake had not written
    assert gone.newest_written == T0 + 60  # r1, the newest of those in written minutes
    assert _ids(store, "requests") == ["r3"]


def test_within_the_hold_nothing_goes(store: Store, clock: Clock) -> None:
    _ingest(store, clock, ["a", "b"], T0)
    gone = prune_past_hold(store, max_requests=2, written_before=0.0)
    assert (gone.requests, gone.unwritten, gone.newest_written) == (0, 0, None)
    assert _ids(store, "requests") == ["a", "b"]


def test_past_the_hold_a_backlog_goes_in_chunks(
    store: Store, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention, "PRUNE_CHUNK", 3)
    _ingest(store, clock, [f"r{i:02d}" for i in range(10)], T0)
    _ingest(store, clock, ["last"], T0 + 1, arrival=T0 + 5)
    gone = prune_past_hold(store, max_requests=1, written_before=0.0)
    assert (gone.requests, gone.unwritten, gone.newest_written) == (10, 10, None)
    assert _ids(store, "requests") == ["last"]


def test_a_kept_request_still_merges_its_late_fragments(store: Store, clock: Clock) -> None:
    for i in range(3):
        _ingest(store, clock, [f"r{i}"], T0 + i)
    prune_requests(store, now=T0 + 5, max_requests=2)
    clock.now = T0 + 6
    store.append_fragments([_frag("r2", "gateway")])
    stored = store.con.execute("SELECT * EXCLUDE (updated_at) FROM requests ORDER BY 1").fetchall()
    oracle = store.con.execute(
        f"SELECT * EXCLUDE (updated_at) FROM ({merge_sql('true')}) ORDER BY 1"
    ).fetchall()
    assert stored == oracle
    assert [r[0] for r in stored] == ["r1", "r2"]


def test_requests_first_seen_together_are_cut_to_the_count_exactly(
    store: Store, clock: Clock
) -> None:
    _ingest(store, clock, [f"r{i}" for i in range(10)], T0)  # one commit: one first-seen time
    assert prune_requests(store, now=T0 + 1, max_requests=4).requests == 6
    assert _ids(store, "requests") == ["r6", "r7", "r8", "r9"]


# -- the time series: by age alone ---------------------------------------------------------


def _one_row_each(store: Store, at: float) -> None:
    """A row dated ``at`` in each of the store's time series."""
    con = store.con
    for sql in (
        "INSERT INTO engine_samples (ts, replica, model) VALUES (to_timestamp(?), 'pod-a', 'm')",
        "INSERT INTO gpu_samples (ts, gpu, source) VALUES (to_timestamp(?), '0', 'dcgm')",
        "INSERT INTO router_samples (ts, router) VALUES (to_timestamp(?), 'epp')",
        "INSERT INTO scrapes (ts, target, kind, up, samples) "
        "VALUES (to_timestamp(?), 'http://x', 'vllm', true, 1)",
        "INSERT INTO findings (rule, severity, confidence, start_ts, end_ts, summary, runbook, "
        "created_at) VALUES ('r', 'warning', 1, to_timestamp(?1), to_timestamp(?1), 's', 'rb', "
        "to_timestamp(?1))",
        "INSERT INTO ingest_rejections VALUES (to_timestamp(?), 'otlp', 'bad', 1, NULL)",
        "INSERT INTO unjoined_spans VALUES (to_timestamp(?), 'expired', 1)",
    ):
        con.execute(sql, [at])


def _rows(store: Store) -> dict[str, int]:
    return {
        t: int(store.con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0])
        for t, _ in retention.SAMPLE_TABLES
    }


def test_the_time_series_rows_past_the_age_are_deleted_and_the_newer_kept(
    store: Store,
) -> None:
    _one_row_each(store, T0 - 3600)
    _one_row_each(store, T0 - 60)
    deleted = retention.prune_samples(store, now=T0, max_age_s=900)
    assert deleted == {t: 1 for t, _ in retention.SAMPLE_TABLES}
    assert _rows(store) == {t: 1 for t, _ in retention.SAMPLE_TABLES}
    assert retention.prune_samples(store, now=T0, max_age_s=900) == {}


def test_time_series_rows_a_lake_has_not_written_are_kept(store: Store) -> None:
    _one_row_each(store, T0 - 3600)
    keep = {"engine_samples": T0 - 7200, "scrapes": T0 - 3600}  # written up to these times
    deleted = retention.prune_samples(store, now=T0, max_age_s=900, keep_from=keep)
    assert "engine_samples" not in deleted and "scrapes" not in deleted
    assert deleted["gpu_samples"] == 1
    rows = _rows(store)
    assert rows["engine_samples"] == 1 and rows["scrapes"] == 1 and rows["gpu_samples"] == 0
