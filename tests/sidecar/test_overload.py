"""Overload: a stalled writer fills the bounded queue; ingest says 503 + Retry-After, memory
stays under the bound, and everything recovers by itself when the writer catches up."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
from sidecar_harness import StartSidecar, post, relabel, request_ids, wait_for

CAPACITY = 256  # records; the real export carries 64 spans per body


def test_stalled_writer_gives_503_with_retry_after_and_recovers(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    release = threading.Event()
    sc = start_sidecar(queue_capacity=CAPACITY, before_commit=lambda: release.wait(20))
    writer = sc.sidecar.writer
    assert writer is not None
    bodies = [relabel(export_body, f"load{i}") for i in range(12)]
    depth_seen: list[int] = []

    with ThreadPoolExecutor(max_workers=12) as pool:
        futures = [pool.submit(post, sc.otlp, body) for body, _ in bodies]
        # 12 x 64 spans cannot fit in 256: the overflow is refused at once, while stalled
        wait_for(lambda: sum(f.done() for f in futures) >= 12 - CAPACITY // 64, what="refusals")
        depth_seen.append(writer.depth)
        refused = [f.result() for f in futures if f.done()]
        assert refused and all(r.status_code == 503 for r in refused)
        assert all(r.headers["Retry-After"] == "1" for r in refused)
        assert sc.value("slokit_write_queue_depth") <= CAPACITY
        assert writer.depth <= CAPACITY
        assert writer.lag_s() > 0
        release.set()  # load drops: the writer catches up
        results = [f.result(timeout=20) for f in futures]

    accepted = [ids for (_, ids), r in zip(bodies, results, strict=True) if r.status_code == 200]
    assert len(accepted) == CAPACITY // 64
    stored = request_ids(sc)
    assert all(set(ids) <= stored for ids in accepted)
    assert max(depth_seen) <= CAPACITY
    assert sc.value("slokit_dropped_total", reason="queue_full") >= 64

    # recovered: the refused bodies go through on retry, with nothing left queued
    for (body, ids), r in zip(bodies, results, strict=True):
        if r.status_code == 503:
            assert post(sc.otlp, body).status_code == 200
            assert set(ids) <= request_ids(sc)
    wait_for(lambda: writer.depth == 0, what="empty queue")


def test_feedback_is_refused_with_503_while_the_queue_is_full(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    release = threading.Event()
    sc = start_sidecar(queue_capacity=64, before_commit=lambda: release.wait(20))
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(post, sc.otlp, export_body)
            wait_for(lambda: sc.sidecar.writer is not None and sc.sidecar.writer.depth > 0)
            resp = httpx.post(f"{sc.api}/v1/feedback",
                              json={"request_id": "r1", "quality_pass": True})  # fmt: skip
            assert resp.status_code == 503
            assert resp.headers["Retry-After"] == "1"
            release.set()
            assert pending.result(20).status_code == 200
    finally:
        release.set()
