"""resourceVersions: the one place slo-api reads anything into one beyond equality.

Kubernetes documents a resourceVersion as opaque, but KEP-5504 (Comparable Resource Version,
stable since Kubernetes 1.35) makes two of the same resource comparable where the API server
is conformant: each is a decimal integer written in ASCII digits with no leading zero ("0"
is not one: a list or watch uses it to mean "any"), and the larger integer is the later
version. client-go's CompareResourceVersion refuses anything else as not comparable, and so
does `compare` here: a caller whose versions are not comparable falls back to an order it
observed itself (arrival, creation time), never to a guess.
"""

from __future__ import annotations

from typing import TypeGuard

# int() refuses text longer than this (CPython's guard against quadratic conversions); no
# server comes near it: the conformance tests hold resourceVersions to 128 bits (39 digits).
MAX_DIGITS = 4300


def comparable(rv: object) -> TypeGuard[str]:
    """Whether `rv` is a resourceVersion KEP-5504 lets a client compare: ASCII digits, no
    leading zero, not empty (and not past MAX_DIGITS). isdigit() would admit "²" and
    isdecimal() alone Arabic-Indic digits, neither of which a conformant server writes."""
    return (
        isinstance(rv, str)
        and 0 < len(rv) <= MAX_DIGITS
        and rv.isascii()
        and rv.isdecimal()
        and rv[0] != "0"
    )


def compare(a: object, b: object) -> int | None:
    """-1, 0 or 1 as resourceVersion `a` is older than, the same as or newer than `b` (two of
    the same resource), or None when either is not comparable. No int(): of two decimals
    with no leading zero the longer is the larger, and of equal length the text orders
    them."""
    if not (comparable(a) and comparable(b)):
        return None
    left, right = (len(a), a), (len(b), b)
    return (left > right) - (left < right)


def number(rv: object) -> int | None:
    """A comparable resourceVersion as the integer it writes (a compact key that orders as
    `compare` does: what the index keeps per CR and change streams' revisions carry); None
    for one that is not comparable."""
    return int(rv) if comparable(rv) else None


def key(rv: object) -> tuple[int, str] | None:
    """A sort key that orders comparable resourceVersions as `compare` does, with no int();
    None for one that is not comparable."""
    return (len(rv), rv) if comparable(rv) else None
