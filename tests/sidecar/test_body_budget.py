"""The bytes of export bodies the OTLP receivers hold at once are bounded
(``otlp_body_budget_bytes``): past the budget a body waits, then gets 503 (UNAVAILABLE) with
Retry-After, its bytes never read. One client opening many connections cannot make the
sidecar hold many bodies of up to ``max_body_bytes`` each."""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import httpx
import pytest
from sidecar_harness import Running, StartSidecar, wait_for

from slokit.sidecar.body_budget import ByteBudget
from slokit.sidecar.otlp_ingest import Overloaded

MIB = 1024 * 1024
HELD = "slokit_otlp_body_bytes_held"


# -- the budget ----------------------------------------------------------------------------


def test_bodies_that_fit_are_held_together() -> None:
    async def run() -> int:
        budget = ByteBudget(10)
        async with budget.hold(6), budget.hold(4):
            return budget.used

    assert asyncio.run(run()) == 10


def test_a_body_that_finds_no_room_in_time_is_overloaded_with_a_retry_after() -> None:
    async def run() -> Overloaded:
        budget = ByteBudget(10, wait_s=0.01)
        async with budget.hold(6):
            with pytest.raises(Overloaded) as caught:
                async with budget.hold(6):
                    raise AssertionError("held past the budget")
        assert budget.used == 0
        return caught.value

    refused = asyncio.run(run())
    assert refused.retry_after_s >= 1
    assert "do not fit the 10-byte budget" in str(refused)


def test_a_waiting_body_gets_room_when_a_held_one_is_answered() -> None:
    async def run() -> list[str]:
        budget = ByteBudget(10, wait_s=60)
        order: list[str] = []
        first_held, release = asyncio.Event(), asyncio.Event()

        async def first() -> None:
            async with budget.hold(8):
                first_held.set()
                await release.wait()
                order.append("first answered")

        async def second() -> None:
            await first_held.wait()
            async with budget.hold(8):
                order.append("second held")

        tasks = [asyncio.create_task(first()), asyncio.create_task(second())]
        await first_held.wait()
        await asyncio.sleep(0)  # the second is waiting now
        release.set()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(run()) == ["first answered", "second held"]


def test_a_body_larger_than_the_budget_takes_all_of_it_alone() -> None:
    async def run() -> int:
        budget = ByteBudget(10, wait_s=0.01)
        async with budget.hold(1000):
            held = budget.used
            with pytest.raises(Overloaded):
                async with budget.hold(1):
                    pass
        return held

    assert asyncio.run(run()) == 10


def test_the_bytes_held_follow_each_hold_and_its_end() -> None:
    seen: list[int] = []

    async def run() -> None:
        budget = ByteBudget(10)
        async with budget.hold(3):
            seen.append(budget.used)
            async with budget.hold(5):
                seen.append(budget.used)
            seen.append(budget.used)
        seen.append(budget.used)

    asyncio.run(run())
    assert seen == [3, 8, 3, 0]


def test_a_hold_grows_by_what_it_is_given_and_gives_it_all_back() -> None:
    seen: list[int] = []

    async def run() -> None:
        budget = ByteBudget(10)
        async with budget.hold(2) as held:
            await held.grow(3)
            seen.extend((held.nbytes, budget.used))
        seen.append(budget.used)

    asyncio.run(run())
    assert seen == [5, 5, 0]


def test_a_hold_that_cannot_grow_in_time_is_overloaded() -> None:
    async def run() -> int:
        budget = ByteBudget(10, wait_s=0.01)
        async with budget.hold(6), budget.hold(1) as held:
            with pytest.raises(Overloaded, match="do not fit the 10-byte budget"):
                await held.grow(4)
            return held.nbytes

    assert asyncio.run(run()) == 1


def test_a_growing_hold_waits_for_another_to_be_answered() -> None:
    async def run() -> list[int]:
        budget = ByteBudget(10, wait_s=60)
        first_held, release = asyncio.Event(), asyncio.Event()

        async def first() -> None:
            async with budget.hold(8):
                first_held.set()
                await release.wait()

        task = asyncio.create_task(first())
        await first_held.wait()
        async with budget.hold(2) as held:
            grow = asyncio.create_task(held.grow(5))
            await asyncio.sleep(0)
            waiting = [budget.used]
            release.set()
            await grow
            await task
            return [*waiting, budget.used]

    assert asyncio.run(run()) == [10, 7]


def test_one_body_never_grows_past_the_whole_budget() -> None:
    async def run() -> int:
        budget = ByteBudget(10, wait_s=0.01)
        async with budget.hold(4) as held:
            await held.grow(100)
            return budget.used

    assert asyncio.run(run()) == 10


def test_a_hold_given_back_grows_no_more() -> None:
    async def run() -> int:
        budget = ByteBudget(10)
        async with budget.hold(3) as held:
            pass
        with pytest.raises(Overloaded, match="given back"):
            await held.grow(2)
        return budget.used

    assert asyncio.run(run()) == 0


