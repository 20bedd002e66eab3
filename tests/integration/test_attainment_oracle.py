"""slo-api's attainment arithmetic and selectors checked against a real Prometheus (Debian's)
on generated inputs:

- the good ratio and the percentile of generated bucket sets, with bounds spelt two ways
  (`1` and `1.0`), against Prometheus's own `histogram_quantile` and bucket ratios, through the
  very client and parsing a refresh uses, and the bucket bounds around a threshold that
  bracket an estimated good ratio;
- the regex check of an annotation against what Prometheus's parser accepts;
- a hostile annotation against the series Prometheus then selects: never another model's.

One Prometheus for the module, on one backfill of every generated histogram (a label value
per example), so the whole module runs in seconds.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from controlplane.prometheus import Prometheus
from slo_api.attainment import prometheus as client
from slo_api.attainment.arithmetic import (
    Histogram,
    fraction_within,
    good_ratio_bounds,
    quantile,
    same_bound,
)
from slo_api.attainment.cache import histograms
from slo_api.attainment.re2syntax import RegexError, check
from slo_api.attainment.selectors import ANNOTATION, escape, parse_route_labels, selector_of
from tests.integration.crs import llm

pytestmark = pytest.mark.integration

METRIC = "oracle_seconds"
TTFT = "vllm:time_to_first_token_seconds"
BASE = 1_000_000
# Samples 10 minutes apart; every query is over the last 20 minutes, at the last sample.
STEP = 600
WINDOW = "20m"
# Histograms generated, one backfill for all, checked by a fixed handful of queries whatever
# their number (one per quantile, for all at once): 300 reach, with room to spare, every kind of
# check at least 50 times (no requests; all in +Inf; empty buckets around a percentile;
# thresholds on, inside and beyond the bounds; each bound spelt two ways) while generating and
# backfilling them takes a few seconds. Regexes and annotations are one query each (Prometheus's
# parser, a few milliseconds): 250 and 100 cover every piece below many times over within
# about half a minute on a loaded machine.
HISTOGRAMS = 300
REGEXES = 250
ANNOTATIONS = 100
# The CRD's percentiles, and a few more (low, odd and extreme ones).
QUANTILES = (0.5, 0.8, 0.9, 0.95, 0.99, 0.25, 1 / 3, 0.999)
VLLM_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip


@dataclass(frozen=True)
class Case:
    """Non-cumulative counts by finite bound (and the `+Inf` bucket's), split between two
    exporters that spell each bound differently."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]  # one per bound, then +Inf's
    split: tuple[int, ...]  # how many of each bucket's the second exporter saw
    thresholds: tuple[float, ...]


def _spellings(bound: float) -> tuple[str, str]:
    """How two exporters may write a bound: Go's shortest (`1`, `0.5`) and another (`1.0`,
    `0.50`); `+Inf` and `+inf`."""
    if math.isinf(bound):
        return "+Inf", "+inf"
    short = repr(bound).removesuffix(".0")
    return short, short + "0" if "." in short else short + ".0"


@st.composite
def cases(draw: st.DrawFn) -> Case:
    bounds = tuple(
        sorted(
            draw(
                st.sets(
                    st.sampled_from(VLLM_BOUNDS)
                    | st.floats(0.001, 100, allow_nan=False).map(lambda f: round(f, 3)),
                    min_size=0,
                    max_size=8,
                )
            )
        )
    )
    bounds = tuple(b for b in bounds if b > 0)
    counts = tuple(draw(st.lists(st.integers(0, 50), min_size=len(bounds) + 1,
                                 max_size=len(bounds) + 1)))  # fmt: skip
    split = tuple(draw(st.integers(0, n)) for n in counts)
    near = [b for b in bounds] + [b * f for b in bounds for f in (0.5, 1.3)]
    thresholds = tuple(
        draw(st.lists(st.sampled_from(near) if near else st.just(1.0), min_size=3, max_size=3))
    )
    return Case(bounds, counts, split, thresholds)


def _generated() -> list[Case]:
    found: list[Case] = []

    @settings(
        max_examples=HISTOGRAMS,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(cases())
    @example(Case((0.5, 1.0), (0, 0, 0), (0, 0, 0), (0.5, 1.0, 0.7)))
    @example(Case((0.5, 1.0), (0, 0, 7), (0, 0, 3), (0.5, 1.0, 2.0)))
    @example(Case((), (5,), (2,), (1.0, 1.0, 1.0)))
    @example(Case((0.25, 1.0, 2.5), (10, 0, 30, 1), (5, 0, 0, 1), (1.0, 0.5, 3.0)))
    def collect(case: Case) -> None:
        found.append(case)

    collect()
    return found


def _openmetrics(generated: list[Case], end: int) -> str:
    lines = [f"# TYPE {METRIC} histogram\n"]
    for i, case in enumerate(generated):
        for exporter in (0, 1):
            cumulative = 0
            for bound, count, second in zip(
                (*case.bounds, math.inf), case.counts, case.split, strict=True
            ):
                cumulative += second if exporter else count - second
                le = _spellings(bound)[exporter]
                labels = f'case="{i}",exporter="{exporter}",le="{le}"'
                for t, value in ((end - 2 * STEP, BASE), (end - STEP, BASE), (end, BASE)):
                    grown = value + (cumulative if t == end else 0)
                    lines.append(f"{METRIC}_bucket{{{labels}}} {grown} {t}\n")
    # Two models' vLLM series, for the annotations.
    lines.append(f"# TYPE {TTFT} histogram\n")
    for model in ("mine", "theirs", ""):
        for engine in ("0", "1"):
            for le in ("0.5", "+Inf"):
                labels = f'model_name="{model}",engine="{engine}",le="{le}"'
                for t in (end - STEP, end):
                    lines.append(f"{TTFT}_bucket{{{labels}}} {BASE} {t}\n")
    return "".join(lines) + "# EOF\n"


@dataclass
class Oracle:
    prometheus: Prometheus
    cases: list[Case]
    at: int

    def ask(self, query: str) -> dict[str, Any]:
        answer = httpx.post(
            f"{self.prometheus.url}/api/v1/query",
            data={"query": query, "time": str(self.at)},
            timeout=30,
        )
        body: dict[str, Any] = answer.json()
        return body

    def value(self, query: str) -> float | None:
        body = self.ask(query)
        assert body["status"] == "success", (query, body)
        result = body["data"]["result"]
        if not result:
            return None
        value = float(result[0]["value"][1])
        return None if math.isnan(value) else value


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Oracle]:
    generated = _generated()
    end = int(time.time()) // 60 * 60
    prometheus = Prometheus(tmp_path_factory.mktemp("oracle"))
    prometheus.backfill(_openmetrics(generated, end))
    prometheus.start()
    yield Oracle(prometheus, generated, end)
    prometheus.stop()


def _selector(i: int) -> str:
    return f'{METRIC}_bucket{{case="{i}"}}'


async def test_good_ratio_and_percentile_match_prometheus(oracle: Oracle) -> None:
    """For each generated histogram, its buckets as a refresh reads them (`sum by (le)` of
    `increase`, both spellings of each bound in the answer) through slo-api's client, then:
    slo-api's percentile against `histogram_quantile` over the same series at each of
    `QUANTILES`; its good ratio at a bound (or beyond the highest) against the bucket's share
    of `+Inf`'s as Prometheus divides them; and its good ratio at each percentile Prometheus
    put inside a bucket against that percentile (the two interpolate alike). A query per
    quantile for every histogram at once."""
    prometheus = client.Prometheus(oracle.prometheus.url, 60)
    increase = f"increase({METRIC}_bucket[{WINDOW}])"
    everything = escape("|".join(re.escape(s) for s in _spellings(math.inf)))
    try:
        buckets = await prometheus.query(f"sum by (case, le) ({increase})", oracle.at)
        shares = await prometheus.query(
            f"sum by (case, le) ({increase}) / on (case) group_left "
            f"sum by (case) (increase({METRIC}_bucket{{le=~{everything}}}[{WINDOW}]))",
            oracle.at,
        )
        percentiles = {
            q: {
                s.labels["case"]: s.value
                for s in await prometheus.query(
                    f"histogram_quantile({q}, sum by (case, le) ({increase}))", oracle.at
                )
            }
            for q in QUANTILES
        }
    finally:
        await prometheus.close()
    found = histograms(buckets, [], lambda labels: labels.get("case"))
    share: dict[tuple[str, float], float] = {}
    for sample in shares:
        key = (sample.labels["case"], float(sample.labels["le"]))
        share[key] = share.get(key, 0.0) + sample.value
    spelt = {(s.labels["case"], s.labels["le"]) for s in buckets}
    checked = {"quantile": 0, "bound": 0, "inside": 0, "bracketed": 0}
    for i, case in enumerate(oracle.cases):
        name = str(i)
        assert {le for c, le in spelt if c == name} == {
            le for b in (*case.bounds, math.inf) for le in _spellings(b)
        }, "both spellings of every bound reach slo-api"
        histogram = found.get(name, Histogram(()))
        assert [b for b, _ in histogram.buckets[:-1]] == list(case.bounds), case
        total = sum(case.counts)
        for q in QUANTILES:
            theirs = percentiles[q].get(name)
            ours = quantile(histogram, q)
            assert (ours is None) == (theirs is None), (case, q, ours, theirs)
            if ours is None or theirs is None:
                continue
            assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-12), (case, q)
            checked["quantile"] += 1
            cumulative = dict(histogram.buckets)
            lower = max((b for b in case.bounds if b < theirs), default=0.0)
            upper = min((b for b in case.bounds if b > theirs), default=math.inf)
            # (A percentile within a part in a billion of a bound is that bound's, exact.)
            on_bound = any(same_bound(theirs, b) for b in case.bounds)
            inside = not on_bound and not math.isinf(upper)
            if inside and cumulative[upper] > cumulative.get(lower, 0.0):
                good, estimated = fraction_within(histogram, theirs)
                assert estimated is True
                assert good == pytest.approx(q, rel=1e-9), (case, q, theirs)
                checked["inside"] += 1
        for threshold in case.thresholds:
            good, estimated = fraction_within(histogram, threshold)
            if total == 0 or not case.bounds:
                # No requests, or none below a finite bound: nothing is known within it.
                assert good is None if total == 0 else good == 0.0
                continue
            assert good is not None
            on = [b for b in case.bounds if b == threshold]
            if on or threshold > case.bounds[-1]:
                # Exact at a bound; beyond the highest, what is within the highest.
                bound = on[0] if on else case.bounds[-1]
                assert good == pytest.approx(share[(name, bound)], rel=1e-9), (case, threshold)
                assert estimated is (not on and good < 1), (case, threshold)
                checked["bound"] += 1
            else:
                # Between two bounds (or below the first): the good ratio's bounds are the
                # shares Prometheus divides out at the bucket bounds around the threshold.
                bounds = good_ratio_bounds(histogram, threshold)
                assert bounds is not None
                above = min(b for b in case.bounds if b > threshold)
                below = [b for b in case.bounds if b < threshold]
                low = share[(name, below[-1])] if below else 0.0
                assert bounds[0] == pytest.approx(low, rel=1e-9, abs=1e-12), (case, threshold)
                assert bounds[1] == pytest.approx(share[(name, above)], rel=1e-9), (case, threshold)
                assert bounds[0] <= good <= bounds[1], (case, threshold)
                checked["bracketed"] += 1
    # The generated histograms reached every kind of check.
    assert min(checked.values()) >= 50, checked


