"""Each rule on a synthetic store: it fires with the right numbers, and a near miss does not.

The stores share one shape (tests/diagnose/synth.py): ten minutes of data, a quiet first
quarter that serves as the baseline, and an incident from minute five on.
"""

from __future__ import annotations

from typing import Any

import pytest
from diag_synth import END, INCIDENT, T0, Run, after, engine, gpu, ramp, requests, scrapes

from slokit.analysis.diagnose import DiagnoseOptions
from slokit.store.db import Store


def rules(doc: dict[str, Any], *, at_least: str = "info") -> set[str]:
    order = {"info": 0, "warning": 1, "critical": 2}
    return {f["rule"] for f in doc["findings"] if order[f["severity"]] >= order[at_least]}


def one(doc: dict[str, Any], rule: str) -> dict[str, Any]:
    found = [f for f in doc["findings"] if f["rule"] == rule]
    assert len(found) == 1, [f["summary"] for f in doc["findings"]]
    return found[0]


def gap(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    """The one telemetry_gap finding of a kind (missing, stale, reset)."""
    found = [
        f for f in doc["findings"] if f["rule"] == "telemetry_gap" and f["evidence"]["kind"] == kind
    ]
    assert len(found) == 1, [f["summary"] for f in doc["findings"]]
    return found[0]


def healthy(store: Store, replica: str = "pod-a", **req: Any) -> None:
    store.append_fragments(requests(replica, **req))
    store.append_engine_samples(engine(replica))
    store.append_gpu_samples(gpu(replica))


# -- healthy ------------------------------------------------------------------------------
def test_healthy_fleet_reports_nothing_above_info(store: Store, run: Run) -> None:
    for r in ("pod-a", "pod-b"):
        healthy(store, r)
    doc = run()
    assert rules(doc, at_least="warning") == set()
    assert all(s["status"] in ("ran", "not_applicable") for s in doc["coverage"]["rules"].values())


# -- queue_saturation ---------------------------------------------------------------------
def test_queue_saturation_fires_when_queue_time_carries_the_ttft_increase(
    store: Store, run: Run
) -> None:
    store.append_fragments(requests(queue_s=after(INCIDENT, 0.02, 1.5)))
    store.append_engine_samples(engine(waiting=after(INCIDENT, 1, 37)))
    f = one(run(), "queue_saturation")
    assert f["replica"] == "pod-a" and f["severity"] == "critical"
    assert f["evidence"]["increase_share"]["queue"] == pytest.approx(1.0)
    assert f["evidence"]["waiting_peak"] == 37
    assert "queue time carries 100% of the increase" in f["summary"]
    assert "waiting peaked at 37 on pod-a" in f["summary"]
    assert f["start"] == "2026-11-29T13:18:20.000Z"  # INCIDENT
    assert f["runbook"] == "runbooks/queue_saturation.md"


def test_queue_saturation_near_miss_ttft_below_factor_is_quiet(store: Store, run: Run) -> None:
    store.append_fragments(requests(queue_s=after(INCIDENT, 0.02, 0.1)))  # TTFT 1.9x, not 2x
    assert "queue_saturation" not in rules(run(options=DiagnoseOptions(ttft_factor=2.5)))
    assert "queue_saturation" in rules(run(options=DiagnoseOptions(ttft_factor=2.0)))


def test_a_baseline_of_failed_requests_says_it_has_no_ttft(store: Store, run: Run) -> None:
    healthy(store)
    store.append_fragments(requests(None, prefix="x", error_every=1, spans=False))
    notes = run()["coverage"]["rules"]["queue_saturation"]["notes"]
    assert any(n.startswith("fleet: none of the baseline's") for n in notes), notes
    assert not any("< 20" in n for n in notes), notes


def test_ttft_rise_with_tpot_rise_is_not_queue_saturation(store: Store, run: Run) -> None:
    store.append_fragments(
        requests(queue_s=after(INCIDENT, 0.02, 1.5), tpot_s=after(INCIDENT, 0.02, 0.06))
    )
    assert "queue_saturation" not in rules(run())


def test_a_backlog_that_fills_the_batch_is_queue_saturation_though_tpot_rose(
    store: Store, run: Run
) -> None:
    # max_num_seqs=2 on a CPU: the batch goes 1 -> 2, each step takes 1.8x, the rest waits
    store.append_fragments(
        requests(queue_s=after(INCIDENT, 0.02, 1.5), tpot_s=after(INCIDENT, 0.02, 0.036))
    )
    store.append_engine_samples(
        engine(running=after(INCIDENT, 1, 2), waiting=after(INCIDENT, 0, 25))
    )
    f = one(run(), "queue_saturation")
    assert f["evidence"]["tpot_p50_ratio"] == pytest.approx(1.8)


def test_a_short_burst_that_fills_the_batch_is_queue_saturation_though_tpot_rose(
    store: Store, run: Run
) -> None:
    """A 20 s burst on two sequences (real vLLM on a busy CPU): two buckets, the first partly
    before the batch filled (1.1, then 1.8 from a baseline of 0). Their mean (1.45) is under
    the batch factor; the fullest bucket is what says the batch filled."""

    def burst(before: float, then: float) -> Any:
        return lambda t: then if INCIDENT <= t < INCIDENT + 20 else before

    def running(t: float) -> float:
        in_burst = INCIDENT <= t < INCIDENT + 20
        return 0.0 if not in_burst else 1.1 if t < INCIDENT + 10 else 1.8

    store.append_fragments(
        requests(every_s=0.25, queue_s=burst(0.02, 1.5), tpot_s=burst(0.02, 0.03))
    )
    store.append_engine_samples(engine(running=running, waiting=burst(0, 25)))
    f = one(run(), "queue_saturation")
    assert f["evidence"]["running_mean"] < 1.5 <= f["evidence"]["running_peak"]
    assert "as the running batch grew 0.0 -> 1.8" in f["summary"]


def _small_cap_burst(store: Store, *, burst_every_s: float) -> None:
    """vLLM on a busy CPU, two sequences: one request a second, then for 20 s one every
    ``burst_every_s``; the batch hovers between one and two (bucket means up to 1.3 from
    0.1), six wait at the peak, queue time carries the TTFT rise, and TPOT rose 1.6x (the
    CPU shared with other work)."""

    def burst(before: float, then: float) -> Any:
        return lambda t: then if INCIDENT <= t < INCIDENT + 20 else before

    store.append_fragments(
        requests(start=T0, end=INCIDENT, every_s=1.0, queue_s=0.0, prefill_s=0.006, tpot_s=0.002)
        + requests(
            start=INCIDENT,
            end=INCIDENT + 20,
            every_s=burst_every_s,
            queue_s=0.11,
            prefill_s=0.006,
            tpot_s=0.0032,
            prefix="b",
        )
        + requests(
            start=INCIDENT + 20,
            end=END,
            every_s=1.0,
            queue_s=0.0,
            prefill_s=0.006,
            tpot_s=0.002,
            prefix="c",
        )
    )
    store.append_engine_samples(
        engine(running=burst(0.1, 1.3), waiting=burst(0, 6), successes_per_s=burst(1, 9))
    )


def test_a_burst_on_a_small_batch_cap_is_queue_saturation_though_tpot_rose(
    store: Store, run: Run
) -> None:
    """The batch never reaches 1.5x its baseline (bucket means up to 1.3), but arrivals rose
    9x: the backlog is the burst's (real vLLM, max_num_seqs=2, on a busy machine)."""
    _small_cap_burst(store, burst_every_s=1 / 9)
    f = one(run(), "queue_saturation")
    assert f["evidence"]["running_peak"] < 1.5
    assert f["evidence"]["arrival_ratio"] == pytest.approx(9, rel=0.1)
    assert "arrivals rose 9" in f["summary"]


def test_the_same_queue_with_arrivals_flat_is_not_a_backlog(store: Store, run: Run) -> None:
    """The same TTFT, TPOT and batch with arrivals as before: steps that slowed on their own
    made the queue, which is not queue_saturation's story."""
    _small_cap_burst(store, burst_every_s=1.0)
    assert "queue_saturation" not in rules(run())


def test_tpot_rise_with_a_flat_batch_is_not_a_backlog(store: Store, run: Run) -> None:
    store.append_fragments(
        requests(queue_s=after(INCIDENT, 0.02, 1.5), tpot_s=after(INCIDENT, 0.02, 0.036))
    )
    store.append_engine_samples(engine(running=8, waiting=after(INCIDENT, 0, 25)))
    assert "queue_saturation" not in rules(run())


def test_tpot_rise_as_large_as_the_ttft_rise_is_not_a_backlog(store: Store, run: Run) -> None:
    # TTFT 0.07 -> 0.17 s (2.4x), TPOT 2x: the slowdown is the steps', not the queue's
    store.append_fragments(
        requests(queue_s=after(INCIDENT, 0.02, 0.12), tpot_s=after(INCIDENT, 0.02, 0.04))
    )
    store.append_engine_samples(
        engine(running=after(INCIDENT, 1, 2), waiting=after(INCIDENT, 0, 25))
    )
    assert "queue_saturation" not in rules(run())


# -- prefill_saturation -------------------------------------------------------------------
def test_prefill_saturation_fires_on_long_prompts(store: Store, run: Run) -> None:
    store.append_fragments(
        requests(prefill_s=after(INCIDENT, 0.05, 0.8), prompt_tokens=after(INCIDENT, 200, 3200))
    )
    doc = run()
    f = one(doc, "prefill_saturation")
    assert f["evidence"]["prompt_mean_ratio"] == pytest.approx(16.0)
    assert "prompts average 3200 tokens vs 200 (16.0x)" in f["summary"]
    assert "queue_saturation" not in rules(doc)


def test_prefill_near_miss_small_rise_is_quiet(store: Store, run: Run) -> None:
    store.append_fragments(requests(prefill_s=after(INCIDENT, 0.05, 0.09)))
    assert "prefill_saturation" not in rules(run())


# -- decode_saturation --------------------------------------------------------------------
def test_decode_saturation_fires_when_tpot_follows_the_batch(store: Store, run: Run) -> None:
    rate = ramp(INCIDENT, END, 2, 20)  # more arrivals: a bigger batch, slower steps
    batch = ramp(INCIDENT, END, 8, 200)
    store.append_fragments(
        requests(every_s=lambda t: 1 / rate(t), tpot_s=lambda t: 0.015 + 0.0002 * batch(t))
    )
    store.append_engine_samples(engine(running=batch))
    f = one(run(), "decode_saturation")
    assert f["evidence"]["tpot_ratio"] > 1.5 and f["evidence"]["batch_ratio"] > 1.5
    assert f["evidence"]["rank_corr_tpot_running"] > 0.9
    assert "as the running batch grew 8 ->" in f["summary"]


def test_decode_saturation_on_a_plateau_correlates_against_the_history_baseline(
    store: Store, run: Run
) -> None:
    # The window holds only the saturated plateau (batch 150-200, TPOT wobbling with noise
    # that does not follow it); the correlation must span the quiet history to see the
    # range of batch sizes.
    rate = after(INCIDENT, 2, 20)
    batch = after(INCIDENT, 8, 180)
    wobble = {0: 0.004, 1: -0.004, 2: 0.002, 3: -0.002}
    store.append_fragments(
        requests(
            every_s=lambda t: 1 / rate(t),
            tpot_s=lambda t: 0.015 + 0.0002 * batch(t) + wobble[int(t // 10) % 4],
        )
    )
    store.append_engine_samples(engine(running=lambda t: batch(t) + 20 * (int(t // 10) % 2)))
    f = one(run(since=INCIDENT), "decode_saturation")
    assert f["evidence"]["rank_corr_tpot_running"] > 0.5


def test_batch_growth_with_flat_arrivals_is_a_consequence_not_decode_saturation(
    store: Store, run: Run
) -> None:
    # Each request got slower (say, speculative acceptance fell), so more of them are in
    # flight at once: Little's law, not a batch that slows its steps.
    store.append_fragments(requests(tpot_s=after(INCIDENT, 0.02, 0.05)))
    store.append_engine_samples(engine(running=after(INCIDENT, 8, 20)))
    doc = run()
    assert "decode_saturation" not in rules(doc)
    assert "requests slowed" in doc["coverage"]["rules"]["decode_saturation"]["notes"][0]


def test_decode_near_miss_tpot_up_without_batch_growth_is_quiet(store: Store, run: Run) -> None:
    store.append_fragments(requests(tpot_s=after(INCIDENT, 0.02, 0.05)))
    store.append_engine_samples(engine(running=8))
    assert "decode_saturation" not in rules(run())


# -- kv_pressure --------------------------------------------------------------------------
def test_kv_pressure_fires_on_full_kv_with_preemptions(store: Store, run: Run) -> None:
    store.append_fragments(requests(prompt_tokens=1000, output_tokens=200))
    store.append_engine_samples(
        engine(kv=after(INCIDENT, 0.4, 0.99), preemptions_per_s=after(INCIDENT, 0, 0.5))
    )
    f = one(run(), "kv_pressure")
    assert f["evidence"]["kv_usage_peak"] == pytest.approx(0.99)
    assert f["evidence"]["preemptions"] == pytest.approx(150, abs=2)
    assert f["evidence"]["recompute_tokens_estimate"] == pytest.approx(150 * 1100, rel=0.02)
    assert "KV cache 99% full" in f["summary"] and "150 preemptions" in f["summary"]


def test_kv_near_full_without_preemptions_is_quiet(store: Store, run: Run) -> None:
    store.append_engine_samples(engine(kv=after(INCIDENT, 0.4, 0.99)))
    assert "kv_pressure" not in rules(run())


def test_preemptions_with_kv_headroom_are_not_kv_pressure(store: Store, run: Run) -> None:
    store.append_engine_samples(engine(kv=0.7, preemptions_per_s=0.5))
    assert "kv_pressure" not in rules(run())


# -- frontend_bound -----------------------------------------------------------------------
def test_frontend_bound_fires_when_ttft_is_spent_outside_the_engine(store: Store, run: Run) -> None:
    store.append_fragments(requests(frontend_s=after(INCIDENT, 0.0, 0.9)))
    store.append_gpu_samples(gpu(util=after(INCIDENT, 0.6, 0.2)))
    doc = run()
    f = one(doc, "frontend_bound")
    assert f["evidence"]["increase_share"]["frontend"] == pytest.approx(1.0)
    assert "GPU utilisation averaged 20%" in f["summary"]
    assert not {"queue_saturation", "prefill_saturation"} & rules(doc)


def test_queueing_on_an_idle_gpu_is_frontend_bound_not_queue_saturation(
    store: Store, run: Run
) -> None:
    store.append_fragments(requests(queue_s=after(INCIDENT, 0.02, 1.0)))
    store.append_gpu_samples(gpu(util=0.25))
    doc = run()
    assert "frontend_bound" in rules(doc) and "queue_saturation" not in rules(doc)


def test_queueing_behind_a_grown_batch_is_queue_saturation_whatever_the_utilisation(
    store: Store, run: Run
) -> None:
    store.append_fragments(requests(queue_s=after(INCIDENT, 0.02, 1.0)))
    store.append_engine_samples(
        engine(running=after(INCIDENT, 4, 16), waiting=after(INCIDENT, 0, 30))
    )
    store.append_gpu_samples(gpu(util=0.4))
    doc = run()
    assert "queue_saturation" in rules(doc) and "frontend_bound" not in rules(doc)


def test_queueing_on_a_busy_gpu_is_not_frontend_bound(store: Store, run: Run) -> None:
    store.append_fragments(requests(queue_s=after(INCIDENT, 0.02, 1.0)))
    store.append_gpu_samples(gpu(util=0.95))
    assert "frontend_bound" not in rules(run())


# -- prefix_affinity_loss -----------------------------------------------------------------
def test_prefix_affinity_loss_fires_when_hit_ratio_falls_after_scale_out(
    store: Store, run: Run
) -> None:
    store.append_engine_samples(engine("pod-a", prefix_hit_ratio=after(INCIDENT, 0.8, 0.3)))
    store.append_engine_samples(engine("pod-b", start=INCIDENT, prefix_hit_ratio=0.3))
    f = one(run(), "prefix_affinity_loss")
    assert f["replica"] is None
    ev = f["evidence"]
    assert (ev["replicas_baseline"], ev["replicas_after"], ev["scale_out"]) == (1, 2, True)
    assert ev["hit_ratio_baseline"] == pytest.approx(0.8)
    assert ev["hit_ratio_after"] == pytest.approx(0.3)
    assert "grew 1 -> 2" in f["summary"] and f["confidence"] >= 0.85


def test_scale_out_with_steady_hit_ratio_is_quiet(store: Store, run: Run) -> None:
    store.append_engine_samples(engine("pod-a", prefix_hit_ratio=0.8))
    store.append_engine_samples(engine("pod-b", start=INCIDENT, prefix_hit_ratio=0.75))
    assert "prefix_affinity_loss" not in rules(run())


def test_hit_ratio_fall_without_scale_out_is_reported_with_low_confidence(
    store: Store, run: Run
) -> None:
    store.append_engine_samples(engine("pod-a", prefix_hit_ratio=after(INCIDENT, 0.8, 0.0)))
    f = one(run(), "prefix_affinity_loss")
    assert f["evidence"]["scale_out"] is False and f["confidence"] < 0.6


# -- beyond_knee --------------------------------------------------------------------------
def test_beyond_knee_fires_when_arrivals_outgrow_flat_throughput(store: Store, run: Run) -> None:
    # Capacity 4 req/s; arrivals ramp 2 -> 8 req/s. Past the knee each request waits
    # behind the backlog: queue = backlog / capacity.
    rate = ramp(INCIDENT - 100, END, 2.0, 8.0)
    arrivals = requests(every_s=lambda t: 1 / rate(t), finish=False)
    free_at = T0
    served = []
    for r in arrivals:  # one server, 0.25 s per request: FIFO
        assert r.arrival_ts is not None
        start = max(r.arrival_ts, free_at)
        free_at = start + 0.25
        queue_s = start - r.arrival_ts
        served.append(
            r._replace(queue_s=queue_s, ttft_s=queue_s + (r.prefill_s or 0), finish_ts=free_at)
        )
    store.append_fragments(served)
    f = one(run(), "beyond_knee")
    ev = f["evidence"]
    assert ev["capacity_req_s"] == pytest.approx(4.0, abs=0.3)
    assert ev["arrival_rate_last"] > 1.5 * ev["completion_rate_last"]
    assert ev["backlog_end"] > 100 and f["replica"] is None


def test_rising_load_below_the_knee_is_quiet(store: Store, run: Run) -> None:
    rate = ramp(INCIDENT - 100, END, 2.0, 3.5)
    store.append_fragments(requests(every_s=lambda t: 1 / rate(t)))
    assert "beyond_knee" not in rules(run())


# -- gpu_throttle -------------------------------------------------------------------------
def test_gpu_throttle_fires_when_busy_clock_falls(store: Store, run: Run) -> None:
    store.append_fragments(requests(tpot_s=after(INCIDENT, 0.02, 0.03)))
    store.append_gpu_samples(gpu(clock=after(INCIDENT, 1980, 891), temp=after(INCIDENT, 60, 88)))
    f = one(run(), "gpu_throttle")
    assert f["evidence"]["clock_ratio"] == pytest.approx(0.45)
    assert f["severity"] == "critical"
    assert "SM clock 891 MHz while busy vs 1980 MHz baseline (45%)" in f["summary"]
    assert "TPOT p50 1.5x baseline" in f["summary"]


def test_low_clock_on_an_idle_gpu_is_not_throttling(store: Store, run: Run) -> None:
    store.append_gpu_samples(gpu(util=after(INCIDENT, 0.8, 0.02), clock=after(INCIDENT, 1980, 345)))
    assert "gpu_throttle" not in rules(run())


# -- gpu_xid ------------------------------------------------------------------------------
def test_gpu_xid_fires_on_a_nonzero_xid_with_its_meaning(store: Store, run: Run) -> None:
    store.append_fragments(requests(error_every=after(INCIDENT, 0, 2)))
    store.append_gpu_samples(gpu(xid=after(INCIDENT, 0, 79)))
    f = one(run(), "gpu_xid")
    assert f["severity"] == "critical" and f["evidence"]["xids"] == [79]
    assert "XID 79 (GPU has fallen off the bus)" in f["summary"]
    assert f["evidence"]["error_ratio"] == pytest.approx(0.5, abs=0.01)


def test_zero_xid_is_quiet(store: Store, run: Run) -> None:
    store.append_gpu_samples(gpu(xid=0))
    assert "gpu_xid" not in rules(run())


# -- error_burst --------------------------------------------------------------------------
def test_error_burst_fires_against_the_baseline_error_ratio(store: Store, run: Run) -> None:
    store.append_fragments(requests(error_every=after(INCIDENT, 100, 3)))
    f = one(run(), "error_burst")
    assert f["evidence"]["error_ratio"] == pytest.approx(1 / 3, abs=0.01)
    assert f["evidence"]["baseline_error_ratio"] == pytest.approx(0.01, abs=0.005)
    assert "most often InternalServerError (HTTP 500)" in f["summary"]
    assert f["severity"] == "critical"


def test_steady_error_ratio_is_not_a_burst(store: Store, run: Run) -> None:
    store.append_fragments(requests(error_every=20))
    assert "error_burst" not in rules(run())


def test_a_couple_of_errors_are_not_a_burst(store: Store, run: Run) -> None:
    store.append_fragments(requests(error_every=lambda t: 2 if INCIDENT <= t < INCIDENT + 2 else 0))
    assert "error_burst" not in rules(run())


# -- spec_decode_low_acceptance -----------------------------------------------------------
def test_spec_decode_low_acceptance_fires_on_an_acceptance_drop(store: Store, run: Run) -> None:
    store.append_engine_samples(
        engine(spec_drafts_per_s=50, spec_k=4, spec_accepted_per_draft=after(INCIDENT, 2.4, 0.2))
    )
    f = one(run(), "spec_decode_low_acceptance")
    assert f["evidence"]["acceptance_rate"] == pytest.approx(0.05)
    assert f["evidence"]["acceptance_rate_baseline"] == pytest.approx(0.6)
    assert f["evidence"]["tokens_per_step"] == pytest.approx(1.2)
    assert f["severity"] == "warning"


def test_healthy_spec_decode_is_quiet(store: Store, run: Run) -> None:
    store.append_engine_samples(engine(spec_drafts_per_s=50, spec_k=4, spec_accepted_per_draft=2.4))
    assert "spec_decode_low_acceptance" not in rules(run())


def test_spec_rule_is_not_applicable_without_spec_counters(store: Store, run: Run) -> None:
    store.append_engine_samples(engine())
    status = run()["coverage"]["rules"]["spec_decode_low_acceptance"]
    assert status["status"] == "not_applicable"


# -- telemetry_gap ------------------------------------------------------------------------
def test_missing_gpu_source_withholds_gpu_rules_and_says_why(store: Store, run: Run) -> None:
    store.append_fragments(requests())
    store.append_engine_samples(engine())
    doc = run()
    withheld = doc["coverage"]["withheld"]
    assert set(withheld) == {"gpu_throttle", "gpu_xid"}
    assert withheld["gpu_xid"] == "missing source: gpu"
    f = gap(doc, "missing")
    assert f["severity"] == "info"  # never had GPU telemetry: a CPU deployment
    assert f["evidence"]["withheld"] == ["gpu_throttle", "gpu_xid"]


def test_requests_without_spans_withhold_the_ttft_split(store: Store, run: Run) -> None:
    store.append_fragments(requests(spans=False))
    withheld = run()["coverage"]["withheld"]
    assert {"queue_saturation", "prefill_saturation", "frontend_bound"} <= set(withheld)
    assert "error_burst" not in withheld


def test_a_stale_replica_is_a_warning_with_its_gap(store: Store, run: Run) -> None:
    store.append_engine_samples(engine("pod-a"))
    store.append_engine_samples(
        engine("pod-b", end=INCIDENT) + engine("pod-b", start=INCIDENT + 120)
    )
    f = gap(run(), "stale")
    assert f["replica"] == "pod-b" and f["severity"] == "warning"
    assert f["evidence"]["gaps"][0]["duration_s"] == pytest.approx(121, abs=1)


def test_failed_scrapes_are_reported(store: Store, run: Run) -> None:
    store.append_engine_samples(engine("pod-a"))
    store.append_scrapes(
        scrapes(
            "http://pod-a:8000/metrics",
            "pod-a",
            "vllm",
            start=T0,
            end=END,
            up=lambda t: not INCIDENT <= t < INCIDENT + 30,
        )
    )
    f = gap(run(), "stale")
    assert f["evidence"]["failed_scrapes"][0]["failed"] == 6
    assert "6 failed scrapes (HTTP 503)" in f["summary"]


def test_counter_reset_is_info(store: Store, run: Run) -> None:
    store.append_engine_samples(engine("pod-a", reset_at=INCIDENT))
    f = gap(run(), "reset")
    assert f["severity"] == "info" and f["replica"] == "pod-a"


def test_regular_samples_have_no_gap(store: Store, run: Run) -> None:
    healthy(store)
    assert "telemetry_gap" not in rules(run())


def test_tpot_rise_from_longer_prompts_is_not_decode_saturation(store: Store, run: Run) -> None:
    batch = after(INCIDENT, 8, 20)
    store.append_fragments(
        requests(tpot_s=after(INCIDENT, 0.02, 0.04), prompt_tokens=after(INCIDENT, 200, 2000))
    )
    store.append_engine_samples(engine(running=batch))
    doc = run()
    assert "decode_saturation" not in rules(doc)
    assert "prefill interference" in doc["coverage"]["rules"]["decode_saturation"]["notes"][0]


def test_queueing_behind_longer_prompts_is_prefill_saturation(store: Store, run: Run) -> None:
    store.append_fragments(
        requests(
            queue_s=after(INCIDENT, 0.02, 0.6),
            prefill_s=after(INCIDENT, 0.05, 0.35),
            prompt_tokens=after(INCIDENT, 200, 1000),
        )
    )
    doc = run()
    f = one(doc, "prefill_saturation")
    assert "queueing behind prefills carries 66%" in f["summary"]  # 0.58 of 0.88 s
    assert "queue_saturation" not in rules(doc)


def test_failures_without_a_replica_are_judged_against_the_whole_fleet(
    store: Store, run: Run
) -> None:
    # Rejected before any engine saw them: client records only, no replica.
    store.append_fragments(requests("pod-a"))
    store.append_fragments(
        requests(None, start=INCIDENT, every_s=1.0, error_every=1, spans=False, prefix="rejected")
    )
    f = one(run(), "error_burst")
    assert f["replica"] is None
    assert f["evidence"]["error_ratio"] == pytest.approx(1 / 3, abs=0.02)  # 1/s of 3/s


def test_two_samples_at_one_instant_are_not_a_reset(store: Store, run: Run) -> None:
    samples = engine("pod-a")
    idle = engine("pod-a", end=T0 + 1, successes_per_s=0, prompt_tokens_per_s=0)[0]
    idle.ts = samples[-1].ts  # same instant, smaller counters
    store.append_engine_samples([*samples, idle])
    kinds = {f["evidence"]["kind"] for f in run()["findings"] if f["rule"] == "telemetry_gap"}
    assert "reset" not in kinds
