"""Go's `time.ParseDuration`, step for step: slo-api stores only what a Go controller reads.

The ModelPool CRD's pattern checks a duration's shape; the range (at least 1ns, at most Go's
longest duration) and Go's own quirks (overflow, ignored extra fraction digits) are here.
"""

from __future__ import annotations

_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # MICRO SIGN
    "\u03bcs": 1_000,  # GREEK SMALL LETTER MU
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DIGITS = "0123456789"
# The shape alone (ASCII digits, Go's units, an optional "+"), as the ModelPool CRD's pattern;
# the range (at least 1ns, at most Go's longest duration) is checked by go_duration_ns.
GO_DURATION_PATTERN = "^[+]?(([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h))+$"
_OVER = 1 << 63
GO_DURATION_MAX = "2562047h47m16.854775807s"  # 1<<63 - 1 nanoseconds


def _leading_int(text: str) -> tuple[int, str]:
    i, x = 0, 0
    while i < len(text) and text[i] in _DIGITS:
        if x > _OVER // 10:
            raise ValueError("overflow")
        x = x * 10 + int(text[i])
        if x > _OVER:
            raise ValueError("overflow")
        i += 1
    return x, text[i:]


def _leading_fraction(text: str) -> tuple[int, float, str]:
    # Digits past what an int64 holds are read but ignored, as Go does.
    i, x, scale, overflow = 0, 0, 1.0, False
    while i < len(text) and text[i] in _DIGITS:
        if not overflow:
            if x > (_OVER - 1) // 10:
                overflow = True
            else:
                y = x * 10 + int(text[i])
                if y > _OVER:
                    overflow = True
                else:
                    x, scale = y, scale * 10
        i += 1
    return x, scale, text[i:]


def go_duration_ns(text: str) -> int | None:
    """Nanoseconds in a Go duration string (`90s`, `5m`, `1h30m`), or None where Go errs."""
    try:
        return _parse_go_duration(text)
    except ValueError:
        return None


def _parse_go_duration(text: str) -> int:
    s, negative = text, False
    if s and s[0] in "+-":
        negative, s = s[0] == "-", s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError("invalid duration")
    total = 0
    while s:
        if s[0] != "." and s[0] not in _DIGITS:
            raise ValueError("invalid duration")
        before = len(s)
        whole, s = _leading_int(s)
        has_whole = len(s) != before
        fraction, scale, has_fraction = 0, 1.0, False
        if s.startswith("."):
            s = s[1:]
            before = len(s)
            fraction, scale, s = _leading_fraction(s)
            has_fraction = len(s) != before
        if not has_whole and not has_fraction:
            raise ValueError("invalid duration")
        i = 0
        while i < len(s) and s[i] != "." and s[i] not in _DIGITS:
            i += 1
        unit = _UNIT_NS.get(s[:i]) if i else None
        if unit is None:
            raise ValueError("missing or unknown unit")
        s = s[i:]
        if whole > _OVER // unit:
            raise ValueError("overflow")
        whole *= unit
        if fraction:
            # float64 arithmetic, truncated toward zero, exactly as Go computes it.
            whole += int(float(fraction) * (float(unit) / scale))
            if whole > _OVER:
                raise ValueError("overflow")
        total += whole
        if total > _OVER:
            raise ValueError("overflow")
    if negative:
        return -total
    if total > _OVER - 1:
        raise ValueError("overflow")
    return total
