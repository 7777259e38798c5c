"""The client record: one JSON line per request, written by ``slokit load`` and read by
``slokit ingest requests``.

The field names are defined here once, for the writer (:mod:`slokit.lab.load.records`) and
the reader (:func:`slokit.sources.files.parse_load_jsonl`) alike; this module depends on
neither, so sources never import the lab.

A file holds one compact JSON object per line (:func:`record_line`), keys in
:data:`RECORD_KEYS` order, every key present. Times (``*_ts``) are Unix epoch seconds,
durations (``*_s``) seconds, unknowns ``null``. vLLM may pack several tokens into one
chunk when its API server falls behind, so a record can hold fewer gaps in :data:`ITL_S`
than ``output_tokens - 1`` (TPOT is ``(e2e - ttft) / (output_tokens - 1)``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

#: The ``X-Request-Id`` the request carried (``<run>-<seq>``); unique within a file.
REQUEST_ID: Final = "request_id"
#: The W3C trace id sent in ``traceparent`` (32 hex digits; the client span's, if exported).
TRACE_ID: Final = "trace_id"
#: The model named in the request.
MODEL: Final = "model"
#: The workload class's SLO class, task id and tenant (``null`` when the class sets none).
SLO_CLASS: Final = "slo_class"
TASK_ID: Final = "task_id"
TENANT: Final = "tenant"
#: When the request was sent (epoch seconds).
SEND_TS: Final = "send_ts"
#: When the first content chunk arrived (epoch seconds; ``null`` when none did).
FIRST_TOKEN_TS: Final = "first_token_ts"
#: When the stream ended, or the request failed (epoch seconds).
FINISH_TS: Final = "finish_ts"
#: Seconds from the send to the first content chunk.
TTFT_S: Final = "ttft_s"
#: Seconds from the send to the end of the stream.
E2E_S: Final = "e2e_s"
#: The gaps between consecutive content chunks (a list of seconds; empty when under two).
ITL_S: Final = "itl_s"
#: Prompt and output token counts from the stream's final usage chunk.
PROMPT_TOKENS: Final = "prompt_tokens"
OUTPUT_TOKENS: Final = "output_tokens"
#: The ``max_tokens`` the request asked for.
MAX_TOKENS: Final = "max_tokens"
#: ``ok`` (the stream ended with ``[DONE]``), ``error`` (HTTP error, error event, broken or
#: truncated stream; :data:`ERROR_TYPE` says which), ``timeout`` (the client's own per-request
#: limit), ``cancelled`` (the run was stopped) or ``incomplete`` (still in flight when the run
#: ended and its drain was over: cut by the load generator, error type ``load_end``; no
#: failure of the server).
STATUS: Final = "status"
#: The HTTP status of the answer (``null`` when none came).
HTTP_STATUS: Final = "http_status"
#: A short name for the failure (``null`` when the request succeeded).
ERROR_TYPE: Final = "error_type"
#: The ``finish_reason`` of the last choice (``length``, ``stop``...).
FINISH_REASON: Final = "finish_reason"
#: The planned send time in the open loop (epoch seconds); ``null`` in the closed loop.
SCHEDULED_TS: Final = "scheduled_ts"

#: The keys of one client record, in file order.
RECORD_KEYS: Final[tuple[str, ...]] = (
    REQUEST_ID,
    TRACE_ID,
    MODEL,
    SLO_CLASS,
    TASK_ID,
    TENANT,
    SEND_TS,
    FIRST_TOKEN_TS,
    FINISH_TS,
    TTFT_S,
    E2E_S,
    ITL_S,
    PROMPT_TOKENS,
    OUTPUT_TOKENS,
    MAX_TOKENS,
    STATUS,
    HTTP_STATUS,
    ERROR_TYPE,
    FINISH_REASON,
    SCHEDULED_TS,
)


def record_line(record: Mapping[str, object]) -> str:
    """One record as its line of the file (compact JSON, without the newline)."""
    return json.dumps(record, separators=(",", ":"))
