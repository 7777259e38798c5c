"""classify(): one request -> (class, outcome), the SLI the sidecar counts."""

from __future__ import annotations

from typing import Any

from slokit.analysis.slo import classify, measurement
from slokit.analysis.slo_spec import SloSpec


def rec(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "slo_class": "interactive", "status": "ok", "client_ttft_s": 0.2, "tpot_s": 0.02,
        "output_tokens": 50,
    }  # fmt: skip
    base.update(kw)
    return base


def test_a_request_within_every_bound_is_good(spec: SloSpec) -> None:
    assert classify(rec(), spec) == ("interactive", "good")


def test_a_bound_is_met_at_equality(spec: SloSpec) -> None:
    assert classify(rec(client_ttft_s=0.5, tpot_s=0.05), spec)[1] == "good"


def test_missing_one_bound_is_slow(spec: SloSpec) -> None:
    assert classify(rec(client_ttft_s=0.501), spec)[1] == "slow"


def test_any_status_but_ok_is_an_error(spec: SloSpec) -> None:
    for status in ("error", "timeout", "cancelled", "rejected", None):
        assert classify(rec(status=status), spec)[1] == "error"


def test_a_failed_quality_check_is_quality_fail_even_when_slow(spec: SloSpec) -> None:
    assert classify(rec(quality_pass=False, client_ttft_s=9.0), spec)[1] == "quality_fail"


def test_unknown_quality_is_not_a_failure(spec: SloSpec) -> None:
    assert classify(rec(quality_pass=None), spec)[1] == "good"


def test_quality_is_ignored_when_the_spec_does_not_require_it(spec: SloSpec) -> None:
    from dataclasses import replace

    lax = replace(spec, require_quality_pass=False)
    assert classify(rec(quality_pass=False), lax)[1] == "good"


def test_the_client_ttft_wins_over_the_servers(spec: SloSpec) -> None:
    assert classify(rec(client_ttft_s=0.9, ttft_s=0.1), spec)[1] == "slow"
    assert classify(rec(client_ttft_s=None, ttft_s=0.9), spec)[1] == "slow"
    assert classify(rec(client_ttft_s=None, ttft_s=0.1), spec)[1] == "good"


def test_the_client_e2e_wins_over_the_servers() -> None:
    assert measurement({"client_e2e_s": 2.0, "e2e_s": 1.0}, "e2e") == 2.0
    assert measurement({"e2e_s": 1.0}, "e2e") == 1.0


def test_an_unmeasured_bound_counts_as_not_met(spec: SloSpec) -> None:
    assert classify(rec(client_ttft_s=None), spec)[1] == "slow"


def test_tpot_is_met_for_a_single_token_answer_as_vllm_does(spec: SloSpec) -> None:
    assert classify(rec(tpot_s=None, output_tokens=1), spec)[1] == "good"


def test_a_request_matching_no_class_has_no_class(spec: SloSpec) -> None:
    assert classify(rec(slo_class="other", client_ttft_s=50.0), spec) == (None, "good")


def test_sli_labels_name_class_replica_model_and_outcome(spec: SloSpec) -> None:
    from slokit.analysis.slo import sli_labels

    assert sli_labels(rec(replica="r1", model="m", status="timeout"), spec) == {
        "class": "interactive", "replica": "r1", "model": "m", "outcome": "error",
    }  # fmt: skip
    assert sli_labels(rec(slo_class="zzz"), spec)["class"] == "unclassified"
