"""Which Prometheus series are a route's, and every PromQL text slo-api sends: the one place
values from CRs enter a query, each escaped.

A route's series are chosen by label matchers: by default `PROMETHEUS_ROUTE_LABELS`'s template
(`model_name="{model}"`) filled from the CR, narrowed by the CR's own in the annotation
`slo-api.modelsphere.dev/prometheus-matchers` (which can never widen them to another model's).
The queries for all routes group by the template's labels (`sum by (model_name, le)`), so
their number does not grow with the routes; the routes that name their own matchers are joined
into one more query per window and metric, each tagged with a number.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slo_api.attainment import recorded as recorded_series
from slo_api.attainment.re2syntax import RegexError, check

ANNOTATION = "slo-api.modelsphere.dev/prometheus-matchers"
METRICS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "otps": "vllm:request_time_per_output_token_seconds",
}
# Tags each route of the joined query of routes with their own matchers.
TAG = "slo_api_route"
PLACEHOLDERS = ("model", "serviceId", "namespace", "name")
_LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
_STRING = r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
_PAIR = re.compile(rf"\s*({_LABEL})\s*=\s*({_STRING})\s*")
_MATCHER = re.compile(rf"\s*({_LABEL})\s*(=~|!~|!=|=)\s*({_STRING})\s*")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
MAX_MATCHERS = 16
# An annotation's length: matchers, not a program (each is parsed at every refresh and answer).
MAX_ANNOTATION = 4096


def escape(value: str) -> str:
    """`value` as a PromQL string literal: nothing in it can end the string."""
    return json.dumps(value, ensure_ascii=False)


def _split(text: str) -> list[str]:
    """Comma-separated items, commas inside strings kept."""
    items, current, quoted, escaped = [], "", False, False
    for ch in text:
        if quoted:
            current += ch
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
        elif ch == ",":
            items.append(current)
            current = ""
        else:
            current += ch
            quoted = ch == '"'
    items.append(current)
    return items


def parse_route_labels(text: str) -> tuple[tuple[str, str], ...]:
    """`PROMETHEUS_ROUTE_LABELS` as (label, template) pairs; ValueError says what is wrong."""
    pairs: list[tuple[str, str]] = []
    for item in _split(text.strip()):
        match = _PAIR.fullmatch(item)
        if match is None:
            raise ValueError(f'{item.strip()!r} is not label="template"')
        template = json.loads(match.group(2))
        for name in _PLACEHOLDER.findall(template):
            if name not in PLACEHOLDERS:
                raise ValueError(f"{{{name}}} is not a placeholder (use {', '.join(PLACEHOLDERS)})")
        pairs.append((match.group(1), template))
    labels = [label for label, _ in pairs]
    if len(set(labels)) != len(labels) or "le" in labels or TAG in labels:
        raise ValueError("each label once, and neither le nor " + TAG)
    return tuple(pairs)


def route_labels_problem(text: str) -> str | None:
    try:
        parse_route_labels(text)
    except ValueError as exc:
        return f"PROMETHEUS_ROUTE_LABELS: {exc}"
    return None


@functools.lru_cache(maxsize=1024)
def parse_matchers(text: str, route: tuple[tuple[str, str], ...] = ()) -> str:
    """An annotation's label matchers (`{a="b", c=~"d|e"}`, braces optional), written again
    from what was parsed (each value re-escaped) after the route's own `route` (label, value)
    pairs, so they can only narrow the route's series: a matcher of one of those labels other
    than its very value is refused. ValueError says what is wrong."""
    if len(text) > MAX_ANNOTATION:
        raise ValueError(f"longer than {MAX_ANNOTATION} characters")
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    fixed = dict(route)
    matchers = [f"{label}={escape(value)}" for label, value in route]
    items = _split(body)
    for item in items:
        match = _MATCHER.fullmatch(item)
        if match is None:
            raise ValueError(f'{item.strip()!r} is not a label matcher such as label="value"')
        label, op, value = match.group(1), match.group(2), json.loads(match.group(3))
        if label in ("__name__", "le", TAG):
            raise ValueError(f"{label} cannot be matched: the metric and its buckets are fixed")
        if label in fixed:
            if (op, value) != ("=", fixed[label]):
                raise ValueError(
                    f"{item.strip()} would widen the route's series past its own "
                    f"{label}={escape(fixed[label])}: a selector can only narrow them"
                )
            continue
        if op in ("=~", "!~"):
            try:
                check(value)
            except RegexError as exc:
                raise ValueError(f"{escape(value)} is not a regular expression: {exc}") from None
        matchers.append(f"{label}{op}{escape(value)}")
    if not body.strip() or len(items) > MAX_MATCHERS:
        raise ValueError(f"name 1 to {MAX_MATCHERS} label matchers")
    return ",".join(matchers)


@dataclass(frozen=True)
class Selector:
    """A route's series: the template's (label, value) pairs, or the CR's own matchers.
    `problem` says why the route has none (a bad annotation)."""

    values: tuple[tuple[str, str], ...] = ()
    own: str | None = None
    problem: str | None = None

    @property
    def matchers(self) -> str | None:
        """The label matchers inside the braces, each value escaped; None with a problem."""
        if self.problem is not None:
            return None
        if self.own is not None:
            return self.own
        return ",".join(f"{label}={escape(value)}" for label, value in self.values)

    def shown(self) -> dict[str, str] | None:
        """The answer's `selectors`: each metric's label matchers, braces included, to put
        after a series name (`vllm:time_to_first_token_seconds_bucket{...}`): what
        `sloctl rules` records from."""
        matchers = self.matchers
        if matchers is None:
            return None
        return dict.fromkeys(METRICS, f"{{{matchers}}}")


def selector_of(obj: Mapping[str, Any], labels: Sequence[tuple[str, str]]) -> Selector:
    """The one rule for which series are an LLM route's (its queries and its `selectors`)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    service = str(spec.get("serviceId") or "")
    fields = {
        "model": str(spec.get("model") or "") or service,
        "serviceId": service,
        "namespace": str(meta.get("namespace") or ""),
        "name": str(meta.get("name") or ""),
    }
    values = tuple(
        (label, _PLACEHOLDER.sub(lambda m: fields[m.group(1)], template))
        for label, template in labels
    )
    annotation = (meta.get("annotations") or {}).get(ANNOTATION)
    if annotation is not None:
        try:
            return Selector(own=parse_matchers(str(annotation), values))
        except ValueError as exc:
            return Selector(problem=f"annotation {ANNOTATION}: {exc}")
    return Selector(values=values)


