"""slokit runs when installed as a package, not only from a checkout.

What the code reads at run time (the demo's SLO spec and workloads) is package data in
``slokit/data/``, identical to the user-facing copies in ``examples/``; caches (the tiny
model) go to the user's cache directory. The slow test builds the wheel, installs it into a
fresh virtualenv outside the checkout and runs a short ``slokit demo`` there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import slokit
from slokit.data import EXAMPLE_COPIES, data_path
from slokit.lab import demo
from slokit.lab.tiny_model import cache_dir, default_model_dir

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(slokit.__file__).resolve().parent


@pytest.mark.parametrize("relative", EXAMPLE_COPIES)
def test_package_data_is_identical_to_its_example(relative: str) -> None:
    assert data_path(relative).read_bytes() == (REPO / "examples" / relative).read_bytes()


@pytest.mark.parametrize("path", [demo.DEFAULT_SLO, demo.DEFAULT_WORKLOAD, demo.TINY_WORKLOAD])
def test_the_demo_reads_its_defaults_from_the_package(path: Path) -> None:
    assert path.is_file()
    assert path.resolve().is_relative_to(PACKAGE)


def test_missing_package_data_is_a_clear_error() -> None:
    with pytest.raises(FileNotFoundError, match=r"slokit package data 'slo/none\.yaml'"):
        data_path("slo/none.yaml")


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"SLOKIT_CACHE_DIR": "/srv/cache", "XDG_CACHE_HOME": "/xdg"}, "/srv/cache"),
        ({"XDG_CACHE_HOME": "/xdg"}, "/xdg/slokit"),
        ({"SLOKIT_CACHE_DIR": "", "XDG_CACHE_HOME": "/xdg"}, "/xdg/slokit"),
        ({}, str(Path.home() / ".cache" / "slokit")),
    ],
    ids=["SLOKIT_CACHE_DIR wins", "XDG_CACHE_HOME", "empty override ignored", "home default"],
)
def test_the_cache_directory_follows_the_environment(
    environ: dict[str, str], expected: str
) -> None:
    assert cache_dir(environ) == Path(expected)
    assert default_model_dir(environ) == Path(expected) / "tiny-model"


def test_the_tiny_model_cache_is_outside_the_package() -> None:
    assert not default_model_dir().resolve().is_relative_to(PACKAGE)


def _build_wheel(out: Path) -> Path:
    """``pip wheel`` of a copy of the package sources (the checkout gets no build/ folder)."""
    src = out / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(
        REPO / "slokit", src / "slokit", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q", "-w", str(out)],
        check=True,
        timeout=600,
    )
    (wheel,) = out.glob("slokit-*.whl")
    return wheel


@pytest.mark.slow
def test_the_installed_wheel_runs_the_demo_outside_the_checkout(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    build = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(build)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert {f"slokit/data/{r}" for r in EXAMPLE_COPIES} <= names

    # A fresh virtualenv (no system site-packages) that borrows slokit's dependencies from
    # this environment through a .pth file, so nothing is downloaded; slokit itself comes
    # only from the wheel (the checkout's editable hook is not a site dir there).
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    venv_site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.strip()
    )  # fmt: skip
    (venv_site / "slokit-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True,
        timeout=300,
    )

    cwd = tmp_path_factory.mktemp("elsewhere")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SLOKIT_DB")}
    env["SLOKIT_CACHE_DIR"] = str(cwd / "cache")
    where = subprocess.run(
        [str(python), "-c", "import slokit.lab.demo as d; print(d.__file__); print(d.DEFAULT_SLO)"],
        cwd=cwd, env=env, capture_output=True, text=True, check=True, timeout=120,
    ).stdout.split()  # fmt: skip
    assert Path(where[0]).is_relative_to(venv_site), where
    assert Path(where[1]).is_relative_to(venv_site / "slokit" / "data") and Path(where[1]).is_file()

    res = subprocess.run(
        [str(venv / "bin" / "slokit"), "demo", "--scale", "0.1", "--out", "demo-out"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=480,
        check=False,
    )
    text = res.stdout + res.stderr
    assert res.returncode == 0, text
    assert "$ slokit diagnose" in text and "$ slokit slo report" in text
    assert f"--slo {venv_site / 'slokit' / 'data' / 'slo' / 'chat.yaml'}" in text
    assert (cwd / "demo-out" / "report.html").stat().st_size > 10_000
