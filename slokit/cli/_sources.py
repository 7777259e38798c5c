"""Where a command reads: ``--db`` (default), ``--lake``, ``--prometheus`` or ``--sidecar``.

:func:`source_options` adds the flags a command supports; :func:`open_reader` turns them
into one :class:`~slokit.store.reader.Reader`. Each backend lives in ``slokit.store`` and is
imported only when asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from slokit.cli._common import default_db, running_sidecar
from slokit.errors import BadInput, StoreBusy

if TYPE_CHECKING:
    from slokit.store.reader import Reader

F = TypeVar("F", bound=Callable[..., Any])

#: The flags each backend adds (all commands take ``--db``).
BACKENDS = ("lake", "prometheus", "sidecar")


@dataclass(frozen=True)
class SourceOptions:
    """The parsed source flags of one command."""

    db: str | None = None
    lake: str | None = None
    prometheus: str | None = None
    prometheus_headers: tuple[str, ...] = ()
    prometheus_basic_auth: str | None = None
    pod_label: str = "pod"
    sidecar: str | None = None
    token: str | None = None

    @classmethod
    def pop(cls, kwargs: dict[str, Any]) -> SourceOptions:
        """Take the source flags out of a click command's keyword arguments."""
        names = cls.__dataclass_fields__
        return cls(**{k: kwargs.pop(k) for k in list(kwargs) if k in names})

    def chosen(self) -> str:
        """``db``, ``lake``, ``prometheus`` or ``sidecar``; BadInput when several are given."""
        given = [b for b in BACKENDS if getattr(self, b)]
        if len(given) > 1 or (given and self.db):
            flags = [f"--{b}" for b in given] + (["--db"] if self.db else [])
            raise BadInput(f"give one source: {' or '.join(flags)}")
        return given[0] if given else "db"


def source_options(*backends: str) -> Callable[[F], F]:
    """Add ``--db`` and the flags of ``backends`` (a subset of :data:`BACKENDS`)."""

    def deco(f: F) -> F:
        opts: list[Callable[[F], F]] = [
            click.option(
                "--db",
                metavar="PATH",
                help="DuckDB file holding the records (default: $SLOKIT_DB or ./slokit.duckdb).",
            )
        ]
        if "lake" in backends:
            opts.append(click.option(
                "--lake", metavar="DIR",
                help="Read every pod's exported Parquet files (a directory or any URL DuckDB "
                     "reads) as one store.",
            ))  # fmt: skip
        if "prometheus" in backends:
            opts += [
                click.option(
                    "--prometheus", metavar="URL",
                    help="Read every pod's series from Prometheus (or Thanos, Mimir, "
                         "VictoriaMetrics) through its HTTP API.",
                ),
                click.option(
                    "--prometheus-header", "prometheus_headers", metavar="'NAME: VALUE'",
                    multiple=True, help="Extra header for --prometheus (e.g. X-Scope-OrgID).",
                ),
                click.option(
                    "--prometheus-basic-auth", metavar="USER:PASSWORD",
                    envvar="SLOKIT_PROMETHEUS_BASIC_AUTH",
                    help="Basic auth for --prometheus.",
                ),
                click.option(
                    "--pod-label", default="pod", show_default=True,
                    help="The label naming the pod (series without it fall back to instance).",
                ),
            ]  # fmt: skip
        if "sidecar" in backends:
            opts += [
                click.option("--sidecar", metavar="URL", help="Ask a running sidecar's API."),
                click.option("--token", envvar="SLOKIT_TOKEN", help="Bearer token for the API."),
            ]
        if "prometheus" in backends and "sidecar" not in backends:
            opts.append(click.option(
                "--token", envvar="SLOKIT_TOKEN", help="Bearer token for --prometheus.",
            ))  # fmt: skip
        for opt in reversed(opts):
            f = opt(f)
        return f

    return deco


def _headers(opts: SourceOptions) -> dict[str, str]:
    out: dict[str, str] = {}
    for h in opts.prometheus_headers:
        name, sep, value = h.partition(":")
        if not sep or not name.strip():
            raise BadInput(f"--prometheus-header {h!r}: expected 'NAME: VALUE'")
        out[name.strip()] = value.strip()
    if opts.token:
        out.setdefault("Authorization", f"Bearer {opts.token}")
    return out


@contextmanager
def open_reader(opts: SourceOptions) -> Iterator[Reader]:
    """The reader the flags name. A DuckDB file a sidecar holds is read through that
    sidecar's API (the file is locked while it runs)."""
    # deferred: each backend (DuckDB, pyarrow, httpx) is imported only when the flags name it
    chosen = opts.chosen()
    if chosen == "lake":
        from slokit.store.lake import open_lake

        assert opts.lake is not None
        with open_lake(opts.lake) as reader:
            yield reader
    elif chosen == "prometheus":
        from slokit.store.prometheus import PrometheusReader

        assert opts.prometheus is not None
        auth = None
        if opts.prometheus_basic_auth:
            user, _, password = opts.prometheus_basic_auth.partition(":")
            auth = (user, password)
        with PrometheusReader(
            opts.prometheus, headers=_headers(opts), basic_auth=auth, pod_label=opts.pod_label
        ) as reader:
            yield reader
    elif chosen == "sidecar":
        from slokit.store.remote import SidecarReader

        assert opts.sidecar is not None
        with SidecarReader(opts.sidecar, token=opts.token) as reader:
            yield reader
    else:
        from slokit.store.db import open_store

        db = opts.db or default_db()
        try:
            store = open_store(db, read_only=True)
        except StoreBusy:
            from slokit.store.remote import SidecarReader

            with SidecarReader(running_sidecar(db), token=opts.token) as reader:
                yield reader
            return
        with store:
            yield store.reader()


def held_by_sidecar(opts: SourceOptions) -> str | None:
    """The sidecar to ask instead of computing here: ``--sidecar``, or the one holding the
    ``--db`` file (a running sidecar locks it). None: read locally."""
    if opts.sidecar:
        opts.chosen()  # --sidecar with --db or --lake is a usage error
        return opts.sidecar
    if opts.chosen() != "db":
        return None
    from slokit.store.db import open_store  # deferred: DuckDB and pyarrow

    db = opts.db or default_db()
    try:
        open_store(db, read_only=True).close()
    except StoreBusy:
        return running_sidecar(db)
    return None
