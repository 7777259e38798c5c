"""The sidecar's import footprint: a running sidecar loads what it needs and nothing of the
analysis stack (pandas, the rules), the generators (grafanalib), the lab or the other commands.

Each check runs a fresh interpreter (``sys.modules`` of the test process holds everything the
suite imported) and reads what it loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from sidecar_harness import sidecar_process

import slokit.cli
from slokit.cli import main
from slokit.errors import BadInput
from slokit.sidecar.config import load_config

#: Light pure-Python parts of slokit.analysis the SLI accounting and the API need.
ALLOWED_ANALYSIS = {"slokit.analysis", "slokit.analysis.slo", "slokit.analysis.slo_spec"} | {
    f"slokit.analysis.slo.{m}"  # the slo package's pure-Python parts
    for m in ("_classify", "_render", "_report", "_stats", "_sweep", "_window")
}

#: What a sidecar's steady state must not load (top-level packages or slokit subpackages).
FORBIDDEN = ("pandas", "grafanalib", "matplotlib", "scipy", "slokit.lab", "slokit.generate")

#: How long a sidecar with the findings off is watched (the 0.2 s interval ticks 15 times).
OFF_OBSERVED_S = 3.0

COMMANDS = sorted(
    p.stem for p in Path(slokit.cli.__file__).parent.glob("*.py") if not p.stem.startswith("_")
)

PROBE = """
import json, sys
{code}
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_by(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(code=code)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _offenders(modules: set[str]) -> list[str]:
    bad = {
        m
        for m in modules
        if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)
        or (m.startswith("slokit.analysis") and m not in ALLOWED_ANALYSIS)
    }
    return sorted(bad)


ENTRY_POINTS = {
    "the runner": "import slokit.sidecar.runner",
    "python -m slokit.sidecar": "import slokit.sidecar.__main__",
    "slokit sidecar via the CLI group": (
        "import click\nfrom slokit.cli import main\n"
        "cmd = main.get_command(click.Context(main), 'sidecar')\n"
        "assert cmd is not None and cmd.name == 'sidecar'\n"
        "from slokit.sidecar.runner import run"
    ),
}


@pytest.mark.parametrize("code", ENTRY_POINTS.values(), ids=ENTRY_POINTS.keys())
def test_starting_the_sidecar_loads_no_analysis_stack_generators_or_lab(code: str) -> None:
    loaded = _loaded_by(code)
    assert "slokit.sidecar.runner" in loaded or "slokit.cli.sidecar" in loaded
    assert _offenders(loaded) == []


def test_the_probe_sees_the_analysis_stack_when_it_is_imported() -> None:
    # the check above can fail: importing diagnosis is caught by it
    loaded = _loaded_by("import slokit.sidecar.runner\nimport slokit.analysis.diagnose")
    assert "pandas" in _offenders(loaded)
    assert "slokit.analysis.diagnose" in _offenders(loaded)


def test_resolving_the_sidecar_command_imports_no_other_command() -> None:
    loaded = _loaded_by(
        "import click\nfrom slokit.cli import main\nmain.get_command(click.Context(main), 'sidecar')"
    )
    commands = {m.rsplit(".", 1)[1] for m in loaded if m.startswith("slokit.cli.")}
    assert commands - {"_common"} == {"sidecar"}


def test_top_level_help_lists_every_command_with_its_short_help() -> None:
    res = CliRunner().invoke(main, ["--help"])
    assert res.exit_code == 0
    listed = res.output.split("Commands:", 1)[1].splitlines()
    rows = {line.split()[0]: line.split(None, 1)[1] for line in listed if line.strip()}
    assert sorted(rows) == COMMANDS
    assert all(help_text.strip() for help_text in rows.values())


@pytest.mark.parametrize("name", ["_common", "_generate", "nope", "__init__"])
def test_private_modules_and_unknown_names_are_no_commands(name: str) -> None:
    res = CliRunner().invoke(main, [name])
    assert res.exit_code == 2
    assert "No such command" in res.output


# -- a running sidecar: the periodic findings are the one user of the analysis stack ---------


def _pandas_mapped(pid: int) -> bool:
    return "/pandas/" in Path(f"/proc/{pid}/maps").read_text()


