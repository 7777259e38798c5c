"""Storage faults: a truncated, foreign or newer file is refused with its reason and left as
it was; a WAL's framing is read as DuckDB replays it; a full volume is a storage fault that
the sidecar reports on /readyz, and a graceful close checkpoints."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import duckdb
import httpx
import pytest
from prometheus_client import CollectorRegistry

from slokit.errors import BadInput
from slokit.ingest import ingest_metrics, ingest_otlp
from slokit.sidecar.config import SidecarConfig
from slokit.sidecar.discovery import discovery_path
from slokit.sidecar.runner import Sidecar
from slokit.store.db import open_store
from slokit.store.faults import StorageFault, inspect_wal, storage_fault
from slokit.store.migrations import LATEST_VERSION


@pytest.fixture(scope="module")
def slokit_db_image(vllm_fixtures: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a real, checkpointed slokit database: 64 requests and an engine sample."""
    db = tmp_path_factory.mktemp("image") / "image.duckdb"
    with open_store(db) as store:
        ingest_otlp(store, [vllm_fixtures / "otlp"], replica="pod-a")
        ingest_metrics(store, [vllm_fixtures / "metrics_after_load.prom"], instance="pod-a")
    assert not Path(f"{db}.wal").exists()
    return db.read_bytes()


def _cuts() -> list[tuple[str, Callable[[int], int]]]:
    return [
        ("last 1000 bytes", lambda n: n - 1000),
        ("half", lambda n: n // 2),
        ("headers and 100 bytes", lambda n: 3 * 4096 + 100),
        ("inside the headers", lambda n: 5000),
    ]


@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "read-write"])
@pytest.mark.parametrize(("cut", "at"), _cuts(), ids=[c for c, _ in _cuts()])
def test_a_truncated_file_is_refused_with_the_reason_and_left_as_it_was(
    slokit_db_image: bytes, tmp_path: Path, cut: str, at: Callable[[int], int], read_only: bool
) -> None:
    db = tmp_path / "cut.duckdb"
    data = slokit_db_image[: at(len(slokit_db_image))]
    db.write_bytes(data)
    with pytest.raises(BadInput) as err:
        open_store(db, read_only=read_only)
    msg = str(err.value)
    assert str(db) in msg and "\n" not in msg
    assert "truncated" in msg or "Could not read" in msg
    assert db.read_bytes() == data
    assert not Path(f"{db}.wal").exists()


def test_verify_finds_table_blocks_beyond_the_end_of_the_file(
    slokit_db_image: bytes, tmp_path: Path
) -> None:
    """The deep check (the sidecar's) reads each table's segments: the last block cut off."""
    db = tmp_path / "cut.duckdb"
    db.write_bytes(slokit_db_image[: len(slokit_db_image) - 262144])
    with pytest.raises(BadInput, match="truncated"):
        open_store(db, verify=True)


def _foreign(path: Path) -> None:
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE requests (id INTEGER, body VARCHAR)")
    con.execute("INSERT INTO requests VALUES (1, 'not slokit''s')")
    con.close()


@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "read-write"])
def test_a_file_with_foreign_tables_is_refused_and_gets_no_schema_migrations(
    tmp_path: Path, read_only: bool
) -> None:
    db = tmp_path / "theirs.duckdb"
    _foreign(db)
    with pytest.raises(BadInput, match=r"not a slokit database.*main\.requests"):
        open_store(db, read_only=read_only)
    con = duckdb.connect(str(db), read_only=True)
    try:
        tables = con.execute("SELECT table_name FROM duckdb_tables()").fetchall()
        assert tables == [("requests",)]
        assert con.execute("SELECT * FROM requests").fetchall() == [(1, "not slokit's")]
    finally:
        con.close()


