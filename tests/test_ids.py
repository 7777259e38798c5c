from slokit.ids import candidate_ids, normalize_request_id


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
