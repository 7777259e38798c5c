"""The demo hands out its ports before anything binds them (vLLM needs the OTLP endpoint at
start): each must differ from those already handed out, or two servers race for one."""

from __future__ import annotations

import pytest

from slokit.errors import SlokitError
from slokit.lab.demo import free_port_block


def test_a_port_block_never_overlaps_the_ports_to_avoid() -> None:
    taken: set[int] = set()
    for _ in range(20):
        base = free_port_block(2, avoid=taken)
        assert not {base, base + 1} & taken
        taken.update((base, base + 1))


def test_no_block_is_found_when_every_port_is_to_be_avoided() -> None:
    with pytest.raises(SlokitError, match="no block of free ports"):
        free_port_block(1, avoid=range(1, 65536))
