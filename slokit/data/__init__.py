"""Files slokit reads at run time, shipped inside the package (``importlib.resources``).

``slo/chat.yaml``, ``workloads/chat_mix.yaml`` and ``workloads/chat_mix_tiny.yaml`` are the
demo's SLO spec and workloads. They are copies of the files of the same names under the
repository's ``examples/`` (which stay there for users to read and edit);
``tests/test_installed_package.py`` asserts that each copy is identical to its original.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

#: Package-data files and the ``examples/`` files they copy (paths relative to each root).
EXAMPLE_COPIES: tuple[str, ...] = (
    "slo/chat.yaml",
    "workloads/chat_mix.yaml",
    "workloads/chat_mix_tiny.yaml",
)


def data_path(relative: str) -> Path:
    """The file ``relative`` (e.g. ``"slo/chat.yaml"``) of slokit's package data, on disk.

    slokit is installed as files (a wheel, or an editable checkout), never run from a zip, so
    the resource is a real path that child processes can open too.
    """
    path = Path(str(files(__name__).joinpath(relative)))
    if not path.is_file():
        raise FileNotFoundError(f"slokit package data {relative!r} not found at {path}")
    return path
