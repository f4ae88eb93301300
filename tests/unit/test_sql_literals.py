"""Write-behind statements are built with Orbit's own literal escaping: it must match the driver's."""

from datetime import datetime

from asyncmy.converters import escape_item
from hypothesis import given
from hypothesis import strategies as st

from orbit.server.store.literals import HOISTED_LENGTH, Literals
from orbit.server.store.tx import Stmt, Tx

lits = Literals()


@given(st.one_of(st.text().filter(lambda t: '"' not in t), st.integers(min_value=-(2**63), max_value=2**64),
                 st.none(), st.booleans(), st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2999, 1, 1))))
def test_literal_matches_the_driver(value):
    """The driver's escaping, except for `"`, which it escapes and Orbit leaves as is (nothing
    needs escaping between single quotes but `'`, `\\` and control characters): the database
    round trip in tests/integration/test_sql_literals_roundtrip.py checks every string."""
    assert lits.literal(value) == escape_item(value, "utf8mb4")


@given(st.text())
def test_double_quotes_are_the_only_difference_from_the_driver(value):
    assert lits.literal(value).replace('"', "") == escape_item(value.replace('"', ""), "utf8mb4")


def test_mogrify_substitutes_placeholders_once():
    assert lits.mogrify("UPDATE t SET a = %s WHERE id IN (%s, %s)", ["x'%s", 1, None]) == \
        "UPDATE t SET a = 'x\\'%s' WHERE id IN (1, NULL)"


def test_a_statement_is_mogrified_from_question_marks():
    """Tx converts `?` to `%s` before the literals go in, once."""
    assert Tx("mysql")._mogrify(Stmt("UPDATE t SET a = ? WHERE id IN (?, ?)", ["x'?%s", 1, None])) == \
        "UPDATE t SET a = 'x\\'?%s' WHERE id IN (1, NULL)"


@given(st.lists(st.one_of(st.text(max_size=8), st.integers(), st.none()), min_size=17, max_size=40))
def test_mogrify_of_many_parameters_equals_one_by_one(params):
    """Past 16 parameters `mogrify` remembers each value's literal; the text is the same."""
    sql = ", ".join(["%s"] * len(params))
    assert lits.mogrify(sql, params) == ", ".join(map(lits.literal, params))


_values = st.one_of(st.sampled_from(["%", "%%", "%s", "a%sb%%", "'", ""]), st.text(max_size=8),
                    st.integers(min_value=0, max_value=3), st.none(), st.booleans(),
                    st.just(datetime(2026, 1, 1, 12, 0, 0, 123456)))


@given(st.integers(min_value=1, max_value=6).flatmap(
    lambda width: st.lists(st.lists(_values, min_size=width, max_size=width), min_size=1, max_size=12)))
def test_values_list_built_column_by_column_equals_row_by_row(rows):
    """Constant columns go into a %-template: percent signs in any value must survive it."""
    row_by_row = ",".join("(" + ",".join(map(lits.literal, r)) + ")" for r in rows)
    assert lits.values_list(rows) == row_by_row


def test_values_list_with_every_column_constant():
    assert lits.values_list([["a%s", 1], ["a%s", 1]]) == "('a%s',1),('a%s',1)"


@given(st.integers(min_value=1, max_value=6).flatmap(
    lambda width: st.lists(st.lists(_values, min_size=width, max_size=width), min_size=1, max_size=12)))
def test_values_list_with_hoisting_is_the_same_once_its_variables_are_put_back(rows):
    """A hoisted literal (a long one, the same in every row of two or more) stands as the session
    variable it was given; putting each literal back where its variable stands gives the text
    without hoisting, percent signs included."""
    hoisted: dict[str, str] = {}

    def hoist(text: str) -> str:
        name = f"@orbit_v{len(hoisted)}"
        hoisted[name] = text
        return name

    text = lits.values_list(rows, hoist)
    assert all(len(v) >= HOISTED_LENGTH for v in hoisted.values())
    assert not hoisted or len(rows) > 1
    for name in sorted(hoisted, key=len, reverse=True):  # @orbit_v10 before @orbit_v1
        text = text.replace(name, hoisted[name])
    assert text == lits.values_list(rows)


def test_only_long_literals_shared_by_every_row_are_hoisted():
    shared, other = "a" * 20, "b" * 20
    names = iter(["@orbit_v0", "@orbit_v1"])
    assert lits.values_list([[shared, other, "x", 1], [shared, "c" * 20, "x", 1]], lambda _: next(names)) == \
        f"(@orbit_v0,'{other}','x',1),(@orbit_v0,'{'c' * 20}','x',1)"
