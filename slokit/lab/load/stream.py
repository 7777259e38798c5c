"""Reading a streamed answer into its client record: SSE events, and names for failures.

Every request streams (``stream: true``, ``stream_options: {include_usage: true}``); TTFT
is the first content chunk, every gap between content chunks is an inter-token gap, and
the token counts come from the final usage chunk.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from slokit import clientlog as cl


def apply_event(
    payload: bytes, t: float, chat: bool, rec: dict[str, Any], token_ts: list[float]
) -> bool:
    """Apply one SSE ``data:`` event to the record; ``False`` ends the stream as an error.

    A completions chunk with choices is one engine step (its text may be empty while the
    detokenizer holds back a partial character); a chat chunk counts only when it carries
    content, since vLLM sends the assistant role chunk before the first token.
    """
    try:
        obj = json.loads(payload)
    except ValueError:
        rec[cl.STATUS], rec[cl.ERROR_TYPE] = "error", "bad_sse_json"
        return False
    if not isinstance(obj, dict):
        rec[cl.STATUS], rec[cl.ERROR_TYPE] = "error", "bad_sse_json"
        return False
    if "error" in obj:
        rec[cl.STATUS], rec[cl.ERROR_TYPE] = "error", error_type(payload, None)
        return False
    choices = obj.get("choices")
    if choices:
        c = choices[0]
        if chat:
            delta = c.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content"):
                token_ts.append(t)
        else:
            token_ts.append(t)
        if c.get("finish_reason") is not None:
            rec[cl.FINISH_REASON] = c["finish_reason"]
    usage = obj.get("usage")
    if usage:
        rec[cl.PROMPT_TOKENS] = usage.get("prompt_tokens")
        rec[cl.OUTPUT_TOKENS] = usage.get("completion_tokens")
    return True


def exception_type(exc: BaseException) -> str:
    """A stable name for a client-side failure."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect_error"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server_disconnected"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "stream_truncated"
    return type(exc).__name__


def error_type(raw: bytes, http_status: int | None) -> str:
    """vLLM's ``{"error": {"type": ...}}`` or ``http_<status>`` when the body says nothing."""
    try:
        err = json.loads(raw).get("error")
        if isinstance(err, dict) and err.get("type"):
            return str(err["type"])
        if isinstance(err, str) and err:
            return err
    except (ValueError, AttributeError):
        pass
    return f"http_{http_status}" if http_status is not None else "stream_error"
