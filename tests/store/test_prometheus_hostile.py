"""A hostile or broken Prometheus-compatible server: every answer slokit reads (backfill, the
PrometheusReader behind ``diagnose``/``slo report --prometheus``) is checked whole, so a
malformed one is a one-line BadInput (exit 2) naming the URL, never a traceback; an answer is
read up to a size limit; a window that never ends is refused before anything is asked."""

from __future__ import annotations

import http.server
import json
import math
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from click.testing import CliRunner

from slokit.cli import main
from slokit.errors import BadInput
from slokit.sources.prometheus import (
    MAX_BYTES_ENV,
    AnswerTooLarge,
    PrometheusClient,
    backfill_samples,
    chunks,
)
from slokit.store.prometheus import PrometheusReader

NOW = 1796600000.0


def _ok(data: object) -> bytes:
    return json.dumps({"status": "success", "data": data}).encode()


def _matrix(values: object, metric: object = None) -> bytes:
    metric = {"__name__": "vllm:num_requests_running", "pod": "p0"} if metric is None else metric
    return _ok({"resultType": "matrix", "result": [{"metric": metric, "values": values}]})


TIME_OK = _ok({"resultType": "scalar", "result": [NOW, str(NOW)]})

#: Answers to ``time()`` that are not a Prometheus clock.
BAD_TIME = {
    "list": b"[]",
    "str": b'"hello"',
    "num": b"5",
    "null": b"null",
    "empty": b"",
    "html": b"<html>hi</html>",
    "not_utf8": b'{"status": "\xff\xfe"}',
    "nodata": b'{"status": "success"}',
    "data_list": _ok([1]),
    "data_null": _ok(None),
    "status_num": b'{"status": 5, "data": {}}',
    "error_obj": b'{"status": "error", "errorType": ["x"], "error": {"a": [1, 2]}}',
    "no_result_type": _ok({"result": [NOW, "1"]}),
    "time_empty": _ok({"resultType": "scalar", "result": []}),
    "time_str": _ok({"resultType": "scalar", "result": "x"}),
    "time_dict": _ok({"resultType": "scalar", "result": {"a": 1}}),
    "time_bad": _ok({"resultType": "scalar", "result": [NOW, "abc"]}),
    "time_nan": _ok({"resultType": "scalar", "result": ["NaN", "NaN"]}),
    "time_inf": b'{"status":"success","data":{"resultType":"scalar","result":[Infinity,"1"]}}',
    "time_neg": _ok({"resultType": "scalar", "result": [-5, "1"]}),
    "time_bigint": b'{"status":"success","data":{"resultType":"scalar","result":['
    + b"9" * 5000
    + b',"1"]}}',
    "time_bigint_300": b'{"status":"success","data":{"resultType":"scalar","result":['
    + b"9" * 400
    + b',"1"]}}',
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "deep_obj": b'{"status":"success","data":' + b'{"a":' * 100_000 + b"1" + b"}" * 100_001,
}

#: Range query answers (``time()`` answered well) that are not a matrix of series.
BAD_MATRIX = {
    "vector": _ok({"resultType": "vector", "result": []}),
    "res_none": _ok({"resultType": "matrix", "result": None}),
    "res_obj": _ok({"resultType": "matrix", "result": {"a": 1}}),
    "res_str_items": _ok({"resultType": "matrix", "result": ["x"]}),
    "no_metric": _ok({"resultType": "matrix", "result": [{"values": [[NOW, "1"]]}]}),
    "metric_list": _matrix([[NOW, "1"]], [1]),
    "metric_nested": _matrix([[NOW, "1"]], {"__name__": {"a": "b"}}),
    "name_num": _matrix([[NOW - 60, "1"]], {"__name__": 5, "pod": "p"}),
    "label_num": _matrix([[NOW - 60, "1"]], {"__name__": "vllm:num_requests_running", "pod": 5}),
    "label_null": _matrix(
        [[NOW - 60, "1"]], {"__name__": "vllm:num_requests_running", "pod": None}
    ),
    "values_str": _matrix("12"),
    "values_obj": _matrix({"a": 1}),
    "val_shape": _matrix([[NOW]]),
    "val_three": _matrix([[NOW, "1", "2"]]),
    "val_pair_str": _matrix(["12"]),
    "val_str": _matrix([[NOW, "abc"]]),
    "val_null": _matrix([[NOW, None]]),
    "val_list": _matrix([[NOW, ["1"]]]),
    "ts_str": _matrix([["abc", "1"]]),
    "ts_null": _matrix([[None, "1"]]),
    "ts_nan": _matrix([["NaN", "1"]]),
    "ts_inf": b'{"status":"success","data":{"resultType":"matrix","result":'
    b'[{"metric":{},"values":[[Infinity,"1"]]}]}}',
    "ts_huge": _matrix([[1e300, "1"]]),
    "ts_neg": _matrix([[-1e11, "1"]]),
    "label_surrogate": _matrix(
        [[NOW - 60, "1"]],
        {"__name__": "vllm:num_requests_running", "pod": "p\ud800", "model_name": "m"},
    ),
    "label_name_surrogate": _matrix(
        [[NOW - 60, "1"]],
        {"__name__": "vllm:num_requests_running", "\udcff": "x", "model_name": "m"},
    ),
    "ts_bigint": _matrix([[10**400, "1"]]),
}


