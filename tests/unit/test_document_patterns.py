"""The patterns /openapi.json gives are the server's rules, character for character: a reason is
blank exactly when `str.strip()` empties it, a revision or seq is a uint64 exactly when it is at
most 2^64 - 1 without a leading zero."""

from __future__ import annotations

import random
import re
import sys

from orbit._rules import NONZERO_UINT64_PATTERN, NOT_BLANK_PATTERN, UINT64_MAX, UINT64_PATTERN, check_reason


def ecma(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern.replace("$", r"\Z"))


def test_not_blank_is_what_strip_leaves():
    not_blank = re.compile(NOT_BLANK_PATTERN)
    for code in range(sys.maxunicode + 1):
        if 0xD800 <= code <= 0xDFFF:
            continue
        ch = chr(code)
        assert bool(not_blank.search(ch)) == bool(ch.strip()), hex(code)
    for text in ("a", " a ", "\u3000x", "\ufeff"):
        assert not_blank.search(text) and check_reason(text) == text


def test_uint64_patterns_are_the_range():
    nonzero, any_u64 = ecma(NONZERO_UINT64_PATTERN), ecma(UINT64_PATTERN)
    rng = random.Random(7)
    values = [0, 1, 9, 10, 2**63, UINT64_MAX - 1, UINT64_MAX, UINT64_MAX + 1, 10**19, 10**20, 18446744073709551609,
              18446744073709551610, 18446744073709551599, *(rng.randrange(2**66) for _ in range(20000)),
              *(rng.randrange(10 ** rng.randint(1, 21)) for _ in range(20000))]
    for v in values:
        assert bool(nonzero.match(str(v))) == (1 <= v <= UINT64_MAX), v
        assert bool(any_u64.match(str(v))) == (0 <= v <= UINT64_MAX), v
    for text in ("01", "00", "-1", "+1", " 1", "1 ", "", "1.0", "1e3", "\u0661"):
        assert not nonzero.match(text) and not any_u64.match(text), text