# -- regexes ---------------------------------------------------------------------------------

# Pieces of patterns: RE2's syntax, what other dialects have and RE2 lacks, and broken ones.
PIECES = [
    "a", "b", "0", "é", " ", "-", ".", "^", "$", "|", "(", ")", "(?:", "(?i)", "(?i:", "(?-i)",
    "(?i-s:", "(?i-)", "(?-)", "(?)", "(?P<n>", "(?P<m>", "(?P=n)", "(?<n>", "(?=", "(?!",
    "(?<=", "(?<!", "(?>", "(?#", "(?(", "*", "+", "?", "*?", "+?", "??", "*+", "++", "{2}",
    "{1,3}", "{0}", "{2,}", "{1001}", "{3,2}", "{,2}", "{01}", "{", "}", "{40}", "[", "]",
    "[^", "[a-z]", "[z-a]", "[]a]", "[^]a]", "[a-]", "[[:alpha:]]", "[[:foo:]]",
    "[[:^digit:]]", "[\\d-z]", "[\\b]", "[\\pL]", "\\d", "\\D", "\\w", "\\s", "\\S", "\\b",
    "\\B", "\\A", "\\z", "\\Z", "\\G", "\\1", "\\12", "\\0", "\\8", "\\x41", "\\x{263a}",
    "\\x{110000}", "\\x{}", "\\xZ", "\\pL", "\\pN", "\\p{Greek}", "\\p{^L}", "\\PN",
    "\\p{Foo}", "\\pX", "\\p", "\\Q", "\\E", "\\.", "\\\\", "\\-", "\\n", "\\t", "\\e",
    "\\C", "\\K", "\\k<n>", "\\", "\\/", "\\_",
]  # fmt: skip
patterns = st.lists(st.sampled_from(PIECES) | st.text("ab(|)*[]{}?\\", max_size=3),
                    max_size=8).map("".join)  # fmt: skip