def test_an_empty_duckdb_file_is_taken_and_migrated(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    duckdb.connect(str(db)).close()
    with open_store(db) as store:
        assert store.schema_version() == LATEST_VERSION


@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "read-write"])
def test_a_schema_newer_than_the_code_is_refused(
    slokit_db_image: bytes, tmp_path: Path, read_only: bool
) -> None:
    db = tmp_path / "future.duckdb"
    db.write_bytes(slokit_db_image)
    con = duckdb.connect(str(db))
    con.execute("INSERT INTO schema_migrations VALUES (999, 'from the future', now())")
    con.close()
    with pytest.raises(BadInput, match=rf"schema version 999, newer than .*\({LATEST_VERSION}\)"):
        open_store(db, read_only=read_only)


def test_closing_a_writable_store_checkpoints_its_wal_into_the_file(
    vllm_fixtures: Path, tmp_path: Path
) -> None:
    db = tmp_path / "close.duckdb"
    store = open_store(db)
    store.con.execute("SET wal_autocheckpoint = '1TB'")
    ingest_otlp(store, [vllm_fixtures / "otlp" / "export_06.pb"], replica="pod-a")
    wal = Path(f"{db}.wal")
    assert wal.stat().st_size > 0
    store.close()
    assert not wal.exists() or wal.stat().st_size == 0
    with open_store(db, read_only=True) as again:
        assert again.con.execute("SELECT count(*) FROM requests").fetchone() == (64,)


# -- the WAL, walked as DuckDB replays it ---------------------------------------------------


@pytest.fixture(scope="module")
def three_commits(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes, list[int]]:
    """(database image, WAL image, WAL size after each of three commits of 10 rows)."""
    db = tmp_path_factory.mktemp("wal") / "w.duckdb"
    con = duckdb.connect(str(db))
    con.execute("SET wal_autocheckpoint = '1TB'")
    con.execute("CREATE TABLE t (i INTEGER, s VARCHAR)")
    con.execute("CHECKPOINT")
    wal = Path(f"{db}.wal")
    sizes = []
    for k in range(3):
        con.execute(
            "INSERT INTO t SELECT range, 'x' || range FROM range(?, ?)", [10 * k, 10 * k + 10]
        )
        sizes.append(wal.stat().st_size)
    image, wal_image = db.read_bytes(), wal.read_bytes()
    con.close()
    return image, wal_image, sizes


def _replayed_rows(tmp_path: Path, image: bytes, wal: bytes) -> int:
    db = tmp_path / "replay.duckdb"
    db.write_bytes(image)
    Path(f"{db}.wal").write_bytes(wal)
    con = duckdb.connect(str(db))
    try:
        return int(con.execute("SELECT count(*) FROM t").fetchone()[0])  # type: ignore[index]
    finally:
        con.close()


