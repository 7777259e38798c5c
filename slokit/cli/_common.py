"""Shared CLI plumbing: the --db option, error-to-exit-code mapping, JSON printing."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from slokit.errors import SlokitError

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_DB = "slokit.duckdb"


def default_db() -> str:
    return os.environ.get("SLOKIT_DB", DEFAULT_DB)


def db_option(f: F) -> F:
    return click.option(
        "--db",
        "db",
        default=default_db,
        show_default="$SLOKIT_DB or ./slokit.duckdb",
        type=click.Path(dir_okay=False),
        help="DuckDB file holding the records.",
    )(f)


def handle_errors(f: F) -> F:
    """Turn library errors into a one-line message on stderr and the error's exit code."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except SlokitError as exc:
            click.echo(f"slokit: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]


def print_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


def running_sidecar(db: str) -> str:
    """The API URL of the sidecar that holds ``db`` (it left ``<db>.sidecar.json``).

    Called when opening ``db`` failed on its lock; raises StoreBusy when no live sidecar
    says it holds the file."""
    from slokit.errors import StoreBusy
    from slokit.sidecar.discovery import find_sidecar

    url = find_sidecar(db)
    if url is None:
        raise StoreBusy(
            f"{db} is held by another process, and no running sidecar says it "
            "holds it; pass --sidecar URL"
        )
    click.echo(f"slokit: {db} is held by the sidecar at {url}; asking it", err=True)
    return url
