"""Bearer token syntax: `orb_<32-hex credential id>_<secret>`, parsed without I/O."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbit.server.core.ids import new_id
from orbit.server.errors import DomainError
from orbit.server.services.auth import hash_secret, new_token, parse_authorization, parse_token

CID = "0" * 31 + "1"


def test_new_token_round_trips():
    cid = new_id()
    token, digest = new_token(cid)
    assert token.startswith(f"orb_{cid}_")
    parsed = parse_token(token)
    assert parsed is not None
    assert parsed[0] == cid
    assert hash_secret(parsed[1]) == digest
    assert len(parsed[1]) >= 40  # 32 random bytes, url-safe base64


def test_tokens_are_unique():
    cid = new_id()
    assert len({new_token(cid)[0] for _ in range(100)}) == 100


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        (f"orb_{CID}_s", (CID, "s")),
        (f"orb_{CID}__leading_underscore", (CID, "_leading_underscore")),
        (f"orb_{CID}_a_b-c", (CID, "a_b-c")),
        (f"orb_{CID}_" + "x" * 256, (CID, "x" * 256)),
    ],
)
def test_parse_token_valid(token, expected):
    assert parse_token(token) == expected


@pytest.mark.parametrize(
    "token",
    [
        "",
        "orb_",
        f"orb_{CID}",
        f"orb_{CID}_",
        f"orb_{CID}-secret",
        f"orb_{CID.upper()}_secret".replace("0", "A"),
        f"orb_{'A' * 32}_secret",
        f"orb_{'g' * 32}_secret",
        f"orb_{CID[:-1]}_secret",
        f"ORB_{CID}_secret",
        f"orc_{CID}_secret",
        f"xorb_{CID}_secret",
        f"orb_{CID}_" + "x" * 257,
    ],
)
def test_parse_token_invalid(token):
    assert parse_token(token) is None


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_parse_token_total(text):
    result = parse_token(text)
    assert result is None or (len(result[0]) == 32 and result[1])


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_parse_token_with_valid_prefix(secret):
    result = parse_token(f"orb_{CID}_{secret}")
    if 1 <= len(secret) <= 256:
        assert result == (CID, secret)
    else:
        assert result is None


@pytest.mark.parametrize(
    "header",
    [
        f"Bearer orb_{CID}_secret",
        f"bearer orb_{CID}_secret",
        f"BEARER orb_{CID}_secret",
        f"Bearer  orb_{CID}_secret  ",
    ],
)
def test_parse_authorization_valid(header):
    assert parse_authorization(header) == (CID, "secret")


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Bearer    ",
        f"Basic orb_{CID}_secret",
        f"Token orb_{CID}_secret",
        f"orb_{CID}_secret",
        f"Bearer\torb_{CID}_secret",
        "Bearer garbage",
        f"Bearer orb_{CID}_",
    ],
)
def test_parse_authorization_unauthenticated(header):
    with pytest.raises(DomainError) as err:
        parse_authorization(header)
    assert err.value.code == "UNAUTHENTICATED"


def test_errors_never_echo_the_token():
    secret = "s3cr3t-value-that-must-not-leak"
    for header in (f"Bearer orb_{'g' * 32}_{secret}", f"Basic {secret}", f"Bearer orb_{CID}_{secret * 20}"):
        with pytest.raises(DomainError) as err:
            parse_authorization(header)
        assert secret not in err.value.message


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.none(), st.text(max_size=120)))
def test_parse_authorization_is_tuple_or_401(header):
    try:
        cid, secret = parse_authorization(header)
    except DomainError as exc:
        assert exc.code == "UNAUTHENTICATED"
    else:
        assert len(cid) == 32 and secret