# -- queries -------------------------------------------------------------------------------


def grouped(metric: str, labels: Sequence[str], window: str, where: str = "") -> tuple[str, str]:
    """Every route's buckets, and sums, over `window`, by the template's labels; `where`
    (matchers, see `only`) keeps the series of some routes alone."""
    by = ", ".join(labels)
    name = METRICS[metric]
    braces = f"{{{where}}}" if where else ""
    return (
        f"sum by ({by}, le) (increase({name}_bucket{braces}[{window}]))",
        f"sum by ({by}) (increase({name}_sum{braces}[{window}]))",
    )


def only(labels: Sequence[str], values: Sequence[tuple[str, ...]]) -> str:
    """Matchers selecting the series of the routes with these template values (each label
    among its values: a superset when several labels are templated, cut back by the grouping)."""
    return ",".join(
        f"{label}=~{escape('|'.join(sorted({_re2(v[i]) for v in values})))}"
        for i, label in enumerate(labels)
    )


def _re2(value: str) -> str:
    """`value` matched literally by a Prometheus (RE2) regex."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", value)


# -- recorded series ------------------------------------------------------------------------
# What `sloctl rules` records for each route (slo_api.attainment.recorded names them for both).


def recorded(seconds: int) -> str:
    """Every recorded route's buckets and sums over a window of `seconds`, one query (the sums
    are the answers without `le`). The range is a millisecond short of the window so it holds
    exactly one point per 5-minute step wherever the evaluations fall (a range's start is
    inclusive in Prometheus 2 and exclusive in 3)."""
    span = f"{seconds * 1000 - 1}ms"
    return (
        f"sum by (route, metric, le) (sum_over_time({recorded_series.BUCKETS}[{span}]))"
        f" or sum by (route, metric) (sum_over_time({recorded_series.SUMS}[{span}]))"
    )


def samples_per_step(metric: str, where: Sequence[str]) -> str:
    """What 5 minutes of the selected series hold, in one query tagged as `tagged` tags: 0, the
    bucket samples (Prometheus loads a window's multiple of them for an `increase` over it);
    1, the histograms (`_count` series: a coverage subquery holds one sample of each per
    step). `where` are matchers, one selection each, "" for every series of the metric."""
    name = METRICS[metric]

    def each(series: str, function: str) -> str:
        return " or ".join(
            f"{function}({name}{series}{{{m}}}[5m])" if m else f"{function}({name}{series}[5m])"
            for m in where
        )

    return tagged(
        [f"sum({each('_bucket', 'count_over_time')})", f"count({each('_count', 'last_over_time')})"]
    )


def own(metric: str, routes: Sequence[str], window: str) -> tuple[str, str]:
    """The routes with their own matchers (`routes[i]` the matchers of tag `i`), joined."""
    name = METRICS[metric]

    def joined(suffix: str, by: str) -> str:
        return " or ".join(
            f"label_replace(sum by ({by}) (increase({name}{suffix}{{{m}}}[{window}])), "
            f'"{TAG}", "{i}", "", "")'
            for i, m in enumerate(routes)
        )

    return joined("_bucket", "le"), joined("_sum", "")


def coverage_step(seconds: int) -> int:
    """The resolution of a window's coverage: a thousandth of it, at least a minute."""
    return max(seconds // 1000, 60)


def _earliest(name: str, matchers: str, window: str, step: int) -> str:
    selected = f"{name}{{{matchers}}}" if matchers else name
    return f"min_over_time(timestamp({selected})[{window}:{step}s])"


def coverage_grouped(
    metric: str, labels: Sequence[str], window: str, step: int, where: str = ""
) -> str:
    """Every route's earliest sample within `window` (to within `step`), by the template's
    labels: where the window Prometheus holds for it begins. No answer: no series. `where`
    keeps the series of some routes alone, as in `grouped`."""
    by = ", ".join(labels)
    return f"min by ({by}) ({_earliest(METRICS[metric] + '_count', where, window, step)})"


def coverage_own(metric: str, routes: Sequence[str], window: str, step: int) -> str:
    """The same for the routes with their own matchers, tagged as `own` tags them."""
    name = METRICS[metric] + "_count"
    return " or ".join(
        f'label_replace(min({_earliest(name, m, window, step)}), "{TAG}", "{i}", "", "")'
        for i, m in enumerate(routes)
    )


def coverage_recorded(window: str, step: int) -> str:
    """The same for the routes read from recorded series, by route and metric: their figures
    rest on what was recorded."""
    return f"min by (route, metric) ({_earliest(recorded_series.SUMS, '', window, step)})"


def series(metric: str, type_: str, threshold_q: float | None, matchers: str, step: str) -> str:
    """One objective's observed value over each `step`: the percentile, or sum / count."""
    name = METRICS[metric]
    if type_ == "avg":
        sums = f"sum(increase({name}_sum{{{matchers}}}[{step}]))"
        counts = f"sum(increase({name}_count{{{matchers}}}[{step}]))"
        return f"{counts} / {sums}" if metric == "otps" else f"{sums} / {counts}"
    value = (
        f"histogram_quantile({threshold_q}, "
        f"sum by (le) (increase({name}_bucket{{{matchers}}}[{step}])))"
    )
    return f"1 / {value}" if metric == "otps" else value


def tag_index(labels: Mapping[str, str], count: int) -> int | None:
    """The place `TAG` names among `count` tagged queries; None for any other value. Only
    ASCII decimals are places: str.isdigit() admits digits (superscripts) int() refuses."""
    tag = labels.get(TAG, "")
    if not (tag.isascii() and tag.isdecimal()):
        return None
    place = int(tag)
    return place if place < count else None


def tagged(queries: Sequence[str]) -> str:
    """Several queries in one, each answer tagged with its place."""
    return " or ".join(f'label_replace({q}, "{TAG}", "{i}", "", "")' for i, q in enumerate(queries))


def _own_lines(promql: str) -> str:
    """A job's own query, on lines of its own: a `#` comment in it ends at its end."""
    return f"(\n{promql}\n)"


def queue_depth(promql: str) -> str:
    """A job route's depth: the highest of what its query returns."""
    return f"max({_own_lines(promql)})"


def queue_good_steps(promql: str, max_depth: int, window: str) -> str:
    """The share of the window's one-minute steps whose depth is at most `maxDepth`."""
    return f"avg_over_time((max({_own_lines(promql)}) <= bool {int(max_depth)})[{window}:1m])"


def queue_series_count(promql: str) -> str:
    return f"count({_own_lines(promql)})"
