"""Write-behind statements are built with Orbit's own literal escaping: it must match the driver's."""

from datetime import datetime

from asyncmy.converters import escape_item
from hypothesis import given
from hypothesis import strategies as st

from orbit.server.store.db import Tx

tx = Tx(None, "mysql")  # type: ignore[arg-type]


@given(st.one_of(st.text(), st.integers(min_value=-(2**63), max_value=2**64), st.none(), st.booleans(),
                 st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2999, 1, 1))))
def test_literal_matches_the_driver(value):
    assert tx._literal(value) == escape_item(value, "utf8mb4")


def test_mogrify_substitutes_placeholders_once():
    assert tx._mogrify("UPDATE t SET a = ? WHERE id IN (?, ?)", ["x'%s", 1, None]) == \
        "UPDATE t SET a = 'x\\'%s' WHERE id IN (1, NULL)"
