"""Field rules shared by SDK and server: names, reasons, revisions, idempotency keys."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbit._rules import (
    NAME_RE,
    REASON_MAX_CHARS,
    UINT64_MAX,
    check_name,
    check_reason,
    check_timestamp,
    is_idempotency_key,
    parse_revision,
)

# --- names -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "Z", "0", "a" * 128, "images.v2", "team:build-1", "a_b", "9-x"])
def test_name_valid(name):
    assert check_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "-a", "_a", ".a", ":a", "a" * 129, "a b", " a", "a ", "a/b", "a\n", "\na", "é", "caf\u00e9", "a\x00"],
)
def test_name_invalid(name):
    with pytest.raises(ValueError):
        check_name(name)


@settings(max_examples=60, deadline=None)
@given(st.from_regex(NAME_RE.pattern.replace("\\Z", "$"), fullmatch=True))
def test_name_regex_language_accepted(name):
    assert check_name(name) == name


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=140))
def test_name_accepts_exactly_the_documented_alphabet(name):
    allowed = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-")
    expected = 1 <= len(name) <= 128 and name[0].isascii() and name[0].isalnum() and set(name) <= allowed
    try:
        check_name(name)
        ok = True
    except ValueError:
        ok = False
    assert ok == expected


# --- reasons -----------------------------------------------------------------


@pytest.mark.parametrize("reason", ["x", "  padded  ", "a" * REASON_MAX_CHARS, "\u00e9" * 1024, "\U0001f600" * 1024])
def test_reason_valid_up_to_1024_characters(reason):
    assert check_reason(reason) == reason


@pytest.mark.parametrize("reason", ["", " ", "\t\n", "\u3000", "a" * 1025, "\u00e9" * 1025, "\U0001f600" * 1025])
def test_reason_invalid(reason):
    with pytest.raises(ValueError):
        check_reason(reason)


def test_reason_counts_characters_not_bytes():
    assert REASON_MAX_CHARS == 1024
    multibyte = "\u4e2d" * 1024  # 3 bytes each in UTF-8
    assert len(multibyte.encode()) == 3072
    assert check_reason(multibyte) == multibyte
    combining = "e\u0301" * 512  # 1024 code points
    assert check_reason(combining) == combining
    with pytest.raises(ValueError):
        check_reason(combining + "x")


# --- revisions ---------------------------------------------------------------


def test_revision_bounds():
    assert parse_revision("1") == 1
    assert parse_revision(str(UINT64_MAX)) == UINT64_MAX == 18446744073709551615
    with pytest.raises(ValueError):
        parse_revision(str(UINT64_MAX + 1))


@pytest.mark.parametrize(
    "text",
    ["0", "01", "00", "", "-1", "+1", " 1", "1 ", "1\n", "1.0", "1e3", "0x1", "1_000",
     "\uff11", "99999999999999999999", "1" * 21],
)
def test_revision_invalid(text):
    with pytest.raises(ValueError):
        parse_revision(text)


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=1, max_value=UINT64_MAX))
def test_revision_round_trip(n):
    assert parse_revision(str(n)) == n


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=UINT64_MAX + 1, max_value=10**30))
def test_revision_above_uint64_rejected(n):
    with pytest.raises(ValueError):
        parse_revision(str(n))


# --- idempotency keys --------------------------------------------------------


@pytest.mark.parametrize("key", ["a", "k" * 128, "".join(chr(c) for c in range(0x21, 0x7F)), "~!@#$%^&*()"])
def test_idempotency_key_valid(key):
    assert is_idempotency_key(key)


@pytest.mark.parametrize("key", [None, "", "k" * 129, "a b", " a", "a\n", "a\t", "\x7f", "\x20", "cl\u00e9", "\x00"])
def test_idempotency_key_invalid(key):
    assert not is_idempotency_key(key)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=140))
def test_idempotency_key_is_visible_ascii_1_to_128(key):
    expected = 1 <= len(key) <= 128 and all(0x21 <= ord(c) <= 0x7E for c in key)
    assert is_idempotency_key(key) == expected


# --- timestamps (the SDK-side check agrees with the server parser) -------------


@pytest.mark.parametrize("text", ["2026-11-29T22:21:53Z", "2026-11-29t22:21:53.5+05:30"])
def test_check_timestamp_valid(text):
    assert check_timestamp(text) == text


@pytest.mark.parametrize("text", ["2026-11-29T22:21:53", "2026-11-29T22:21:53+05", "garbage", ""])
def test_check_timestamp_invalid(text):
    with pytest.raises(ValueError):
        check_timestamp(text)
