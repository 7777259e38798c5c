import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slokit.ids import (
    MAX_REQUEST_ID_CHARS,
    InvalidRequestId,
    candidate_ids,
    checked_request_id,
    normalize_request_id,
)


def test_completion_span_id_loses_prefix_and_subindex() -> None:
    assert normalize_request_id("cmpl-r24-0", from_span=True) == "r24"


def test_chat_span_id_loses_prefix_only() -> None:
    assert normalize_request_id("chatcmpl-fx-4", from_span=True) == "fx-4"


def test_response_id_keeps_a_trailing_number_of_the_client_id() -> None:
    assert normalize_request_id("cmpl-fx-1") == "fx-1"


def test_bare_client_id_is_unchanged() -> None:
    assert normalize_request_id("run7-000123") == "run7-000123"


def test_candidates_cover_span_and_response_forms() -> None:
    assert candidate_ids("cmpl-r24-0")[:2] == ["r24-0", "r24"]
    assert candidate_ids("r24") == ["r24"]


@pytest.mark.parametrize(
    ("raw", "from_span"),
    [(" ", False), ("\t", False), ("chatcmpl-", False), ("cmpl-", False), ("cmpl--0", True),
     ("chatcmpl- ", True), ("", False)],
)  # fmt: skip
def test_an_id_empty_once_normalized_is_refused(raw: str, from_span: bool) -> None:
    with pytest.raises(InvalidRequestId) as err:
        checked_request_id(raw, from_span=from_span)
    assert err.value.reason == "request id empty once normalized"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [("a\nb", "request id has control characters"), ("a\x00", "request id has control characters"),
     ("x" * (MAX_REQUEST_ID_CHARS + 1), "request id longer than 512 characters")],
)  # fmt: skip
def test_an_id_that_cannot_be_a_key_is_refused_with_its_reason(raw: str, reason: str) -> None:
    with pytest.raises(InvalidRequestId) as err:
        checked_request_id(raw)
    assert err.value.reason == reason


def test_a_checked_id_is_the_normalized_id() -> None:
    assert checked_request_id(" cmpl-r24-0 ", from_span=True) == "r24"
    assert checked_request_id("x" * MAX_REQUEST_ID_CHARS) == "x" * MAX_REQUEST_ID_CHARS


def _normalized_by_the_regular_expressions(raw: str, from_span: bool) -> str:
    """The rule as first written, with regular expressions: the specification."""
    rid = raw.strip()
    if from_span and rid.startswith("cmpl-"):
        rid = re.sub(r"-\d+$", "", rid, count=1)
    return re.sub(r"^(?:chatcmpl|cmpl)-", "", rid, count=1).strip()


_IDS = st.tuples(
    st.sampled_from(["", " ", "cmpl-", "chatcmpl-", "cmpl-chatcmpl-", "-"]),
    st.text(max_size=4),
    st.sampled_from(["", "-", "--"]),
    st.sampled_from(["", "0", "12", "\u0663", "\u00b2", "x", "7-"]),  # \u00b2: a digit, not \d
    st.sampled_from(["", " ", "\n"]),
).map("".join)


@given(raw=_IDS, from_span=st.booleans())
def test_normalization_is_what_the_regular_expressions_say(raw: str, from_span: bool) -> None:
    expected = _normalized_by_the_regular_expressions(raw, from_span)
    assert normalize_request_id(raw, from_span=from_span) == expected