def test_a_hold_resized_down_gives_the_rest_back_and_up_takes_more() -> None:
    seen: list[int] = []

    async def run() -> None:
        budget = ByteBudget(10)
        async with budget.hold(8) as held:
            await held.resize(3)
            seen.append(budget.used)
            await held.resize(6)
            seen.append(budget.used)
        seen.append(budget.used)

    asyncio.run(run())
    assert seen == [3, 6, 0]


def test_a_budget_below_one_byte_is_refused() -> None:
    with pytest.raises(ValueError, match="budget"):
        ByteBudget(0)


# -- the receivers -------------------------------------------------------------------------


@contextmanager
def stalled_body(sc: Running, length: int) -> Iterator[socket.socket]:
    """A client that sends an export's headers (Content-Length ``length``) and 1 KiB of its
    body, then stalls: the body's bytes are held until the connection closes."""
    url = urlsplit(sc.otlp)
    sock = socket.create_connection((url.hostname, url.port))
    head = (f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Content-Type: application/x-protobuf\r\nContent-Length: {length}\r\n\r\n")  # fmt: skip
    sock.sendall(head.encode() + b"\0" * 1024)
    try:
        wait_for(lambda: sc.value(HELD) == length, timeout=30, what="the stalled body's hold")
        yield sock
    finally:
        sock.close()


def test_a_body_that_does_not_fit_beside_a_stalled_one_gets_503_until_it_is_gone(
    start_sidecar: StartSidecar,
) -> None:
    sc = start_sidecar(otlp_body_budget_bytes=4 * MIB)
    assert sc.value("slokit_otlp_body_budget_bytes") == 4 * MIB
    garbage = b"\x07" * (2 * MIB)  # not an export: a 400 once it is read
    headers = {"Content-Type": "application/x-protobuf"}
    with stalled_body(sc, 3 * MIB):
        r = httpx.post(sc.otlp, content=garbage, headers=headers, timeout=60)
        assert r.status_code == 503, r.text
        assert int(r.headers["Retry-After"]) >= 1
    wait_for(lambda: sc.value(HELD) == 0, timeout=30, what="the stalled body's bytes back")
    assert httpx.post(sc.otlp, content=garbage, headers=headers, timeout=60).status_code == 400


def test_a_small_export_fits_beside_a_stalled_body(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar(otlp_body_budget_bytes=4 * MIB)
    with stalled_body(sc, 3 * MIB):
        r = httpx.post(sc.otlp, content=export_body, timeout=60,
                       headers={"Content-Type": "application/x-protobuf"})  # fmt: skip
        assert r.status_code == 200, r.text


def test_a_grpc_export_shares_the_budget_and_is_unavailable_when_it_is_spent(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    import grpc

    from slokit.sidecar.otlp_grpc import METHOD

    sc = start_sidecar(otlp_body_budget_bytes=1 * MIB)
    with stalled_body(sc, 1 * MIB), grpc.insecure_channel(sc.grpc_target) as ch:
        call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as caught:
            call(export_body, timeout=60)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert sc.value("slokit_otlp_requests_total", protocol="grpc", code="UNAVAILABLE") == 1


def test_an_empty_body_holds_nothing_and_is_answered_beside_a_stalled_one(
    start_sidecar: StartSidecar,
) -> None:
    sc = start_sidecar(otlp_body_budget_bytes=4 * MIB)
    with stalled_body(sc, 3 * MIB):
        r = httpx.post(sc.otlp, content=b"", timeout=60,
                       headers={"Content-Type": "application/x-protobuf"})  # fmt: skip
        assert r.status_code == 200, r.text  # an export of no spans


def test_a_compressed_body_is_held_at_what_it_inflates_to(start_sidecar: StartSidecar) -> None:
    sc = start_sidecar(otlp_body_budget_bytes=4 * MIB)
    bomb = gzip.compress(b"\x07" * (2 * MIB))  # ~2 KiB that inflate to 2 MiB (not an export)
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
    with stalled_body(sc, 3 * MIB):
        r = httpx.post(sc.otlp, content=bomb, headers=headers, timeout=60)
        assert r.status_code == 503, r.text  # its 2 KiB fit; its 2 MiB do not
        assert int(r.headers["Retry-After"]) >= 1
    wait_for(lambda: sc.value(HELD) == 0, timeout=30, what="the stalled body's bytes back")
    assert httpx.post(sc.otlp, content=bomb, headers=headers, timeout=60).status_code == 400


@contextmanager
def stalled_chunked_body(sc: Running, first_chunk: int) -> Iterator[socket.socket]:
    """A client that sends an export without a Content-Length (chunked), its first chunk of
    ``first_chunk`` bytes, then stalls."""
    url = urlsplit(sc.otlp)
    sock = socket.create_connection((url.hostname, url.port))
    head = (f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Content-Type: application/x-protobuf\r\nTransfer-Encoding: chunked\r\n\r\n")  # fmt: skip
    sock.sendall(head.encode() + f"{first_chunk:x}\r\n".encode() + b"\0" * first_chunk + b"\r\n")
    try:
        yield sock
    finally:
        sock.close()


def test_a_body_without_a_length_is_held_as_it_is_read(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar(otlp_body_budget_bytes=4 * MIB)
    with stalled_chunked_body(sc, 1 * MIB):
        wait_for(lambda: sc.value(HELD) == 1 * MIB, timeout=30, what="the chunk's hold")
        r = httpx.post(sc.otlp, content=export_body, timeout=60,
                       headers={"Content-Type": "application/x-protobuf"})  # fmt: skip
        assert r.status_code == 200, r.text


def test_a_body_without_a_length_past_the_limit_is_413(start_sidecar: StartSidecar) -> None:
    sc = start_sidecar(max_body_bytes=1 * MIB)

    def chunks() -> Iterator[bytes]:  # httpx sends a generator chunked, with no length
        for _ in range(4):
            yield b"\0" * (MIB // 2)

    r = httpx.post(sc.otlp, content=chunks(), timeout=60,
                   headers={"Content-Type": "application/x-protobuf"})  # fmt: skip
    assert r.status_code == 413, r.text


def test_a_json_body_is_held_at_twice_its_bytes(start_sidecar: StartSidecar) -> None:
    sc = start_sidecar(otlp_body_budget_bytes=4 * MIB)
    doc = b'{"resourceSpans": [], "padding": "' + b"a" * (3 * MIB // 4) + b'"}'  # 0.75 MiB
    headers = {"Content-Type": "application/json"}
    with stalled_body(sc, 3 * MIB):
        r = httpx.post(sc.otlp, content=doc, headers=headers, timeout=60)
        assert r.status_code == 503, r.text  # its 0.75 MiB fit; twice that does not
    wait_for(lambda: sc.value(HELD) == 0, timeout=30, what="the stalled body's bytes back")
    assert httpx.post(sc.otlp, content=doc, headers=headers, timeout=60).status_code == 200


# -- OTLP/gRPC: a message is read only once the budget holds room for the largest it may be ---


def test_a_grpc_message_is_held_at_the_largest_it_may_be_before_it_is_read(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    import grpc

    from slokit.sidecar.otlp_grpc import METHOD

    # 1.5 MiB of room left: a small export fits, but gRPC must first make room for 2 MiB
    sc = start_sidecar(otlp_body_budget_bytes=3 * MIB, max_body_bytes=2 * MIB)
    with stalled_body(sc, 3 * MIB // 2), grpc.insecure_channel(sc.grpc_target) as ch:
        call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as caught:
            call(export_body, timeout=60)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    wait_for(lambda: sc.value(HELD) == 0, timeout=30, what="the stalled body's bytes back")
    with grpc.insecure_channel(sc.grpc_target) as ch:
        call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        call(export_body, timeout=60)  # OK: its room comes back to what it turned out to be
    assert sc.value(HELD) == 0


def test_a_grpc_sender_that_stalls_before_its_message_is_refused_and_its_hold_given_back(
    start_sidecar: StartSidecar,
) -> None:
    import threading

    import grpc

    from slokit.sidecar.otlp_grpc import METHOD

    sc = start_sidecar(body_timeout_s=1.0)
    never = threading.Event()

    def stalled() -> Iterator[bytes]:  # opens the call, never sends its message
        never.wait(60)
        yield b""

    with grpc.insecure_channel(sc.grpc_target) as ch:
        call = ch.stream_unary(METHOD, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as caught:
            call(stalled(), timeout=60)
        never.set()
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "did not arrive" in (caught.value.details() or "")
    wait_for(lambda: sc.value(HELD) == 0, timeout=30, what="the stalled call's hold back")


def test_a_grpc_call_without_a_message_is_invalid_argument(start_sidecar: StartSidecar) -> None:
    import grpc

    from slokit.sidecar.otlp_grpc import METHOD

    sc = start_sidecar()
    with grpc.insecure_channel(sc.grpc_target) as ch:
        call = ch.stream_unary(METHOD, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as caught:
            call(iter(()), timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert sc.value("slokit_otlp_requests_total", protocol="grpc", code="INVALID_ARGUMENT") == 1


@pytest.mark.parametrize("encoding", ["identity", ""], ids=["identity", "empty"])
def test_a_body_not_compressed_is_held_once_whatever_its_encoding_header_says(
    start_sidecar: StartSidecar, encoding: str
) -> None:
    sc = start_sidecar(otlp_body_budget_bytes=4 * MIB)
    garbage = b"\x07" * (3 * MIB // 5)  # 0.6 MiB beside 3 MiB: fits once, not twice
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": encoding}
    with stalled_body(sc, 3 * MIB):
        r = httpx.post(sc.otlp, content=garbage, headers=headers, timeout=60)
    assert r.status_code == 400, r.text  # read and decoded: not refused for room