WAL_CUTS: list[tuple[str, Callable[[list[int]], int], str, int]] = [
    # (case, where the WAL ends, what the walk says, commits DuckDB replays)
    ("whole", lambda s: s[2], "clean", 3),
    ("at the second commit", lambda s: s[1], "clean", 2),
    ("one byte short of the last commit", lambda s: s[2] - 1, "torn_tail", 2),
    ("inside the last entry's frame header", lambda s: s[1] + 9, "torn_tail", 2),
    ("in the middle of the last transaction", lambda s: (s[1] + s[2]) // 2, "torn_tail", 2),
    ("just after the first commit", lambda s: s[0] + 1, "torn_tail", 1),
    ("inside the header", lambda s: 20, "torn_tail", 0),
]


@pytest.mark.parametrize(
    ("case", "end", "state", "commits"), WAL_CUTS, ids=[c[0] for c in WAL_CUTS]
)
def test_the_wal_walk_agrees_with_what_duckdb_replays(
    three_commits: tuple[bytes, bytes, list[int]], tmp_path: Path,
    case: str, end: Callable[[list[int]], int], state: str, commits: int,
) -> None:  # fmt: skip
    image, wal_image, sizes = three_commits
    cut = wal_image[: end(sizes)]
    path = tmp_path / "cut.wal"
    path.write_bytes(cut)
    check = inspect_wal(path)
    assert check is not None
    assert (check.state, check.commits) == (state, commits)
    assert check.dropped == len(cut) - (sizes[commits - 1] if commits else check.committed)
    assert _replayed_rows(tmp_path, image, cut) == 10 * commits


@pytest.mark.parametrize(
    "tail", [b"\x00" * 40, b"\xff" * 40, random.Random(7).randbytes(300)],
    ids=["zeros", "ones", "random"],
)  # fmt: skip
def test_garbage_after_the_last_commit_is_a_torn_tail(
    three_commits: tuple[bytes, bytes, list[int]], tmp_path: Path, tail: bytes
) -> None:
    image, wal_image, _ = three_commits
    path = tmp_path / "garbage.wal"
    path.write_bytes(wal_image + tail)
    check = inspect_wal(path)
    assert check is not None and check.state == "torn_tail"
    assert (check.commits, check.dropped) == (3, len(tail))
    assert _replayed_rows(tmp_path, image, wal_image + tail) == 30


def test_a_wal_of_random_bytes_is_unreadable_and_duckdb_ignores_it(
    three_commits: tuple[bytes, bytes, list[int]], tmp_path: Path
) -> None:
    image, _, _ = three_commits
    junk = random.Random(1).randbytes(700)
    path = tmp_path / "junk.wal"
    path.write_bytes(junk)
    check = inspect_wal(path)
    assert check is not None and (check.state, check.dropped) == ("unreadable", 700)
    assert _replayed_rows(tmp_path, image, junk) == 0


def test_no_wal_or_an_empty_one_has_nothing_to_say(tmp_path: Path) -> None:
    assert inspect_wal(tmp_path / "absent.wal") is None
    (tmp_path / "empty.wal").write_bytes(b"")
    assert inspect_wal(tmp_path / "empty.wal") is None


# -- a full volume --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "fault"),
    [
        (OSError(28, "No space left on device", "x.wal"), True),
        (duckdb.TransactionException('Failed to commit: Could not write file "x.wal": File too large'), True),
        (duckdb.IOException("IO Error: Could not read enough bytes"), True),
        (duckdb.FatalException("database has been invalidated"), True),
        (StorageFault("x: commit failed: disk full"), True),
        (duckdb.ConstraintException("Duplicate key \"request_id: r1\""), False),
        (duckdb.TransactionException("Conflict on update"), False),
        (ValueError("bad value"), False),
    ],
    ids=["ENOSPC", "commit-efbig", "io", "invalidated", "storage-fault", "constraint",
         "conflict", "value"],
)  # fmt: skip
def test_storage_faults_are_told_from_errors_of_the_data(error: Exception, fault: bool) -> None:
    assert (storage_fault(error) is not None) is fault


_FULL_VOLUME = textwrap.dedent(
    """
    import json, resource, sys
    from slokit.records import RequestFragment
    from slokit.store.db import open_store

    def batch(i):
        return [RequestFragment(request_id=f"r{i}-{j}", source="vllm",
                                fragment_id=f"vllm:{i}-{j}", replica="p",
                                arrival_ts=1.8e9 + j, ttft_s=0.1, e2e_s=1.0)
                for j in range(500)]

    store = open_store(sys.argv[1])
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    # the volume "fills": no file may grow past 200 kB, so the WAL soon cannot
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, hard))
    errors = []
    for i in range(100):
        try:
            store.append_fragments(batch(i))
        except Exception as exc:
            errors.append((type(exc).__name__, store.storage_error))
            break
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space again
    store.append_fragments(batch(1000))
    print(json.dumps({"errors": errors, "after": store.storage_error}))
    """
)


