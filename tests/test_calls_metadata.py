"""The call model's metadata record: its published map, the cleaning of peer values and the
check of a profile's ``metadata_headers`` (SIP's extraction: tests/test_sip_call_metadata.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from calls.metadata import MAX_VALUE_CHARS, CallMetadata, clean_value, listed_headers
from calls.profile import Profile


def test_as_map_leaves_absent_fields_out_and_adds_the_listed_headers() -> None:
    meta = CallMetadata(from_uri="sip:a@b", dialled="4000", headers=(("X-Agent-Id", "1001"),))
    assert meta.as_map() == {"from_uri": "sip:a@b", "dialled_number": "4000", "X-Agent-Id": "1001"}
    assert CallMetadata().as_map() == {}


def test_clean_value_drops_control_characters_trims_and_cuts() -> None:
    assert clean_value("  sales\x00\x1b[31m  ") == "sales[31m"
    assert clean_value("a" * (MAX_VALUE_CHARS + 5)) == "a" * MAX_VALUE_CHARS


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ([f"X-H{i}" for i in range(17)], "at most 16"),
        (["X_Agent"], "not a header name"),
        (["X-Agent-Id", "x-agent-id"], "listed twice"),
    ],
)
def test_profile_header_list_is_checked(names: list[str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Profile(metadata_headers=names)


def test_listed_headers_keep_the_profiles_spelling_and_order_and_clean_the_values() -> None:
    attributes = {"uuid": " 0a0a\x00 ", "queue": "sales", "QUEUE": "ignored", "blank": "\x01 ", "other": "x"}
    assert listed_headers(attributes, ["Queue", "UUID", "Missing", "Blank"]) == (("Queue", "sales"), ("UUID", "0a0a"))
    assert listed_headers(attributes, []) == ()
