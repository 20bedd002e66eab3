"""resourceVersions compared as KEP-5504 (Comparable Resource Version) says a client may."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slo_api import versions

# What a conformant API server never writes: not ASCII digits, a leading zero, "0" (a list
# or watch's "any"), empty, signs, spaces, other scripts' digits ("²" passes isdigit(),
# Arabic-Indic and fullwidth digits isdecimal(); int() takes those and refuses "²").
NOT_COMPARABLE = [
    *("", "0", "012", "00", "a1b2", "¹²", "²", "\u0661\u0662", "\uff11\uff12", " 12", "12 "),
    *("+12", "-12", "1_000", "1.0", "0x1f", "12\n", "9" * (versions.MAX_DIGITS + 1)),
]


@given(st.integers(min_value=1), st.integers(min_value=1))
def test_decimals_compare_as_the_integers_they_write(a: int, b: int) -> None:
    assert versions.compare(str(a), str(b)) == (a > b) - (a < b)
    assert versions.number(str(a)) == a
    key_a, key_b = versions.key(str(a)), versions.key(str(b))
    assert key_a is not None
    assert key_b is not None
    assert (key_a < key_b) == (a < b)


def test_length_decides_before_the_digits() -> None:
    assert versions.compare("9", "10") == -1  # "9" > "10" as text
    assert versions.compare("100", "99") == 1
    assert versions.compare("42", "42") == 0
    # No bound below MAX_DIGITS (no int() needed to compare): past 128 bits still compares.
    assert versions.compare("1" + "0" * 60, "9" * 60) == 1


@pytest.mark.parametrize("odd", [*NOT_COMPARABLE, None, 12])
def test_anything_else_is_not_comparable_and_never_raises(odd: object) -> None:
    assert not versions.comparable(odd)
    assert versions.compare(odd, "12") is None
    assert versions.compare("12", odd) is None
    assert versions.compare(odd, odd) is None
    assert versions.number(odd) is None
    assert versions.key(odd) is None


@given(st.text(max_size=8))
def test_any_text_is_either_comparable_or_none_of_it_is_read(text: str) -> None:
    number = versions.number(text)
    if number is None:
        assert versions.compare(text, "1") is None
    else:
        assert str(number) == text  # comparable values round-trip: no two spellings of one
