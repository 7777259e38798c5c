"""``stop`` strings end the simulated output where its deterministic text contains one, as
vLLM's detokenizer does: finish reason ``stop``, ``stop_reason`` the string, the text cut."""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

import httpx

from slokit.lab.sim.background import BackgroundSim
from slokit.lab.sim.output_text import OutputText, StopHit, TextStream, find_stop, token_text

# X-Request-Id s1 seeds the output " we some before world old or no our each under on her"
RID = "s1"
SEED = zlib.crc32(RID.encode())
TEXT = " we some before world old or no our each under on her"


def _complete(sim: BackgroundSim, **body: Any) -> httpx.Response:
    payload = {"prompt": "a b c", "max_tokens": 12, **body}
    return httpx.post(f"{sim.url}/v1/completions", json=payload, headers={"X-Request-Id": RID})


def _events(text: str) -> list[Any]:
    return [
        json.loads(e[len("data: ") :])
        for e in text.split("\n\n")
        if e.startswith("data: ") and e != "data: [DONE]"
    ]


def test_the_output_text_is_the_seeded_words() -> None:
    assert "".join(token_text(SEED, i) for i in range(12)) == TEXT


def test_find_stop_follows_vllms_detokenizer() -> None:
    assert find_stop(SEED, ["world"], 12) == StopHit(4, len(" we some before "), "world")
    # a stop string across tokens ends the request at the token that completes it
    assert find_stop(SEED, ["xyz", "or no"], 12) == StopHit(7, TEXT.index("or no"), "or no")
    # the first stop string in the request's order wins where several end in the same token
    assert find_stop(SEED, ["ld", "world"], 12) == StopHit(4, TEXT.index("ld"), "ld")
    assert find_stop(SEED, ["world"], 12, include_stop=True) == StopHit(4, 21, "world")
    assert find_stop(SEED, ["world"], 3) is None  # beyond the output
    assert find_stop(SEED, ["zebra"], 12) is None
    # no stop check until min_tokens tokens are out; " some" ends within them
    assert find_stop(SEED, ["some"], 12, min_tokens=2) is None
    assert find_stop(SEED, ["some"], 12, min_tokens=1) == StopHit(2, 4, "some")


def test_stream_holds_back_what_could_start_a_stop_string() -> None:
    plan = OutputText.plan(SEED, ["xyz", "or no"], 12)
    assert plan.hit is not None and plan.hold_back == 4
    stream = TextStream(plan)
    deltas = stream.deltas(6, False) + stream.deltas(1, True)
    assert len(deltas) == 7
    assert "".join(deltas) == plan.text(7) == " we some before world old "
    # the last 4 characters wait: they could start "or no"
    assert "".join(deltas[:6]) == " we some before world ol" and deltas[6] == "d "
    # without stop strings every token's text goes out as it comes
    plain = TextStream(OutputText(SEED))
    assert plain.deltas(3, False) + plain.deltas(1, True) == [token_text(SEED, i) for i in range(4)]


def test_stop_string_ends_a_completion(sim: BackgroundSim) -> None:
    r = _complete(sim, stop="world")
    assert r.status_code == 200
    choice = r.json()["choices"][0]
    assert choice["text"] == " we some before "
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", "world")
    assert r.json()["usage"]["completion_tokens"] == 4


def test_stop_list_and_include_stop_str_in_output(sim: BackgroundSim) -> None:
    choice = _complete(sim, stop=["xyz", "or no"]).json()["choices"][0]
    assert choice["text"] == " we some before world old "
    assert choice["stop_reason"] == "or no"
    choice = _complete(sim, stop=["world"], include_stop_str_in_output=True).json()["choices"][0]
    assert choice["text"] == " we some before world"


def test_a_stop_string_the_text_never_contains_changes_nothing(sim: BackgroundSim) -> None:
    choice = _complete(sim, stop=["zebra"]).json()["choices"][0]
    assert choice["text"] == TEXT
    assert (choice["finish_reason"], choice["stop_reason"]) == ("length", None)


def test_stop_at_the_last_allowed_token_is_stop_not_length(sim: BackgroundSim) -> None:
    choice = _complete(sim, stop="world", max_tokens=4).json()["choices"][0]
    assert (choice["finish_reason"], choice["text"]) == ("stop", " we some before ")
    metrics = httpx.get(f"{sim.url}/metrics").text
    assert re.search(
        r'vllm:request_success_total\{engine="0",finished_reason="stop",[^}]*\} 1\.0', metrics
    )


def test_stop_in_a_completion_stream(sim: BackgroundSim) -> None:
    body = {"prompt": "a b c", "max_tokens": 12, "stream": True, "stop": ["xyz", "or no"],
            "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", f"{sim.url}/v1/completions", json=body,
                      headers={"X-Request-Id": RID}) as r:  # fmt: skip
        events = _events("".join(r.iter_text()))
    tokens, usage = events[:-1], events[-1]
    assert len(tokens) == 7 and usage["usage"]["completion_tokens"] == 7
    assert "".join(e["choices"][0]["text"] for e in tokens) == " we some before world old "
    assert [e["choices"][0]["finish_reason"] for e in tokens] == [None] * 6 + ["stop"]
    assert tokens[-1]["choices"][0]["stop_reason"] == "or no"


def test_stop_in_chat(sim: BackgroundSim) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12, "stop": "world"}
    r = httpx.post(f"{sim.url}/v1/chat/completions", json=body, headers={"X-Request-Id": RID})
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == " we some before "
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", "world")
    with httpx.stream("POST", f"{sim.url}/v1/chat/completions", json={**body, "stream": True},
                      headers={"X-Request-Id": RID}) as s:  # fmt: skip
        events = _events("".join(s.iter_text()))
    assert "".join(e["choices"][0]["delta"]["content"] for e in events) == " we some before "
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"][0]["stop_reason"] == "world"


def test_invalid_stop_is_a_bad_request(sim: BackgroundSim) -> None:
    for stop in ["", [""], 5, ["a", 1]]:
        r = _complete(sim, stop=stop)
        assert r.status_code == 400, stop
        assert r.json()["error"]["param"] == "stop"