# ---- a real HTTP server answering what a test says -----------------------------------------


class FakeProm:
    """A local HTTP server: ``answer(path, query)`` -> (status, body)."""

    def __init__(self) -> None:
        self.answer: Callable[[str, str], tuple[int, bytes]] = lambda p, q: (200, TIME_OK)
        self.asked: list[tuple[str, dict[str, list[str]]]] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                u = urlparse(self.path)
                params = parse_qs(u.query)
                fake.asked.append((u.path, params))
                status, body = fake.answer(u.path, params.get("query", [""])[0])
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prom() -> Iterator[FakeProm]:
    fake = FakeProm()
    try:
        yield fake
    finally:
        fake.close()


def _one_line_exit_2(result: Any, *needles: str) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _backfill(url: str, tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> Any:
    args = ["backfill", "--prometheus", url, "--start", "2h", "--end", "0s",
            "--db", str(tmp_path / "bf.duckdb"), *extra]  # fmt: skip
    return CliRunner().invoke(main, args, env=env)


# ---- backfill, diagnose, slo report against malformed answers -------------------------------


@pytest.mark.parametrize("name", sorted(BAD_TIME))
def test_backfill_refuses_a_malformed_clock_answer(
    prom: FakeProm, tmp_path: Path, name: str
) -> None:
    prom.answer = lambda path, query: (200, BAD_TIME[name])
    _one_line_exit_2(_backfill(prom.url, tmp_path), prom.url)


@pytest.mark.parametrize("name", sorted(BAD_MATRIX))
def test_backfill_refuses_a_malformed_range_answer(
    prom: FakeProm, tmp_path: Path, name: str
) -> None:
    prom.answer = lambda path, query: (200, TIME_OK if query == "time()" else BAD_MATRIX[name])
    _one_line_exit_2(_backfill(prom.url, tmp_path), "query_range")


@pytest.mark.parametrize("name", ["list", "nodata", "time_empty", "deep", "data_null"])
def test_diagnose_refuses_a_malformed_answer(prom: FakeProm, name: str) -> None:
    prom.answer = lambda path, query: (200, BAD_TIME[name])
    res = CliRunner().invoke(main, ["diagnose", "--prometheus", prom.url])
    _one_line_exit_2(res, prom.url)


@pytest.mark.parametrize("name", ["res_none", "val_str", "name_num", "val_shape", "ts_nan"])
def test_diagnose_refuses_a_malformed_range_answer(prom: FakeProm, name: str) -> None:
    prom.answer = lambda path, query: (200, TIME_OK if query == "time()" else BAD_MATRIX[name])
    res = CliRunner().invoke(main, ["diagnose", "--prometheus", prom.url])
    _one_line_exit_2(res, prom.url)


SPEC = """slokit: v1
service: chat
period: 30d
classes:
  - name: default
    good_when: {ttft_ms: 2000}
    objective: 0.95
"""

#: Instant query answers that are not a vector of series.
BAD_VECTOR = {
    "matrix": _ok({"resultType": "matrix", "result": []}),
    "res_none": _ok({"resultType": "vector", "result": None}),
    "item_str": _ok({"resultType": "vector", "result": ["x"]}),
    "no_metric": _ok({"resultType": "vector", "result": [{"value": [NOW, "1"]}]}),
    "no_value": _ok({"resultType": "vector", "result": [{"metric": {}}]}),
    "value_short": _ok({"resultType": "vector", "result": [{"metric": {}, "value": [NOW]}]}),
    "value_num": _ok({"resultType": "vector", "result": [{"metric": {}, "value": [NOW, 1]}]}),
    "value_bad": _ok({"resultType": "vector", "result": [{"metric": {}, "value": [NOW, "x"]}]}),
    "label_num": _ok(
        {"resultType": "vector", "result": [{"metric": {"class": 1}, "value": [NOW, "1"]}]}
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_VECTOR))
def test_slo_report_refuses_a_malformed_instant_answer(
    prom: FakeProm, tmp_path: Path, name: str
) -> None:
    spec = tmp_path / "slo.yaml"
    spec.write_text(SPEC)

    def answer(path: str, query: str) -> tuple[int, bytes]:
        if query == "time()":
            return 200, TIME_OK
        if path.endswith("query_range"):  # the extent: one point with data
            return 200, _matrix([[NOW - 60, "1"]], {})
        return 200, BAD_VECTOR[name]

    prom.answer = answer
    res = CliRunner().invoke(main, ["slo", "report", "--slo", str(spec), "--prometheus", prom.url])
    _one_line_exit_2(res, prom.url)


def test_a_native_histogram_sample_in_a_vector_is_skipped() -> None:
    body = _ok({"resultType": "vector", "result": [
        {"metric": {"a": "1"}, "histogram": [NOW, {"count": "1", "sum": "1"}]},
        {"metric": {"a": "2"}, "value": [NOW, "2"]},
    ]})  # fmt: skip
    got = _client(lambda r: httpx.Response(200, content=body)).query("x", NOW)
    assert got == [({"a": "2"}, 2.0)]


# ---- the reader: every answer it reads, mutated ----------------------------------------------


def _good_answer(request: httpx.Request) -> bytes:
    query = request.url.params.get("query", "")
    if query == "time()":
        return TIME_OK
    if request.url.path.endswith("query_range"):
        return _matrix([[NOW - 60, "1"], [NOW - 30, "2"]],
                       {"__name__": "vllm:num_requests_running", "pod": "p0",
                        "model_name": "m", "family": "ttft_count", "le": "1"})  # fmt: skip
    return _ok({"resultType": "vector", "result": [
        {"metric": {"pod": "p0", "family": "ttft_count", "le": "1"}, "value": [NOW, "3"]},
    ]})  # fmt: skip


_DROP = object()
_SERIES = ("data", "result", "*")


def _apply(doc: Any, path: tuple[str, ...], value: Any) -> Any:
    """``doc`` with ``value`` at ``path`` (``*``: each series of a result, not time()'s
    pair; ``point``: a series' value, or its values' only point; ``_DROP``: removed)."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    if key == "*":
        if not isinstance(doc, list):
            return doc
        return [_apply(x, rest, value) if isinstance(x, dict) else x for x in doc]
    if not isinstance(doc, dict):
        return doc
    out = dict(doc)
    if key == "point":
        if "value" in out:
            out["value"] = value
        else:
            out["values"] = [value]
    elif not rest and value is _DROP:
        out.pop(key, None)
    elif not rest or key in out:
        out[key] = _apply(out.get(key), rest, value)
    return out


MUTATIONS: dict[str, tuple[tuple[str, ...], Any]] = {}
_v: Any
for _name, _v in [("list", []), ("null", None), ("str", "x"), ("num", 1)]:
    MUTATIONS[f"top={_name}"] = ((), _v)
    MUTATIONS[f"data={_name}"] = (("data",), _v)
    MUTATIONS[f"result={_name}"] = (("data", "result"), _v)
    MUTATIONS[f"resultType={_name}"] = (("data", "resultType"), _v)
for _name, _v in [("list", [1]), ("null", None), ("num", 5), ("nested", {"a": {"b": 1}}),
                  ("surrogate", "\ud800")]:  # fmt: skip
    MUTATIONS[f"metric={_name}"] = ((*_SERIES, "metric"), _v)
    MUTATIONS[f"pod={_name}"] = ((*_SERIES, "metric", "pod"), _v)
    MUTATIONS[f"values={_name}"] = ((*_SERIES, "values"), _v)
    MUTATIONS[f"value={_name}"] = ((*_SERIES, "value"), _v)
for _name, _v in [("short", [NOW]), ("long", [NOW, "1", "2"]), ("ts_str", ["x", "1"]),
                  ("ts_nan", [math.nan, "1"]), ("ts_big", [1e300, "1"]), ("ts_neg", [-1e11, "1"]),
                  ("ts_bool", [True, "1"]),
                  ("v_null", [NOW, None]), ("v_abc", [NOW, "abc"]), ("v_num", [NOW, 1]),
                  ("dict", {"a": 1}), ("str", "12")]:  # fmt: skip
    MUTATIONS[f"point={_name}"] = ((*_SERIES, "point"), _v)
MUTATIONS["no_metric"] = ((*_SERIES, "metric"), _DROP)
MUTATIONS["no_value"] = ((*_SERIES, "value"), _DROP)
MUTATIONS["no_family"] = ((*_SERIES, "metric", "family"), _DROP)
MUTATIONS["le=abc"] = ((*_SERIES, "metric", "le"), "abc")


@pytest.mark.parametrize("name", sorted(MUTATIONS))
@pytest.mark.parametrize("ask", ["bounds", "engine", "requests", "summary", "sli"])
def test_the_reader_raises_only_bad_input_on_a_mutated_answer(name: str, ask: str) -> None:
    path, value = MUTATIONS[name]

    def handler(request: httpx.Request) -> httpx.Response:
        body = _good_answer(request)
        if request.url.params.get("query") != "time()" or ask == "bounds":
            body = json.dumps(_apply(json.loads(body), path, value)).encode()
        return httpx.Response(200, content=body)

    calls: dict[str, Callable[[PrometheusReader], object]] = {
        "bounds": lambda r: r.bounds(),
        "engine": lambda r: r.engine_buckets(NOW - 600, NOW, 10, 30),
        "requests": lambda r: r.request_buckets(NOW - 600, NOW, 10),
        "summary": lambda r: r.request_summaries(NOW - 600, NOW),
        "sli": lambda r: r.sli_counts(NOW - 600, NOW),
    }
    with PrometheusReader("http://prom.test", transport=httpx.MockTransport(handler)) as r:
        try:
            calls[ask](r)
        except BadInput as exc:
            assert "\n" not in str(exc) and "prom.test" in str(exc)


def test_a_bucket_bound_that_is_no_number_is_left_out() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=_ok({"resultType": "vector", "result": [
            {"metric": {"pod": "p0", "family": "ttft", "le": "abc"}, "value": [NOW, "3"]},
            {"metric": {"pod": "p0", "le": "1"}, "value": [NOW, "3"]},
            {"metric": {"pod": "p0", "family": "ttft", "le": "+Inf"}, "value": [NOW, "3"]},
        ]}))  # fmt: skip

    with PrometheusReader("http://prom.test", transport=httpx.MockTransport(handler)) as r:
        pods = r._window(NOW - 600, NOW)
    assert pods["p0"].buckets == {"ttft": {math.inf: 3.0}}


# ---- URLs and headers -----------------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://[::1", "http://", "http://h:abc", "http://ho\x00st"])
def test_an_invalid_url_is_bad_input(url: str, tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="--prometheus"):
        PrometheusClient(url)
    _one_line_exit_2(_backfill(url, tmp_path), "--prometheus")
    _one_line_exit_2(CliRunner().invoke(main, ["diagnose", "--prometheus", url]), "--prometheus")


def test_a_header_that_is_not_ascii_is_bad_input() -> None:
    with pytest.raises(BadInput, match="ASCII"):
        PrometheusReader("http://prom.test", headers={"X-Scope-OrgID": "équipe"})


# ---- windows that never end -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [("--start", v) for v in ("-inf", "inf", "nan", "1e300", "-5", "99999999999w", "x" * 100)]
    + [("--end", v) for v in ("inf", "nan", "1e300", "1e12")],
)  # fmt: skip
def test_backfill_refuses_a_time_out_of_range(
    prom: FakeProm, tmp_path: Path, option: str, value: str
) -> None:
    # A range query is answered with an error here: before the fix an infinite start or end
    # looped, asking range queries without end.
    prom.answer = lambda path, query: (
        (200, TIME_OK) if query == "time()"
        else (400, b'{"status":"error","errorType":"bad_data","error":"asked"}')
    )  # fmt: skip
    times = {"--start": "2h", "--end": "0s", option: value}
    res = CliRunner().invoke(main, ["backfill", "--prometheus", prom.url,
                                    *(f"{k}={v}" for k, v in times.items()),
                                    "--db", str(tmp_path / "bf.duckdb")])  # fmt: skip
    _one_line_exit_2(res, option)
    assert not [p for p, _ in prom.asked if p.endswith("query_range")]


@pytest.mark.parametrize("step", ["0.0001s", "99999999999999999999w"])
def test_backfill_refuses_a_step_out_of_range(prom: FakeProm, tmp_path: Path, step: str) -> None:
    _one_line_exit_2(_backfill(prom.url, tmp_path, "--step", step), "--step")


def test_backfill_refuses_a_window_of_too_many_steps(prom: FakeProm, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["backfill", "--prometheus", prom.url, "--start", "0",
                                    "--end", "0s", "--step", "1ms",
                                    "--db", str(tmp_path / "bf.duckdb")])  # fmt: skip
    _one_line_exit_2(res, "--step")
    assert not [p for p, _ in prom.asked if p.endswith("query_range")]


@pytest.mark.parametrize(
    ("start", "end", "step"),
    [(-math.inf, 0, 15), (0, math.inf, 15), (math.nan, 0, 15), (0, 10, math.inf),
     (0, 10, 1e-9), (0, 10, math.nan)],
)  # fmt: skip
def test_chunks_refuse_a_window_or_step_that_is_not_finite(
    start: float, end: float, step: float
) -> None:
    with pytest.raises(BadInput):
        next(chunks(start, end, step))


# ---- answer size, time, and the reading of a body --------------------------------------------


def _client(handler: Callable[[httpx.Request], httpx.Response], **kw: Any) -> PrometheusClient:
    return PrometheusClient(
        "http://prom.test", httpx.Client(transport=httpx.MockTransport(handler)), **kw
    )


class _Body(httpx.SyncByteStream):
    """A streamed body of ``n`` chunks of ``size`` bytes, counting what was read."""

    def __init__(self, n: int, size: int, delay_s: float = 0.0) -> None:
        self.n, self.size, self.delay_s, self.sent = n, size, delay_s, 0

    def __iter__(self) -> Iterator[bytes]:
        for _ in range(self.n):
            if self.delay_s:
                time.sleep(self.delay_s)
            self.sent += self.size
            yield b" " * self.size


def test_an_answer_past_the_limit_stops_being_read() -> None:
    body = _Body(n=1000, size=64 * 1024)  # 64 MB of spaces, never JSON's end
    client = _client(lambda r: httpx.Response(200, stream=body), max_bytes=1024 * 1024)
    with pytest.raises(AnswerTooLarge, match=rf"1 MiB limit \({MAX_BYTES_ENV}\)"):
        client.server_time()
    assert body.sent <= 1024 * 1024 + 64 * 1024


def test_a_gzip_bomb_stops_inflating_at_the_limit() -> None:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip
    raw = packer.compress(b" " * (64 * 1024 * 1024)) + packer.flush()  # 64 MiB in ~64 KB
    parts = [raw[i : i + 2048] for i in range(0, len(raw), 2048)]
    sent: list[int] = []

    class Bomb(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            for part in parts:
                sent.append(len(part))
                yield part

    client = _client(
        lambda r: httpx.Response(200, headers={"Content-Encoding": "gzip"}, stream=Bomb()),
        max_bytes=1024 * 1024,
    )
    with pytest.raises(AnswerTooLarge):
        client.server_time()
    assert len(sent) < len(parts) // 4


def test_an_error_text_is_one_printable_line() -> None:
    body = json.dumps({"status": "error", "errorType": "bad\ndata",
                       "error": "line 1\nline 2\x1b[31m" + "x" * 10_000}).encode()  # fmt: skip
    with pytest.raises(BadInput) as info:
        _client(lambda r: httpx.Response(422, content=body)).server_time()
    text = str(info.value)
    assert "\n" not in text and "\x1b" not in text and len(text) < 400
    assert "bad data: line 1 line 2?[31m" in text


def test_an_answer_declared_past_the_limit_is_not_read() -> None:
    body = _Body(n=100, size=1024)
    client = _client(
        lambda r: httpx.Response(200, headers={"Content-Length": str(10**12)}, stream=body),
        max_bytes=1024,
    )
    with pytest.raises(AnswerTooLarge):
        client.server_time()
    assert body.sent == 0


def test_an_answer_that_trickles_in_past_the_deadline_is_bad_input() -> None:
    body = _Body(n=1000, size=1, delay_s=0.01)
    client = _client(lambda r: httpx.Response(200, stream=body), deadline_s=0.2)
    with pytest.raises(BadInput, match="took over"):
        client.server_time()
    assert body.sent < 100


def test_the_limit_is_set_by_the_environment(
    monkeypatch: pytest.MonkeyPatch, prom: FakeProm, tmp_path: Path
) -> None:
    monkeypatch.setenv(MAX_BYTES_ENV, "1K")
    assert PrometheusClient("http://x").max_bytes == 1024
    prom.answer = lambda path, query: (200, TIME_OK + b" " * 2048)
    res = _backfill(prom.url, tmp_path)
    _one_line_exit_2(res, "1024 bytes limit", MAX_BYTES_ENV, "narrow")
    for bad in ["banana", "0", "9" * 400, "-1M"]:
        monkeypatch.setenv(MAX_BYTES_ENV, bad)
        _one_line_exit_2(_backfill(prom.url, tmp_path), MAX_BYTES_ENV)


def _steps_answer(limit_points: int, seen: list[tuple[float, float]]) -> Callable[..., Any]:
    """A range query answer of one series with a point per step; past ``limit_points``
    points, a body bigger than the client's limit."""

    def handler(request: httpx.Request) -> httpx.Response:
        p = request.url.params
        if p["query"] == "time()":
            return httpx.Response(200, content=TIME_OK)
        start, end, step = float(p["start"]), float(p["end"]), float(p["step"])
        n = int((end - start) / step + 1e-6) + 1
        if n > limit_points:
            return httpx.Response(200, content=b" " * 5000)
        seen.append((start, end))
        values = [[start + i * step, "1"] for i in range(n)]
        return httpx.Response(200, content=_matrix(values, {
            "__name__": "vllm:num_requests_running", "pod": "p0", "model_name": "m"}))  # fmt: skip

    return handler


def test_a_range_too_big_to_answer_is_asked_in_halves() -> None:
    seen: list[tuple[float, float]] = []
    client = _client(_steps_answer(limit_points=30, seen=seen), max_bytes=4096)
    got = list(backfill_samples(client, 0.0, 990.0, 10.0))
    engine = [e for chunk, _, _, _ in got for e in chunk]
    assert sorted(e.ts for e in engine) == [10.0 * i for i in range(100)]  # each step once
    assert all(round((b - a) / 10) + 1 <= 30 for a, b in seen)


def test_a_single_step_too_big_is_bad_input_after_a_few_tries() -> None:
    seen: list[tuple[float, float]] = []
    asked: list[httpx.Request] = []
    answer = _steps_answer(limit_points=0, seen=seen)

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return answer(request)

    client = _client(handler, max_bytes=4096)
    with pytest.raises(AnswerTooLarge, match="narrow"):
        list(backfill_samples(client, 0.0, 10.0 * 10_999, 10.0))
    assert len(asked) <= 16  # 11,000 steps halved down to one


def test_a_body_cut_short_is_bad_input(prom: FakeProm) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("peer closed connection", request=request)

    with pytest.raises(BadInput, match="cannot reach Prometheus"):
        _client(handler).server_time()


def test_a_deep_answer_read_in_a_thread_is_bad_input() -> None:
    # request_summaries asks two queries at once, in threads
    deep = b"[" * 100_000 + b"]" * 100_000

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=deep)

    with (
        PrometheusReader("http://prom.test", transport=httpx.MockTransport(handler)) as r,
        pytest.raises(BadInput, match="nested too deeply"),
    ):
        r.request_summaries(NOW - 600, NOW)
