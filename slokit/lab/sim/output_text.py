"""The simulated output text of a request, where a ``stop`` string ends it, and its stream.

Output token ``i`` of a request is the text ``" " + output_word(seed, i)`` (see
:mod:`slokit.lab.sim.tokens`), so the text is known before the engine runs. Stop strings
follow vLLM's detokenizer (``vllm/v1/engine/detokenizer.py``): after each output token past
``min_tokens`` it looks for every stop string, in the request's order, where it could end in
the new characters; the first found ends the request there (finish reason ``stop``, stop
reason the string), its text cut before the stop string (after it with
``include_stop_str_in_output``). While streaming, vLLM holds back the last
``len(longest stop) - 1`` characters until the request finishes, so that a client never sees
the start of a stop string; :class:`TextStream` does the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slokit.lab.sim.tokens import output_word


def token_text(seed: int, index: int) -> str:
    """The text of output token ``index`` of a request with ``seed``."""
    return " " + output_word(seed, index)


@dataclass(frozen=True)
class StopHit:
    """Where a stop string ends a request."""

    num_tokens: int  # output tokens generated, the one that completed the stop string included
    text_end: int  # characters of the output text the client gets
    stop: str  # the stop string (vLLM's ``stop_reason``)


def find_stop(
    seed: int,
    stops: Sequence[str],
    max_output: int,
    min_tokens: int = 0,
    include_stop: bool = False,
) -> StopHit | None:
    """The first stop string within the first ``max_output`` output tokens, as vLLM's
    detokenizer finds it token by token; None when the text never contains one."""
    if not stops:
        return None
    text = ""
    for n in range(1, max_output + 1):
        piece = token_text(seed, n - 1)
        text += piece
        if n <= min_tokens:
            continue
        for stop in stops:
            at = text.find(stop, max(0, len(text) + 1 - len(piece) - len(stop)))
            if at != -1:
                return StopHit(n, at + len(stop) if include_stop else at, stop)
    return None


@dataclass(frozen=True)
class OutputText:
    """What a client gets of a request's output: its tokens' text, cut at a stop string."""

    seed: int
    hit: StopHit | None = None
    hold_back: int = 0  # characters withheld from a stream until the request finishes

    @classmethod
    def plan(
        cls,
        seed: int,
        stops: Sequence[str],
        max_output: int,
        min_tokens: int = 0,
        include_stop: bool = False,
    ) -> OutputText:
        hit = find_stop(seed, stops, max_output, min_tokens, include_stop)
        hold = 0 if include_stop or not stops else max(map(len, stops)) - 1
        return cls(seed, hit, hold)

    @property
    def stop_reason(self) -> str | None:
        return self.hit.stop if self.hit is not None else None

    def text(self, num_tokens: int) -> str:
        """The text of the first ``num_tokens`` output tokens, cut at the stop string."""
        text = "".join(token_text(self.seed, i) for i in range(num_tokens))
        if self.hit is not None and num_tokens >= self.hit.num_tokens:
            return text[: self.hit.text_end]
        return text


class TextStream:
    """The text deltas a streaming client gets, one per output token (vLLM's
    ``get_next_output_text`` with delta output): without stop strings each token's text."""

    def __init__(self, output: OutputText):
        self._output = output
        self._tokens = 0
        self._length = 0  # characters generated
        self._sent = 0  # characters sent
        self._pending = ""  # generated, not sent yet

    def deltas(self, new_tokens: int, finished: bool) -> list[str]:
        """Deltas of the next ``new_tokens`` tokens; with ``finished`` the last one releases
        the rest of the text, cut at the stop string."""
        out = self._output
        deltas: list[str] = []
        for i in range(new_tokens):
            piece = token_text(out.seed, self._tokens)
            self._tokens += 1
            self._length += len(piece)
            self._pending += piece
            if not (finished and i == new_tokens - 1):
                end = self._length - out.hold_back
            elif out.hit is not None and self._tokens >= out.hit.num_tokens:
                end = out.hit.text_end
            else:
                end = self._length
            take = end - self._sent
            if take > 0:
                deltas.append(self._pending[:take])
                self._pending = self._pending[take:]
                self._sent = end
            else:
                deltas.append("")
        return deltas
