"""The store's write path: requests seen for the first time are merged in memory and appended;
requests that already have fragments are re-merged from all of them. Whatever the path, the
order, the batching or the duplication, ``requests`` holds what the merge SQL computes from the
stored fragments."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import patch

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slokit.errors import BadInput
from slokit.records import FRAGMENT_FIELDS, EngineSample, HistogramSnapshot, RequestFragment
from slokit.store import append
from slokit.store.db import open_store
from slokit.store.merge import merge_sql
from slokit.store.migrations import MIGRATIONS

T0 = 1_795_958_000.0

#: INDEX_LOOKUP_COST_ROWS values that force each plan of the lookups on any store size.
PLANS = {"index lookups": 0, "one scan": 10**12}


def frag(rid: str, source: str = "vllm", n: int = 0, **kw: Any) -> RequestFragment:
    return RequestFragment(rid, source, f"{source}:{rid}:{n}", **kw)


def vllm(rid: str, n: int = 0, **kw: Any) -> RequestFragment:
    base: dict[str, Any] = dict(
        replica="pod-a", arrival_ts=T0, ttft_s=0.2, e2e_s=2.2, queue_s=0.1, output_tokens=101
    )
    return frag(rid, "vllm", n, **{**base, **kw})


def client(rid: str, n: int = 0, **kw: Any) -> RequestFragment:
    base: dict[str, Any] = dict(
        arrival_ts=T0 - 0.01, client_ttft_s=0.25, status="ok", http_status=200, model="tiny"
    )
    return frag(rid, "client", n, **{**base, **kw})


def requests_rows(con: duckdb.DuckDBPyConnection) -> list[tuple[Any, ...]]:
    return con.execute("SELECT * EXCLUDE (updated_at) FROM requests ORDER BY request_id").fetchall()


def merged_from_fragments(con: duckdb.DuckDBPyConnection) -> list[tuple[Any, ...]]:
    """The oracle: the merge SQL over every stored fragment."""
    return con.execute(
        f"SELECT * EXCLUDE (updated_at) FROM ({merge_sql('true')}) ORDER BY request_id"
    ).fetchall()


def fragment_ids(con: duckdb.DuckDBPyConnection) -> list[str]:
    rows = con.execute("SELECT fragment_id FROM request_fragments ORDER BY 1").fetchall()
    return [r[0] for r in rows]


# -- the property: any arrival gives the merge of the stored fragments ---------------------

_seconds = st.floats(0.0, 600.0, allow_nan=False) | st.none()
_fields = st.fixed_dictionaries(
    {},
    optional={
        "arrival_ts": st.floats(T0 - 60, T0 + 60, allow_nan=False),
        "first_token_ts": st.floats(T0 - 60, T0 + 60, allow_nan=False),
        "ttft_s": _seconds,
        "e2e_s": _seconds,
        "tpot_s": _seconds,
        "output_tokens": st.integers(0, 4096) | st.none(),
        "prompt_tokens": st.integers(0, 4096),
        "model": st.sampled_from(["tiny", "big"]),
        "status": st.sampled_from(["ok", "error", "timeout"]),
        "http_status": st.sampled_from([200, 429, 500]),
        "quality_pass": st.booleans(),
    },
)


@st.composite
def arrivals(draw: st.DrawFn) -> tuple[list[RequestFragment], list[list[RequestFragment]]]:
    """Distinct fragments of a few requests (several of one source and request included, and
    one fragment id under several request ids), and the batches they arrive in: shuffled,
    some sent twice (a span id always means the same span)."""
    keys = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["r1", "r2", "r3"]),
                st.sampled_from(["vllm", "gateway", "client", "quality", "other"]),
                st.integers(0, 2),
            ),
            min_size=1,
            max_size=10,
            unique=True,
        )
    )
    frags = [
        frag(rid, src, n, **draw(_fields))._replace(fragment_id=f"{src}:shared:{n}")
        if draw(st.booleans())
        else frag(rid, src, n, **draw(_fields))
        for rid, src, n in keys
    ]
    resent = draw(st.lists(st.sampled_from(frags), max_size=4))
    stream = draw(st.permutations(frags + resent))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(stream) - 1)), max_size=4)))
    bounds = [0, *cuts, len(stream)]
    return frags, [stream[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@pytest.mark.parametrize("plan", PLANS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=arrivals())
def test_any_order_batching_or_resend_gives_the_merge_of_the_stored_fragments(
    plan: str, case: tuple[list[RequestFragment], list[list[RequestFragment]]]
) -> None:
    frags, batches = case
    with (
        patch.object(append, "INDEX_LOOKUP_COST_ROWS", PLANS[plan]),
        open_store(":memory:") as store,
    ):
        for b in batches:
            store.append_fragments(b)
        assert fragment_ids(store.con) == sorted(f.fragment_id for f in frags)
        assert requests_rows(store.con) == merged_from_fragments(store.con)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=arrivals())
def test_one_batch_of_new_requests_gives_what_fragment_by_fragment_gives(
    case: tuple[list[RequestFragment], list[list[RequestFragment]]],
) -> None:
    frags, batches = case

    def clock() -> float:  # both stores ingest at the same time: first_ingested_at compared too
        return T0

    with (
        open_store(":memory:", clock=clock) as at_once,
        open_store(":memory:", clock=clock) as one_by_one,
    ):
        at_once.append_fragments([f for b in batches for f in b])
        for f in reversed(frags):
            one_by_one.append_fragments([f])
        assert requests_rows(at_once.con) == requests_rows(one_by_one.con)


# -- the cases, one by one -------------------------------------------------------------------


def test_a_new_request_is_stored_by_the_append_path_with_its_merged_row() -> None:
    with open_store(":memory:") as store:
        res = store.append_fragments([vllm("r1")])
        assert (res.received, res.new, res.requests_touched) == (1, 1, 1)
        assert store._checked_batches_left == 0  # no conflict: the next batch appends too
        assert requests_rows(store.con) == merged_from_fragments(store.con)


def test_several_fragments_of_one_new_request_in_one_batch_merge_by_precedence() -> None:
    with open_store(":memory:") as store:
        store.append_fragments(
            [client("r1", status="cancelled"), vllm("r1"), vllm("r1", 1, ttft_s=9.0)]
        )
        row = store.con.execute("SELECT status, ttft_s, sources FROM requests").fetchall()
        # the client's outcome, the vLLM fact of the smallest fragment id
        assert row == [("cancelled", 0.2, ["client", "vllm"])]
        assert requests_rows(store.con) == merged_from_fragments(store.con)


def test_a_batch_mixing_new_and_stored_requests_merges_each_with_its_fragments() -> None:
    with open_store(":memory:") as store:
        store.append_fragments([vllm("old"), vllm("other")])
        res = store.append_fragments([client("old"), vllm("new"), client("new")])
        assert res.new == 3
        assert store.con.execute(
            "SELECT request_id, sources, client_ttft_s, ttft_s FROM requests ORDER BY 1"
        ).fetchall() == [
            ("new", ["client", "vllm"], 0.25, 0.2),
            ("old", ["client", "vllm"], 0.25, 0.2),
            ("other", ["vllm"], None, 0.2),
        ]
        assert requests_rows(store.con) == merged_from_fragments(store.con)


def test_reingesting_a_batch_changes_nothing(tmp_path: Path) -> None:
    batch = [vllm(f"r{i}") for i in range(50)] + [client(f"r{i}") for i in range(0, 50, 3)]
    with open_store(tmp_path / "s.duckdb") as store:
        store.append_fragments(batch)
        before = store.con.execute("SELECT * FROM requests ORDER BY request_id").fetchall()
        again = store.append_fragments(batch)
        assert (again.received, again.new, again.requests_touched) == (67, 0, 50)
        after = store.con.execute("SELECT * FROM requests ORDER BY request_id").fetchall()
        assert after == before  # updated_at included: nothing was re-merged
        assert store.con.execute("SELECT count(*) FROM request_fragments").fetchone() == (67,)


def test_a_fragment_id_twice_in_one_batch_keeps_the_first_copy() -> None:
    with open_store(":memory:") as store:
        res = store.append_fragments([vllm("r1", ttft_s=0.3), vllm("r1", ttft_s=0.9)])
        assert (res.received, res.new) == (2, 1)
        assert store.con.execute("SELECT ttft_s FROM request_fragments").fetchall() == [(0.3,)]
        assert store.con.execute("SELECT ttft_s FROM requests").fetchall() == [(0.3,)]


def test_a_batch_that_repeats_its_own_fragment_leaves_the_next_batches_on_the_append_path() -> None:
    # The repeat sends the batch the checked way, but nothing of it was stored before: it is
    # not a re-ingest, the next batch is not checked.
    with open_store(":memory:") as store:
        store.append_fragments([vllm("r1"), vllm("r2"), vllm("r1", ttft_s=0.9)])
        assert store._checked_batches_left == 0
        with patch.object(append, "_append_checked", side_effect=AssertionError("checked")):
            store.append_fragments([vllm("r3")])
        assert requests_rows(store.con) == merged_from_fragments(store.con)
        assert store.con.execute("SELECT count(*) FROM request_fragments").fetchone() == (3,)


def test_a_fragment_id_already_stored_keeps_the_stored_copy() -> None:
    with open_store(":memory:") as store:
        store.append_fragments([vllm("r1", ttft_s=0.3)])
        res = store.append_fragments([vllm("r1", ttft_s=0.9), vllm("r2")])
        assert (res.received, res.new) == (2, 1)
        assert store.con.execute("SELECT ttft_s FROM requests ORDER BY 1").fetchall() == [
            (0.2,),
            (0.3,),
        ]


def test_a_resent_fragment_beside_new_ones_leaves_its_request_as_it_was() -> None:
    now = [T0]
    with open_store(":memory:", clock=lambda: now[0]) as store:
        store.append_fragments([vllm("r1"), vllm("r2")])
        before = store.con.execute("SELECT * FROM requests ORDER BY 1").fetchall()
        now[0] += 60.0
        store.append_fragments([vllm("r1"), client("r2"), vllm("r3")])
        after = store.con.execute("SELECT * FROM requests ORDER BY 1").fetchall()
        assert after[0] == before[0]  # r1: nothing new, updated_at included
        assert after[1] != before[1]  # r2: re-merged with its client fragment
        assert requests_rows(store.con) == merged_from_fragments(store.con)


def test_a_fragment_id_under_a_second_request_id_is_a_fragment_of_each_request() -> None:
    with open_store(":memory:") as store:
        store.append_fragments([vllm("r1")])
        reused = vllm("r2", ttft_s=0.9)._replace(fragment_id="vllm:r1:0")
        res = store.append_fragments([reused, vllm("r3")])
        assert res.new == 2
        assert store.con.execute(
            "SELECT request_id, ttft_s FROM requests ORDER BY 1"
        ).fetchall() == [
            ("r1", 0.2),
            ("r2", 0.9),
            ("r3", 0.2),
        ]


@pytest.mark.parametrize("batches", ["one batch", "r1 first", "r2 first"])
def test_one_fragment_id_under_two_request_ids_is_stored_alike_in_any_order(batches: str) -> None:
    one = vllm("r1", ttft_s=0.3)._replace(fragment_id="vllm:span")
    two = vllm("r2", ttft_s=0.9)._replace(fragment_id="vllm:span")
    arrivals = {"one batch": [[one, two]], "r1 first": [[one], [two]], "r2 first": [[two], [one]]}
    with open_store(":memory:") as store:
        for batch in arrivals[batches]:
            store.append_fragments(batch)
        assert store.con.execute(
            "SELECT request_id, fragment_id, ttft_s FROM request_fragments ORDER BY 1"
        ).fetchall() == [("r1", "vllm:span", 0.3), ("r2", "vllm:span", 0.9)]
        assert requests_rows(store.con) == merged_from_fragments(store.con)


def test_after_a_conflict_batches_are_checked_until_enough_are_new() -> None:
    with open_store(":memory:") as store:
        store.append_fragments([vllm("r0")])
        store.append_fragments([vllm("r0")])  # a resent span
        assert store._checked_batches_left == append.CHECKED_BATCHES
        for i in range(append.CHECKED_BATCHES):
            store.append_fragments([vllm(f"n{i}")])
        assert store._checked_batches_left == 0
        assert requests_rows(store.con) == merged_from_fragments(store.con)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("request_id", None, "without request_id"),
        ("source", None, "without source"),
        ("fragment_id", None, "without fragment_id"),
        ("prompt_tokens", "many", "field prompt_tokens"),
        ("ttft_s", "fast", "field ttft_s"),
        ("arrival_ts", "yesterday", "field arrival_ts"),
        ("quality_pass", [True], "field quality_pass"),
        ("ttft_s", float("nan"), "out of range"),
        ("e2e_s", 1e300, "out of range"),
    ],
)
def test_a_bad_fragment_is_bad_input_and_its_batch_writes_nothing(
    field: str, value: Any, message: str
) -> None:
    with open_store(":memory:") as store:
        store.append_fragments([vllm("kept")])
        bad = vllm("r1")._replace(**{field: value})
        with pytest.raises(BadInput, match=message):
            store.append_fragments([vllm("r0"), bad])
        assert fragment_ids(store.con) == ["vllm:kept:0"]
        assert store.con.execute("SELECT request_id FROM requests").fetchall() == [("kept",)]


def _field_values(name: str) -> st.SearchStrategy[Any]:
    typ = append.FRAGMENT_TYPES[name]
    if name in ("request_id", "source", "fragment_id"):
        return st.text(min_size=1, max_size=8)
    if typ == append.TS:  # within what a microsecond timestamp holds: the one-conversion path
        return st.none() | st.floats(-1e11, 1e11)
    if typ == pa.float64():
        return st.none() | st.floats(allow_nan=True, allow_infinity=False, width=64)
    if typ == pa.int32():
        return st.none() | st.integers(-(2**31), 2**31 - 1)
    if typ == pa.int64():
        return st.none() | st.integers(-(2**63), 2**63 - 1)
    if typ == pa.bool_():
        return st.none() | st.booleans()
    return st.none() | st.text(max_size=8)


_FRAGMENTS = st.lists(
    st.builds(RequestFragment, **{n: _field_values(n) for n in FRAGMENT_FIELDS}), max_size=12
)


@settings(max_examples=200, deadline=None)
@given(fragments=_FRAGMENTS)
def test_fragments_become_the_same_table_as_built_field_by_field(
    fragments: list[RequestFragment],
) -> None:
    def table_or_error(build: Callable[[list[RequestFragment]], pa.Table]) -> Any:
        try:
            table = build(fragments)
        except BadInput as exc:
            return str(exc)
        as_ints = [c.cast(pa.int64()) if c.type == append.TS else c for c in table.columns]
        return table.schema, repr([c.to_pylist() for c in as_ints])  # repr: NaN equals NaN

    assert table_or_error(append.fragments_table) == table_or_error(
        append.fragments_table_by_column
    )


def test_fragments_of_the_right_types_go_to_arrow_in_one_conversion() -> None:
    with patch.object(append, "fragments_table_by_column", side_effect=AssertionError):
        table = append.fragments_table([vllm("r1"), frag("r2", "client", client_ttft_s=0.3)])
    assert table.column("client_ttft_s").to_pylist() == [None, 0.3]
    assert table.column("arrival_ts").cast(pa.int64()).to_pylist() == [int(T0 * 1e6), None]


def test_fragment_columns_follow_the_tables() -> None:
    with open_store(":memory:") as store:
        cols = [r[0] for r in store.con.execute("DESCRIBE request_fragments").fetchall()]
        assert cols == append.FRAGMENT_TABLE_COLUMNS
        rows = append.merge_batch(append.fragments_table([vllm("r1")]))
        cols = [r[0] for r in store.con.execute("DESCRIBE requests").fetchall()]
        assert cols == [*rows.column_names, "updated_at", "first_ingested_at"]


# -- engine samples: histograms in the row -------------------------------------------------


def _histogram(metric: str, scale: float = 1.0) -> HistogramSnapshot:
    return HistogramSnapshot(
        metric, [0.1, 1.0, float("inf")], [1 * scale, 3 * scale, 4 * scale], 2.5, 4 * scale
    )


@pytest.mark.parametrize("samples", [1, 3])
def test_engine_samples_keep_their_histograms_readable_as_rows(samples: int) -> None:
    hists = [_histogram(f"m{k}", k + 1) for k in range(12)]
    with open_store(":memory:") as store:
        n = store.append_engine_samples(
            [
                EngineSample(
                    T0 + i, "pod-a", "tiny", running=i, histograms={h.metric: h for h in hists}
                )
                for i in range(samples)
            ]
        )
        assert n == samples
        assert store.con.execute("SELECT count(*) FROM engine_samples").fetchone() == (samples,)
        rows = store.con.execute(
            "SELECT metric, upper_bounds, cumulative_counts, sum, count FROM histogram_samples "
            "WHERE ts = to_timestamp(?) ORDER BY metric",
            [T0],
        ).fetchall()
        assert rows == sorted(
            (h.metric, h.upper_bounds, h.cumulative_counts, h.sum, h.count) for h in hists
        )
        assert store.con.execute("SELECT count(*) FROM histogram_samples").fetchone() == (
            12 * samples,
        )


def test_few_and_many_engine_samples_are_stored_alike() -> None:
    """A scrape's few samples go in as parameters, a file's many through Arrow: same rows."""
    samples = [
        EngineSample(
            T0 + i * 0.1234567,
            f"pod-{i % 2}",
            "tiny",
            engine=None if i % 3 else "0",
            running=None if i % 2 else float(i),
            kv_usage_ratio=0.5,
            request_success_by_reason={"stop": float(i), "length": 1.0} if i % 2 else {},
            histograms={"ttft_s": _histogram("ttft_s", i + 1)} if i % 3 else {},
        )
        for i in range(append.ENGINE_PARAMS_MAX + 1)
    ]
    query = "SELECT * FROM engine_samples ORDER BY ts"
    with open_store(":memory:") as few, open_store(":memory:") as many:
        for s in samples:
            few.append_engine_samples([s])
        many.append_engine_samples(samples)
        assert few.con.execute(query).fetchall() == many.con.execute(query).fetchall()


def test_an_engine_sample_without_histograms_is_stored() -> None:
    with open_store(":memory:") as store:
        store.append_engine_samples([EngineSample(T0, "pod-a", "tiny", waiting=2)])
        assert store.con.execute("SELECT waiting FROM engine_samples").fetchall() == [(2.0,)]
        assert store.con.execute("SELECT count(*) FROM histogram_samples").fetchone() == (0,)


# -- migrations of a file written by the first schema --------------------------------------


def _version_1_file(path: Path) -> None:
    con = duckdb.connect(str(path))
    con.execute("SET TimeZone = 'UTC'")
    con.execute(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
        "applied_at TIMESTAMPTZ NOT NULL)"
    )
    con.execute(MIGRATIONS[0].sql)
    con.execute("INSERT INTO schema_migrations VALUES (1, 'initial schema', now())")
    con.execute(
        "INSERT INTO request_fragments (fragment_id, request_id, source, ingested_at, ttft_s) "
        "VALUES ('vllm:a', 'a', 'vllm', now(), 0.5), ('vllm:b', 'b', 'vllm', now(), 0.7)"
    )
    con.execute(
        "INSERT INTO requests (request_id, ttft_s, status, sources, updated_at) VALUES "
        "('a', 0.5, 'ok', ['vllm'], now()), ('b', 0.7, 'ok', ['vllm'], now()), "
        "('b', 0.7, 'ok', ['vllm'], now())"
    )
    con.execute(
        "INSERT INTO engine_samples (ts, replica, model, running) VALUES "
        "(to_timestamp(1), 'pod-a', 'tiny', 3), (to_timestamp(2), 'pod-a', 'tiny', 4)"
    )
    con.execute(
        "INSERT INTO histogram_samples VALUES "
        "(to_timestamp(1), 'pod-a', 'tiny', 'ttft_s', [1.0, 'inf'::DOUBLE], [2, 5], 3.5, 5), "
        "(to_timestamp(1), 'pod-a', 'tiny', 'e2e_s', [1.0, 'inf'::DOUBLE], [1, 5], 9.5, 5), "
        "(to_timestamp(3), 'pod-b', 'tiny', 'ttft_s', [1.0, 'inf'::DOUBLE], [0, 1], 1.5, 1)"
    )
    con.close()


def test_migrating_a_version_1_file_keys_requests_by_id_and_keeps_one_row_each(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v1.duckdb"
    _version_1_file(path)
    with open_store(path) as store:
        assert store.con.execute(
            "SELECT request_id, ttft_s FROM requests ORDER BY 1"
        ).fetchall() == [("a", 0.5), ("b", 0.7)]
        res = store.append_fragments([client("a"), vllm("c")])
        assert res.new == 2
        assert requests_rows(store.con) == merged_from_fragments(store.con)


def test_migrating_a_version_1_file_keeps_every_histogram_row(tmp_path: Path) -> None:
    path = tmp_path / "v1.duckdb"
    _version_1_file(path)
    with open_store(path) as store:
        rows = store.con.execute(
            "SELECT epoch(ts), replica, metric, cumulative_counts, sum FROM histogram_samples "
            "ORDER BY 1, 2, 3"
        ).fetchall()
        assert rows == [
            (1.0, "pod-a", "e2e_s", [1.0, 5.0], 9.5),
            (1.0, "pod-a", "ttft_s", [2.0, 5.0], 3.5),
            (3.0, "pod-b", "ttft_s", [0.0, 1.0], 1.5),
        ]
        # the engine rows stay as they were; a histogram without one got a row of its own
        assert store.con.execute(
            "SELECT epoch(ts), replica, running FROM engine_samples ORDER BY 1"
        ).fetchall() == [(1.0, "pod-a", 3.0), (2.0, "pod-a", 4.0), (3.0, "pod-b", None)]
