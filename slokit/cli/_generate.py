"""Flags shared by the generators (``slokit dashboards build``, ``slokit alerts build``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def generator_options(f: F) -> F:
    """``--runbook-base-url``, ``--replica-label`` and ``--gpu-replica-label``."""
    for option in reversed(
        (
            click.option(
                "--runbook-base-url",
                default="runbooks",
                show_default=True,
                help="Base URL of the runbooks; links point to <base>/<rule>.md.",
            ),
            click.option(
                "--replica-label",
                default="pod",
                show_default=True,
                help="Prometheus label naming the replica on vLLM series.",
            ),
            click.option(
                "--gpu-replica-label",
                default="pod",
                show_default=True,
                help="Prometheus label naming the replica on dcgm-exporter series.",
            ),
        )
    ):
        f = option(f)
    return f
