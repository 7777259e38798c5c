"""The simulator's deterministic tokenizer and output vocabulary.

Tokenizer (documented, deterministic): one token per whitespace-separated word of the
prompt, token id = CRC-32 of the word. Output tokens are words from a fixed list chosen
by the request's seed and position, so a request's output is known before the engine runs.
"""

from __future__ import annotations

import zlib

VOCAB_WORDS = (
    "the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "with", "as", "was", "at",
    "by", "an", "be", "this", "are", "from", "or", "have", "not", "but", "had", "they",
    "which", "one", "you", "were", "all", "we", "can", "her", "has", "there", "been", "if",
    "more", "when", "will", "would", "who", "so", "no", "out", "up", "into", "do", "than",
    "time", "its", "only", "other", "new", "some", "could", "these", "two", "may", "first",
    "then", "any", "like", "my", "now", "over", "such", "our", "man", "me", "even", "most",
    "made", "after", "also", "did", "many", "off", "before", "must", "well", "back", "through",
    "years", "much", "where", "your", "way", "down", "should", "because", "each", "just",
    "those", "people", "how", "too", "little", "state", "good", "very", "make", "world",
    "still", "see", "own", "men", "work", "long", "here", "get", "both", "between", "life",
    "being", "under", "never", "day", "same", "another", "know", "while", "last", "might",
    "us", "great", "old", "year", "since", "come",
)  # fmt: skip


def tokenize(text: str) -> list[int]:
    """One token per whitespace-separated word; id = CRC-32 of the word."""
    return [zlib.crc32(w.encode()) for w in text.split()]


VOCAB_IDS = tuple(zlib.crc32(w.encode()) for w in VOCAB_WORDS)


def output_index(seed: int, index: int) -> int:
    """Which vocabulary word is output token ``index`` of a request with ``seed``."""
    return (seed * 2654435761 + index * 40503) % len(VOCAB_WORDS)


def output_word(seed: int, index: int) -> str:
    return VOCAB_WORDS[output_index(seed, index)]