def test_a_commit_on_a_full_volume_is_a_storage_fault_until_a_write_succeeds(
    tmp_path: Path,
) -> None:
    """RLIMIT_FSIZE makes the kernel refuse writes past 200 kB (EFBIG), as a full volume."""
    out = subprocess.run(
        [sys.executable, "-c", _FULL_VOLUME, str(tmp_path / "full.duckdb")],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    ((kind, reason),) = doc["errors"]
    assert kind == "StorageFault" and "File too large" in reason
    assert doc["after"] is None


def test_a_damaged_file_stays_a_storage_fault_when_a_later_write_avoids_the_damage(
    slokit_db_image: bytes, tmp_path: Path
) -> None:
    """Samples are appended without reading old blocks; a merge of requests reads them."""
    from slokit.records import EngineSample, RequestFragment

    data = bytearray(slokit_db_image)
    rng = random.Random(3)
    for off in range(3 * 4096 + 262144, len(data), 4096):  # every data block but the first
        data[off : off + 64] = rng.randbytes(64)
    db = tmp_path / "scribbled.duckdb"
    db.write_bytes(bytes(data))
    store = open_store(db)
    try:
        with pytest.raises(Exception, match="checksum"):
            store.append_fragments(
                [RequestFragment("r24", "quality", "quality:r24", quality_pass=True)]
            )
        assert store.storage_error is not None and "checksum" in store.storage_error
        store.append_engine_samples([EngineSample(ts=1.8e9, replica="p", model="m")])
        assert store.storage_error is not None and "checksum" in store.storage_error
    finally:
        store.close()


def test_a_discovery_file_that_cannot_be_written_does_not_stop_the_sidecar(
    vllm_fixtures: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The discovery file's temporary is a link to /dev/full: writing it fails with ENOSPC."""
    db = tmp_path / "s.duckdb"
    tmp = discovery_path(db).with_name(discovery_path(db).name + ".tmp")
    tmp.symlink_to("/dev/full")
    cfg = replace(SidecarConfig(), db=str(db), listen="127.0.0.1:0", otlp_http="127.0.0.1:0",
                  otlp_grpc=None, replica="p")  # fmt: skip
    body = (vllm_fixtures / "otlp" / "export_06.pb").read_bytes()

    async def scenario() -> tuple[int, int]:
        sc = Sidecar(cfg, registry=CollectorRegistry())
        await sc.start()
        try:
            async with httpx.AsyncClient() as client:
                ready = await client.get(f"http://127.0.0.1:{sc.ports['api']}/readyz")
                posted = await client.post(
                    f"http://127.0.0.1:{sc.ports['otlp_http']}/v1/traces", content=body,
                    headers={"Content-Type": "application/x-protobuf"}, timeout=30,
                )  # fmt: skip
            return ready.status_code, posted.status_code
        finally:
            await sc.stop()

    assert asyncio.run(scenario()) == (200, 200)
    assert "running without it" in caplog.text and "No space left on device" in caplog.text
    assert not discovery_path(db).exists() and not os.path.lexists(tmp)
    with open_store(db, read_only=True) as store:
        assert store.con.execute("SELECT count(*) FROM requests").fetchone() == (64,)


@pytest.mark.parametrize(("cut", "at"), _cuts(), ids=[c for c, _ in _cuts()])
def test_a_sidecar_refuses_a_truncated_file_with_the_reason(
    slokit_db_image: bytes, tmp_path: Path, cut: str, at: Callable[[int], int]
) -> None:
    """The sidecar does not start (the CLI exits 2 with this line: tests/cli)."""
    db = tmp_path / "cut.duckdb"
    db.write_bytes(slokit_db_image[: at(len(slokit_db_image))])
    cfg = replace(SidecarConfig(), db=str(db), listen="127.0.0.1:0", otlp_http=None,
                  otlp_grpc=None, replica="p")  # fmt: skip
    with pytest.raises(BadInput, match=r"truncated|Could not read") as err:
        asyncio.run(Sidecar(cfg, registry=CollectorRegistry()).start())
    assert "\n" not in str(err.value)