@contextlib.contextmanager
def _running_sidecar(
    tmp_path: Path, diagnose_interval_s: str
) -> Iterator[tuple[int, dict[str, int]]]:
    """A real ``slokit sidecar`` process, ready; yields its pid and ports."""
    log = tmp_path / "sidecar.log"
    env = {**os.environ, "SLOKIT_DIAGNOSE_INTERVAL_S": diagnose_interval_s,
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    args = ["--db", str(tmp_path / "s.duckdb"), "--listen", "127.0.0.1:0",
            "--otlp-http", "127.0.0.1:0", "--otlp-grpc", ""]  # fmt: skip
    with sidecar_process(args, log, env) as (popen, ports):
        yield popen.pid, ports
        assert popen.poll() is None, log.read_text()[-3000:]


def _ingest(ports: dict[str, int], body: bytes) -> None:
    """Post an OTLP export and wait until its spans are queryable (committed to DuckDB)."""
    r = httpx.post(f"http://127.0.0.1:{ports['otlp_http']}/v1/traces", content=body,
                   headers={"Content-Type": "application/x-protobuf"}, timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 60
    url = f"http://127.0.0.1:{ports['api']}/api/request?id=r63"
    while httpx.get(url, timeout=30).json()["record"] is None:
        assert time.monotonic() < deadline, "the export's spans were never committed"
        time.sleep(0.2)


def test_a_ready_sidecar_has_not_loaded_pandas(tmp_path: Path) -> None:
    with _running_sidecar(tmp_path, "30") as (pid, _):
        assert not _pandas_mapped(pid)


def test_committing_spans_loads_no_pandas(tmp_path: Path, export_body: bytes) -> None:
    # pyarrow imports pandas at its first list conversion unless told there is none
    with _running_sidecar(tmp_path, "0") as (pid, ports):
        _ingest(ports, export_body)
        assert not _pandas_mapped(pid)


def test_the_first_findings_tick_loads_the_analysis_stack(tmp_path: Path) -> None:
    with _running_sidecar(tmp_path, "0.2") as (pid, _):
        deadline = time.monotonic() + 60  # generous: the tick is due 0.2 s after start
        while not _pandas_mapped(pid):
            assert time.monotonic() < deadline, "the findings tick never loaded the rules"
            time.sleep(0.2)


def test_findings_interval_zero_turns_them_off_and_pandas_never_loads(
    tmp_path: Path, export_body: bytes
) -> None:
    with _running_sidecar(tmp_path, "0") as (pid, ports):
        _ingest(ports, export_body)
        time.sleep(OFF_OBSERVED_S)  # many ticks of the 0.2 s interval above
        assert not _pandas_mapped(pid)


def test_findings_of_a_sidecar_that_deferred_pandas_read_its_spans(
    tmp_path: Path, export_body: bytes
) -> None:
    with _running_sidecar(tmp_path, "30") as (pid, ports):
        _ingest(ports, export_body)
        doc = httpx.get(f"http://127.0.0.1:{ports['api']}/api/diagnose", timeout=120).json()
        assert _pandas_mapped(pid)
        assert doc["coverage"]["sources"]["requests"]["rows"] == 64


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "-0.5"])
def test_a_findings_interval_below_zero_or_not_finite_is_refused(value: str) -> None:
    with pytest.raises(BadInput, match="diagnose_interval_s"):
        load_config(env={"SLOKIT_DIAGNOSE_INTERVAL_S": value}).validate()


# -- pyarrow's pandas check, deferred (slokit._arrow) ----------------------------------------

DEFERRED = """
import sys
from slokit._arrow import defer_pandas
assert defer_pandas()
import pyarrow as pa
pa.array([1.5, None])
assert "pandas" not in sys.modules
import numpy as np, pandas as pd
print(pa.array(pd.Series([1.0, np.nan])).null_count)
"""


def _series_nulls(code: str) -> list[str]:
    """What ``code`` (DEFERRED, changed) prints, run in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    return out.stdout.split()


def test_pyarrow_converts_pandas_as_usual_once_pandas_is_imported() -> None:
    assert _series_nulls(DEFERRED) == ["1"]  # NaN as null: pyarrow knows the Series for one


def test_asking_where_pandas_is_before_importing_it_changes_nothing() -> None:
    code = DEFERRED.replace("import numpy as np, pandas as pd",
                            "import importlib.util\nassert importlib.util.find_spec('pandas')\n"
                            "import numpy as np, pandas as pd")  # fmt: skip
    assert _series_nulls(code) == ["1"]


def test_without_the_rearm_pyarrow_would_not_know_pandas_objects() -> None:
    # what the checks above guard against: pyarrow told of no pandas converts a Series as a
    # plain sequence, NaN kept
    code = DEFERRED.replace("from slokit._arrow import defer_pandas",
                            "import slokit._arrow as a; a._rearm = lambda: None\n"
                            "from slokit._arrow import defer_pandas")  # fmt: skip
    assert _series_nulls(code) == ["0"]
