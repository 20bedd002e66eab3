"""Go durations as time.ParseDuration reads them, and as the ModelPool CRD pattern shapes them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from slo_api.kinds.goduration import GO_DURATION_PATTERN, go_duration_ns

GO_MAX = 2**63 - 1  # time.Duration's largest value, in nanoseconds


# Cases from Go's time.ParseDuration: `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+`, ASCII digits only,
# units ns us µs (U+00B5) μs (U+03BC) ms s m h, fractions truncated to whole nanoseconds,
# "0" the one value without a unit, and an error past 1<<63-1 ns.
GO_CASES = [
    ("90s", 90 * 10**9),
    ("5m", 300 * 10**9),
    ("1h30m", 5400 * 10**9),
    ("1.5h", 5400 * 10**9),
    ("300ms", 300 * 10**6),
    ("0s", 0),
    ("0", 0),
    ("-5m", -300 * 10**9),
    ("+5m", 300 * 10**9),
    ("1.s", 10**9),
    (".5s", 5 * 10**8),
    ("1us", 1000),
    ("1\u00b5s", 1000),
    ("1\u03bcs", 1000),
    ("1ns", 1),
    ("1.9ns", 1),
    ("0.5ns", 0),
    ("1h1h", 7200 * 10**9),
    ("2562047h47m16.854775807s", GO_MAX),
    ("9223372036854775807ns", GO_MAX),
    ("0.1234567890123456789012345s", 123456789),
    ("", None),
    ("5", None),
    ("5 m", None),
    ("1d", None),
    ("m", None),
    (".s", None),
    ("-", None),
    ("+", None),
    ("--5m", None),
    ("5m-", None),
    ("1S", None),
    ("\u0663s", None),  # ARABIC-INDIC DIGIT THREE
    ("\uff13s", None),  # FULLWIDTH DIGIT THREE
    ("\U0001d7d1s", None),  # MATHEMATICAL BOLD DIGIT THREE
    ("2562047h47m16.854775808s", None),
    ("9223372036854775808ns", None),
    ("2562048h", None),
    ("9223372036854775807ns1ns", None),
    ("99999999999999999999s", None),
]


GO_OVERFLOWS = {
    "2562047h47m16.854775808s",
    "9223372036854775808ns",
    "2562048h",
    "9223372036854775807ns1ns",
    "99999999999999999999s",
}


@pytest.mark.parametrize(("text", "ns"), GO_CASES)
def test_go_durations(text: str, ns: int | None) -> None:
    assert go_duration_ns(text) == ns


def test_the_crd_pattern_is_the_go_duration_shape() -> None:
    path = Path(__file__).parents[2] / "config/crd/modelpool/modelpool.yaml"
    crd = yaml.safe_load(path.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for field in ("swapBudget", "reclaimAfter"):
        assert spec["properties"][field]["pattern"] == GO_DURATION_PATTERN
    for text, ns in GO_CASES:
        shaped = re.fullmatch(GO_DURATION_PATTERN, text) is not None
        if ns is not None and ns >= 1:
            assert shaped, text  # everything slo-api accepts, the CRD accepts
        if shaped:
            # What the CRD lets through, Go reads, or refuses only for its size.
            assert ns is not None or text in GO_OVERFLOWS, text
