"""The end of a load run: sending stops, requests in flight drain for at most ``drain_s``, the
rest are cut and recorded ``incomplete`` (error type ``load_end``), not as failures. A request
that reaches the client's own timeout first is still a ``timeout``.

The runner's rules run on virtual time (a scripted exchange, no network; the drain bound is
on the run's clock); one test drives the real HTTP path against the fake vLLM server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from load_fake_server import FakeVllm

from slokit import clientlog as cl
from slokit.cli import main
from slokit.errors import BadInput
from slokit.lab.load import (
    LOAD_END,
    LoadConfig,
    Runner,
    format_summary,
    format_sweep_table,
    run_load,
)
from slokit.lab.sim.vtime import LoopClock, run_virtual
from slokit.lab.workload import RequestSpec

SPEC = RequestSpec(
    prompt="p", max_tokens=1, ignore_eos=True, slo_class=None, tenant=None, task_id=None,
    input_words=1,
)  # fmt: skip


class _Scripted(Runner):
    """A runner whose n-th request (from 1) takes ``delays[n - 1]`` seconds of the loop's
    (virtual) time to answer, with one token at the end."""

    def __init__(self, cfg: LoadConfig, clock: LoopClock, delays: list[float]) -> None:
        super().__init__(cfg, None, clock, "m", None, None)  # type: ignore[arg-type]
        self.delays = delays

    async def _exchange(
        self,
        url: str,
        body: dict[str, Any],
        headers: dict[str, str],
        rec: dict[str, Any],
        token_ts: list[float],
    ) -> None:
        seq = int(rec[cl.REQUEST_ID].rsplit("-", 1)[1])
        rec[cl.HTTP_STATUS] = 200
        await asyncio.sleep(self.delays[seq - 1])
        token_ts.append(self.clock.now())
        rec[cl.OUTPUT_TOKENS], rec[cl.STATUS] = 1, "ok"


def _config(**kw: Any) -> LoadConfig:
    base: dict[str, Any] = {
        "url": "http://sim",
        "duration_s": 10.0,
        "rate": 1.0,
        "run_id": "t",
        "timeout_s": 100.0,
        "drain_s": 5.0,
    }
    base.update(kw)
    cfg = LoadConfig(**base)
    cfg.validate()
    return cfg


def _run_open(
    cfg: LoadConfig, schedule: list[float], delays: list[float]
) -> tuple[dict[str, dict[str, Any]], float]:
    """Records by request id, and how long the run took (virtual seconds)."""
    return run_virtual(_drive(cfg, delays, lambda r, t0: r.open_loop(t0, schedule, lambda: SPEC)))


def _run_closed(cfg: LoadConfig, delays: list[float]) -> tuple[dict[str, dict[str, Any]], float]:
    return run_virtual(_drive(cfg, delays, lambda r, t0: r.closed_loop(t0, lambda: SPEC)))


async def _drive(
    cfg: LoadConfig, delays: list[float], loop: Callable[[Runner, float], Any]
) -> tuple[dict[str, dict[str, Any]], float]:
    clock = LoopClock()
    runner = _Scripted(cfg, clock, delays)
    t0 = clock.now()
    await loop(runner, t0)
    assert runner.in_flight == 0
    return {r[cl.REQUEST_ID]: r for r in runner.records}, clock.now() - t0


def _outcome(rec: dict[str, Any]) -> tuple[str, str | None]:
    return rec[cl.STATUS], rec[cl.ERROR_TYPE]


def test_requests_that_finish_within_the_drain_complete_normally() -> None:
    # Duration 10 s, drain 5 s: sent at 0 and 9.5, answered at 12 and 14.5 (both in the drain).
    recs, took = _run_open(_config(), [0.0, 9.5], [12.0, 5.0])
    assert [_outcome(recs[f"t-{i}"]) for i in (1, 2)] == [("ok", None), ("ok", None)]
    assert recs["t-1"][cl.E2E_S] == pytest.approx(12.0)
    assert took == pytest.approx(14.5)  # the run ends with its last answer, not at the bound


def test_requests_still_in_flight_after_the_drain_are_incomplete_not_timeouts() -> None:
    recs, took = _run_open(_config(), [0.0, 9.0], [1.0, 20.0])
    assert _outcome(recs["t-1"]) == ("ok", None)
    cut = recs["t-2"]
    assert _outcome(cut) == ("incomplete", LOAD_END)
    assert cut[cl.E2E_S] == pytest.approx(6.0)  # cut at 10 + 5 s, sent at 9 s
    assert cut[cl.HTTP_STATUS] == 200 and cut[cl.OUTPUT_TOKENS] is None
    assert took == pytest.approx(15.0)


def test_a_client_timeout_is_a_timeout_even_during_the_drain() -> None:
    # Timeout 3 s, cut at 15 s: sent at 0 (times out at 3), at 8 and at 9.9 (time out at 11
    # and 12.9, in the drain, before the cut).
    recs, _ = _run_open(_config(timeout_s=3.0), [0.0, 8.0, 9.9], [50.0, 50.0, 50.0])
    assert {_outcome(r) for r in recs.values()} == {("timeout", "timeout")}
    assert all(r[cl.E2E_S] == pytest.approx(3.0) for r in recs.values())


def test_a_request_cut_before_its_timeout_is_incomplete_one_past_it_a_timeout() -> None:
    # Timeout 6 s, cut at 15 s: sent at 0 -> timeout at 6; sent at 9.5 -> cut at 15 (5.5 s).
    recs, _ = _run_open(_config(timeout_s=6.0), [0.0, 9.5], [50.0, 50.0])
    assert _outcome(recs["t-1"]) == ("timeout", "timeout")
    assert _outcome(recs["t-2"]) == ("incomplete", LOAD_END)


def test_the_drain_starts_at_the_last_send_when_sending_fell_behind() -> None:
    # A send scheduled at 12 s (past the 10 s duration) still gets the whole drain.
    recs, took = _run_open(_config(), [12.0], [4.0])
    assert _outcome(recs["t-1"]) == ("ok", None)
    assert took == pytest.approx(16.0)


def test_a_zero_drain_cuts_at_the_phase_end_and_inf_waits_for_every_answer() -> None:
    recs, took = _run_open(_config(drain_s=0.0), [9.0], [3.0])
    assert _outcome(recs["t-1"]) == ("incomplete", LOAD_END) and took == pytest.approx(10.0)
    recs, took = _run_open(_config(drain_s=float("inf")), [9.0], [40.0])
    assert _outcome(recs["t-1"]) == ("ok", None) and took == pytest.approx(49.0)


def test_the_closed_loop_stops_sending_at_its_end_and_drains() -> None:
    # One user, 8 s per answer: 0-8 ok, 8-16 cut at 10 + 5 s; nothing sent after 10 s.
    recs, took = _run_closed(_config(rate=None, users=1), [8.0, 8.0, 8.0])
    assert sorted(recs) == ["t-1", "t-2"]
    assert _outcome(recs["t-1"]) == ("ok", None)
    assert _outcome(recs["t-2"]) == ("incomplete", LOAD_END)
    assert took == pytest.approx(15.0)


def test_incomplete_is_counted_apart_in_the_summary() -> None:
    from slokit.lab.load.stats import RunStats

    stats = RunStats()
    recs, _ = _run_open(_config(timeout_s=6.0), [0.0, 9.5, 9.6], [1.0, 50.0, 50.0])
    for rec in recs.values():
        stats.add(rec)
    assert (stats.ok, stats.errors, stats.timeouts, stats.incomplete) == (1, 0, 0, 2)


@pytest.mark.parametrize("drain", [-1.0, float("nan")])
def test_a_negative_drain_is_bad_input(drain: float) -> None:
    with pytest.raises(BadInput, match="--drain"):
        _config(drain_s=drain)


# --- over HTTP --------------------------------------------------------------------------------


def test_over_http_a_cut_request_is_incomplete_in_records_summary_and_file(
    fake_vllm: FakeVllm, tmp_path: Path
) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from slokit.sources.files import parse_requests_file

    fake_vllm.behaviour.ttft_s = 1.5  # well beyond the 0.2 s run and its 0.2 s drain
    out = tmp_path / "r.jsonl"
    exporter = InMemorySpanExporter()
    cfg = LoadConfig(
        url=fake_vllm.url, duration_s=0.2, rate=10.0, run_id="h", timeout_s=5.0, drain_s=0.2,
        out=out,
    )  # fmt: skip
    result = asyncio.run(run_load(cfg, span_exporter=exporter))
    assert [_outcome(r) for r in result.records] == [("incomplete", LOAD_END)] * 2
    assert all(r[cl.HTTP_STATUS] == 200 for r in result.records)
    s = result.summary
    assert (s.sent, s.ok, s.errors, s.timeouts, s.cancelled, s.incomplete) == (2, 0, 0, 0, 0, 2)
    assert "incomplete 2" in format_summary(s)
    assert format_sweep_table([s]).splitlines()[0].split()[4] == "incomplete"
    frags = parse_requests_file(out.read_bytes(), name=str(out))
    assert {(f.status, f.error_type) for f in frags} == {("incomplete", LOAD_END)}
    # Its client span declares slokit.status incomplete, which the OTLP decoder keeps.
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from slokit.sources.otlp import decode_traces

    spans = exporter.get_finished_spans()
    assert len(spans) == 2
    decoded = decode_traces(encode_spans(spans).SerializeToString()).fragments
    assert {(f.source, f.status) for f in decoded} == {("client", "incomplete")}


def test_the_cli_drain_flag_reaches_the_run(fake_vllm: FakeVllm) -> None:
    fake_vllm.behaviour.ttft_s = 1.5
    res = CliRunner().invoke(
        main,
        ["load", "--url", fake_vllm.url, "--rate", "5", "--duration", "0.2", "--drain", "0.1",
         "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert (summary["sent"], summary["ok"], summary["incomplete"], summary["timeouts"]) == (
        1,
        0,
        1,
        0,
    )
