"""Shared CLI plumbing: the --db option, error-to-exit-code mapping, JSON printing."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from slokit.errors import BadInput, SlokitError, StoreBusy
from slokit.sidecar.discovery import find_sidecar

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
    """Turn library errors into a one-line message on stderr and the error's exit code.

    A DuckDB error that escapes a command (a read that reaches a damaged part of the file) is
    bad input too: exit 2 naming the database, never a traceback."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except SlokitError as exc:
            click.echo(f"slokit: {exc}", err=True)
            sys.exit(exc.exit_code)
        except Exception as exc:
            message = database_error(exc, kwargs.get("db"), lake=kwargs.get("lake"))
            if message is None:
                raise
            click.echo(f"slokit: {message}", err=True)
            sys.exit(BadInput.exit_code)

    return wrapper  # type: ignore[return-value]


def database_error(exc: BaseException, db: object = None, *, lake: object = None) -> str | None:
    """One line for a DuckDB error or a storage fault such as a full volume (None for any
    other error), naming the lake when the command read one (``--lake``), else the database.
    They are looked up among the loaded modules: a command that never loaded DuckDB cannot be
    failing with its error, and needs no time to import it here."""
    duckdb, faults = sys.modules.get("duckdb"), sys.modules.get("slokit.store.faults")
    if faults is not None and isinstance(exc, faults.StorageFault):
        return f"cannot write the database {exc}"  # the fault's text starts with the path
    if duckdb is None or not isinstance(exc, duckdb.Error):
        return None
    lines = str(exc).strip().splitlines()
    detail = lines[0] if lines else type(exc).__name__
    if isinstance(lake, str) and lake:
        return f"cannot read the lake at {lake} (a damaged Parquet file?): {detail}"
    where = db if isinstance(db, str) and db else default_db()
    return f"cannot read the database {where} (damaged?): {detail}"


def print_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


def running_sidecar(db: str) -> str:
    """The API URL of the sidecar that holds ``db`` (it left ``<db>.sidecar.json``).

    Called when opening ``db`` failed on its lock; raises StoreBusy when no live sidecar
    says it holds the file."""
    url = find_sidecar(db)
    if url is None:
        raise StoreBusy(
            f"{db} is held by another process, and no running sidecar says it "
            "holds it; pass --sidecar URL"
        )
    click.echo(f"slokit: {db} is held by the sidecar at {url}; asking it", err=True)
    return url
