"""Arbitrary requests to the OTLP/HTTP receiver never produce a 500 (or a crash)."""

from __future__ import annotations

import gzip

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sidecar_harness import StartSidecar

CONTENT_TYPES = st.sampled_from(
    ["application/x-protobuf", "application/json", "application/protobuf", "text/plain", "",
     "application/json; charset=utf-8", "multipart/form-data"]
)  # fmt: skip
ENCODINGS = st.sampled_from([None, "gzip", "deflate", "identity", "br", "x-gzip"])


def _mutations(seed: bytes) -> st.SearchStrategy[bytes]:
    """Random bytes, and the real export cut or with bytes flipped (reaches deep branches)."""
    flips = st.lists(st.tuples(st.integers(0, len(seed) - 1), st.integers(1, 255)), max_size=8)

    def flip(changes: list[tuple[int, int]]) -> bytes:
        b = bytearray(seed)
        for i, x in changes:
            b[i] ^= x
        return bytes(b)

    return st.one_of(
        st.binary(max_size=2048),
        st.integers(0, len(seed)).map(lambda n: seed[:n]),
        flips.map(flip),
        st.text(max_size=300).map(str.encode),
        st.just(b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}'),
    )


def test_the_http_receiver_answers_anything_without_a_500(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar(max_body_bytes=256 * 1024)
    client = httpx.Client(timeout=10)

    @settings(max_examples=150, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
    @given(body=_mutations(export_body), ct=CONTENT_TYPES, enc=ENCODINGS, gz=st.booleans())
    def check(body: bytes, ct: str, enc: str | None, gz: bool) -> None:
        if gz and enc in ("gzip", "x-gzip"):
            body = gzip.compress(body)
        headers = {"Content-Type": ct}
        if enc:
            headers["Content-Encoding"] = enc
        resp = client.post(sc.otlp, content=body, headers=headers)
        assert resp.status_code in (200, 400, 413, 415), (resp.status_code, resp.text[:200])

    try:
        check()
    finally:
        client.close()
    assert httpx.get(f"{sc.api}/readyz").status_code == 200
