"""Per-request results of the load tools users run, recognised by content.

Each tool has its own importer module (:mod:`.aiperf`, :mod:`.guidellm`,
:mod:`.inference_perf`) with ``TOOL`` (its name), ``sniff(text) -> bool`` (is this its
per-request file?), ``parse(text, name, now) -> list[RequestFragment]`` and
``aggregate_hint(text) -> str | None`` (is this the tool's aggregate instead? then the message
naming the file to give). :func:`parse_requests` and :func:`aggregate_problem` try them in
turn; :func:`slokit.sources.files.parse_requests_file` calls both before its own formats
(``vllm bench serve`` results and slokit's JSONL). docs/loadtools.md lists what is accepted.
"""

from __future__ import annotations

from typing import Protocol

from slokit.records import RequestFragment
from slokit.sources.loadtools import aiperf, guidellm, inference_perf


class Importer(Protocol):
    """What each tool's module provides."""

    TOOL: str

    def sniff(self, text: str) -> bool: ...

    def aggregate_hint(self, text: str) -> str | None: ...

    def parse(self, text: str, name: str, now: float | None = None) -> list[RequestFragment]: ...


IMPORTERS: tuple[Importer, ...] = (aiperf, guidellm, inference_perf)


def detect(text: str) -> Importer | None:
    """The importer whose tool wrote ``text`` (a per-request file), or None."""
    for imp in IMPORTERS:
        if imp.sniff(text):
            return imp
    return None


def parse_requests(
    text: str, *, name: str, now: float | None = None
) -> list[RequestFragment] | None:
    """The client fragments of a load tool's per-request file, or None when no tool wrote it."""
    imp = detect(text)
    return imp.parse(text, name, now) if imp is not None else None


def aggregate_problem(text: str) -> str | None:
    """When ``text`` is a load tool's aggregate, the message naming the file to give instead."""
    for imp in IMPORTERS:
        if (hint := imp.aggregate_hint(text)) is not None:
            return hint
    return None
