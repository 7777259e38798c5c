"""The merge of a request a load test cut at its end (client status ``incomplete``).

The client's outcome comes first, so the row stays ``incomplete`` even when vLLM's span shows
the request finished: the caller stopped listening before the answer came. vLLM's own
latencies stay in the row. The in-memory merge (one batch) and the SQL merge (fragments
arriving apart) agree.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from slokit.records import RequestFragment
from slokit.store.db import open_store

T0 = 1_795_958_000.0


def _vllm() -> RequestFragment:
    return RequestFragment(
        "r1", "vllm", "vllm:r1", replica="pod-a", arrival_ts=T0, ttft_s=20.0, e2e_s=35.0,
        queue_s=19.5, output_tokens=64,
    )  # fmt: skip


def _client() -> RequestFragment:
    return RequestFragment(
        "r1", "client", "client:r1", arrival_ts=T0 - 0.01, client_e2e_s=30.0, http_status=200,
        status="incomplete", error_type="load_end", slo_class="interactive",
    )  # fmt: skip


def _merged(batches: list[list[RequestFragment]]) -> dict[str, Any]:
    with open_store(":memory:") as store:
        for batch in batches:
            store.append_fragments(batch)
        rec = store.reader().request("r1")
    assert rec is not None
    rec.pop("updated_at", None)
    return rec


@pytest.mark.parametrize("together", [True, False], ids=["one batch", "apart"])
def test_a_cut_request_stays_incomplete_beside_a_finished_vllm_span(together: bool) -> None:
    frags = [_vllm(), _client()]
    for perm in itertools.permutations(frags):
        rec = _merged([list(perm)] if together else [[f] for f in perm])
        assert (rec["status"], rec["error_type"], rec["http_status"]) == (
            "incomplete",
            "load_end",
            200,
        )
        assert rec["e2e_s"] == 35.0 and rec["queue_s"] == 19.5  # vLLM's facts stay
        assert sorted(rec["sources"]) == ["client", "vllm"]


def test_a_cut_request_without_a_server_span_is_kept_incomplete() -> None:
    rec = _merged([[_client()]])
    assert (rec["status"], rec["client_e2e_s"], rec["sources"]) == ("incomplete", 30.0, ["client"])