@settings(max_examples=REGEXES, database=None, deadline=None)
@given(patterns)
@example("(?=a)")
@example("(a)\\1")
@example("\\pL+")
@example("(a{40}){40}")
@example("a)|(b")
def test_the_regex_check_agrees_with_prometheus(oracle: Oracle, pattern: str) -> None:
    """Prometheus refuses what the check refuses, and takes what it takes; the check alone
    refuses a `)` that closes Prometheus's own `^(?:...)$` around the pattern."""
    try:
        check(pattern)
        refusal = None
    except RegexError as exc:
        refusal = str(exc)
    body = oracle.ask(f"absent(nothing{{x=~{escape(pattern)}}})")
    accepted = body["status"] == "success"
    if refusal is None:
        assert accepted, (pattern, body)
    elif accepted:
        assert "without its '('" in refusal, (pattern, refusal)


# -- hostile annotations ---------------------------------------------------------------------

matcher = st.tuples(
    st.sampled_from(["model_name", "engine", "other"]),
    st.sampled_from(["=", "!=", "=~", "!~"]),
    st.sampled_from(["mine", "theirs", "", ".*", ".+", "mine|theirs", "m.*", "0", "(?i)MINE"]),
)


@settings(max_examples=ANNOTATIONS, database=None, deadline=None)
@given(st.lists(matcher, min_size=1, max_size=3))
@example([("model_name", "!=", "")])
@example([("model_name", "=~", ".+")])
@example([("engine", "=", "0")])
def test_an_annotation_never_reads_another_models_series(
    oracle: Oracle, matchers: list[tuple[str, str, str]]
) -> None:
    """Whatever a tenant writes in the annotation of a route for model `mine`, Prometheus
    selects with it none of `theirs` (nor the unlabelled model's): refused, or narrowed."""
    cr = llm("ns", "r", model="mine")
    text = ",".join(f"{label}{op}{json.dumps(value)}" for label, op, value in matchers)
    cr["metadata"]["annotations"] = {ANNOTATION: "{" + text + "}"}
    selector = selector_of(cr, parse_route_labels('model_name="{model}"'))
    if selector.matchers is None:
        assert selector.problem is not None
        return
    body = oracle.ask(f"count by (model_name) ({TTFT}_bucket{{{selector.matchers}}})")
    assert body["status"] == "success", body
    models = {r["metric"].get("model_name", "") for r in body["data"]["result"]}
    assert models <= {"mine"}, (text, models)
