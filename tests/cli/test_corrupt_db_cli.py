"""Every command that opens the store, on a database that is truncated, random bytes,
scribbled over, someone else's or from a newer slokit: exit 2 and one line that says why,
never a traceback, and the file as it was."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from slokit.cli import main
from slokit.ingest import ingest_metrics, ingest_otlp
from slokit.store.db import open_store

REPO = Path(__file__).resolve().parents[2]
SPEC = str(REPO / "examples" / "slo" / "chat.yaml")
BLOCK = 262144


@pytest.fixture(scope="module")
def image(vllm_fixtures: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A real slokit database (64 requests, an engine sample), checkpointed."""
    db = tmp_path_factory.mktemp("image") / "image.duckdb"
    with open_store(db) as store:
        ingest_otlp(store, [vllm_fixtures / "otlp"], replica="pod-a")
        ingest_metrics(store, [vllm_fixtures / "metrics_after_load.prom"], instance="pod-a")
    return db.read_bytes()


def _truncated(image: bytes, db: Path) -> None:
    db.write_bytes(image[: len(image) // 2])


def _random_bytes(image: bytes, db: Path) -> None:
    db.write_bytes(random.Random(11).randbytes(len(image)))


def _scribbled(image: bytes, db: Path) -> None:
    """Every table data block but the first gets 64 random bytes per 4 KiB: checksums fail on
    read, while the catalog opens."""
    data = bytearray(image)
    rng = random.Random(3)
    for off in range(3 * 4096 + BLOCK, len(data), 4096):
        data[off : off + 64] = rng.randbytes(64)
    db.write_bytes(bytes(data))


def _foreign(image: bytes, db: Path) -> None:
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE requests (id INTEGER, body VARCHAR)")
    con.close()


def _newer(image: bytes, db: Path) -> None:
    db.write_bytes(image)
    con = duckdb.connect(str(db))
    con.execute("INSERT INTO schema_migrations VALUES (999, 'from the future', now())")
    con.close()


#: (kind, how the file is damaged, what the one line must say)
KINDS: list[tuple[str, Callable[[bytes, Path], None], str]] = [
    ("truncated", _truncated, "truncated"),
    ("random-bytes", _random_bytes, "not a valid DuckDB database"),
    ("scribbled", _scribbled, "checksum"),
    ("foreign", _foreign, "not a slokit database"),
    ("newer-schema", _newer, "newer than this slokit"),
]


def _commands(fixtures: Path, tmp: Path) -> dict[str, list[str]]:
    return {
        "explain": ["explain", "r24"],
        "diagnose": ["diagnose"],
        "diagnose --save": ["diagnose", "--save"],
        "slo report": ["slo", "report", "--slo", SPEC],
        "gate": ["gate", "--slo", SPEC],
        "report": ["report", "--slo", SPEC, "--out", str(tmp / "r.html")],
        "capacity": ["capacity", "--slo", SPEC],
        "ingest otlp": ["ingest", "otlp", str(fixtures / "otlp" / "export_06.pb")],
        "ingest metrics": [
            "ingest",
            "metrics",
            str(fixtures / "metrics_after_load.prom"),
            "--instance",
            "a",
        ],
        "ingest requests": ["ingest", "requests", str(tmp / "client.jsonl")],
        "ingest quality": ["ingest", "quality", str(tmp / "q.csv")],
    }


COMMANDS = list(_commands(Path("."), Path(".")))
#: Appending samples reads no existing block: a file scribbled over elsewhere takes them.
NOT_TOLD = {("scribbled", "ingest metrics")}
CASES = [
    pytest.param(kind, damage, says, cmd, id=f"{kind}-{cmd}")
    for kind, damage, says in KINDS
    for cmd in COMMANDS
    if (kind, cmd) not in NOT_TOLD
]


@pytest.mark.parametrize(("kind", "damage", "says", "command"), CASES)
def test_a_damaged_database_is_exit_2_with_one_line(
    image: bytes, vllm_fixtures: Path, tmp_path: Path, command: str, kind: str,
    damage: Callable[[bytes, Path], None], says: str,
) -> None:  # fmt: skip
    db = tmp_path / "bad.duckdb"
    damage(image, db)
    before = db.read_bytes()
    (tmp_path / "client.jsonl").write_text(
        '{"request_id": "c1", "start_ts": 1795958400.0, "ttft_s": 0.1, "e2e_s": 1.0, '
        '"status": "ok", "output_tokens": 10}\n'
    )
    (tmp_path / "q.csv").write_text("request_id,quality_pass\nr1,true\n")
    args = [*_commands(vllm_fixtures, tmp_path)[command], "--db", str(db)]

    res = CliRunner().invoke(main, args)

    assert res.exit_code == 2, (res.output, res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slokit: "), res.stderr
    assert says in lines[0] and str(db) in lines[0]
    assert "Traceback" not in res.output
    assert db.read_bytes() == before
    assert not Path(f"{db}.wal").exists()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slokit", *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "ignore"}, check=False,
    )  # fmt: skip


#: Damage the sidecar finds before it serves (the rest: see the scribbled test below).
AT_START = [k for k in KINDS if k[0] != "scribbled"]


@pytest.mark.parametrize(("kind", "damage", "says"), AT_START, ids=[k[0] for k in AT_START])
def test_the_sidecar_on_a_damaged_database_exits_2_with_one_line(
    image: bytes, tmp_path: Path, kind: str, damage: Callable[[bytes, Path], None], says: str
) -> None:
    db = tmp_path / "bad.duckdb"
    damage(image, db)
    before = db.read_bytes()
    res = _run("sidecar", "--db", str(db), "--listen", "127.0.0.1:0", "--otlp-http",
               "127.0.0.1:0", "--otlp-grpc", "", "--replica", "p")  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("slokit: ") and says in last, res.stderr
    assert db.read_bytes() == before


@pytest.mark.parametrize("cut", [0.1, 0.5, 0.9, 0.999])
def test_explain_on_a_file_cut_anywhere_is_exit_2_without_a_traceback(
    image: bytes, tmp_path: Path, cut: float
) -> None:
    """A real process, as an operator runs it (the in-process runner hides nothing here)."""
    db = tmp_path / "cut.duckdb"
    db.write_bytes(image[: int(len(image) * cut)])
    res = _run("explain", "r24", "--db", str(db))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def _port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("commit_interval", ["0", "1"], ids=["commit-per-batch", "journal"])
def test_the_sidecar_on_a_scribbled_database_turns_not_ready_at_the_first_failed_write(
    image: bytes, tmp_path: Path, commit_interval: str
) -> None:
    """Damage inside table data is found by the first write that reads it (checking every
    block at start would read the whole file): from then on /readyz is 503 with the reason,
    and stays so, rather than ready while every export gets 503. With the journal the first
    write is acknowledged once journaled; its commit meets the damage, and what comes after
    it is refused."""
    import time

    import httpx

    db = tmp_path / "bad.duckdb"
    _scribbled(image, db)
    api, otlp = _port(), _port()
    env = {**os.environ, "SLOKIT_COMMIT_INTERVAL_S": commit_interval}
    with (tmp_path / "sidecar.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "slokit", "sidecar", "--db", str(db), "--replica", "p",
             "--listen", f"127.0.0.1:{api}", "--otlp-http", f"127.0.0.1:{otlp}",
             "--otlp-grpc", ""],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip

        def ready() -> httpx.Response:
            return httpx.get(f"http://127.0.0.1:{api}/readyz", timeout=30)

        def feedback(rid: str) -> httpx.Response:
            return httpx.post(f"http://127.0.0.1:{api}/v1/feedback", timeout=30,
                              json=[{"request_id": rid, "quality_pass": True}])  # fmt: skip

        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, (tmp_path / "sidecar.log").read_text()
                try:
                    if ready().status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "never ready"
                time.sleep(0.1)
            # a quality result for a stored request: its merge reads the damaged blocks
            r = feedback("r24")
            if commit_interval == "1":
                assert r.status_code == 200, r.text  # in the journal, synced
                deadline = time.monotonic() + 60
                while ready().status_code == 200:  # until the journal's commit fails
                    assert time.monotonic() < deadline, "the failed commit never showed"
                    time.sleep(0.1)
                r = feedback("r25")
            # a fault of the storage, not of the records: retryable, never a 500 or a 422
            assert r.status_code == 503 and "Retry-After" in r.headers, r.text
            answer = ready()
            assert answer.status_code == 503 and "checksum" in answer.json()["reason"]
        finally:
            proc.terminate()
            proc.wait(30)


def _fsize_30k() -> None:
    import resource

    resource.setrlimit(
        resource.RLIMIT_FSIZE, (30_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1])
    )


def test_ingest_on_a_full_volume_is_exit_2_with_one_line(
    vllm_fixtures: Path, tmp_path: Path
) -> None:
    """RLIMIT_FSIZE: the kernel refuses writes past 30 kB (EFBIG), as a full volume would."""
    db = tmp_path / "full.duckdb"
    res = subprocess.run(
        [sys.executable, "-m", "slokit", "ingest", "otlp", str(vllm_fixtures / "otlp"),
         "--db", str(db)],
        capture_output=True, text=True, timeout=120, check=False, preexec_fn=_fsize_30k,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"slokit: cannot write the database {db}: ")
    assert "File too large" in line


def test_a_damaged_parquet_file_in_a_lake_is_blamed_on_the_lake(tmp_path: Path) -> None:
    """Not on ``slokit.duckdb``, a file the command never opened."""
    part = tmp_path / "lake" / "requests" / "date=2026-11-29" / "hour=13" / "minute=18"
    (part / "replica=x").mkdir(parents=True)
    (part / "replica=x" / "part_w.parquet").write_bytes(b"not parquet\n")
    res = CliRunner().invoke(main, ["diagnose", "--lake", str(tmp_path / "lake")])
    assert res.exit_code == 2, res.output
    assert f"cannot read the lake at {tmp_path / 'lake'}" in res.output
    assert "slokit.duckdb" not in res.output
