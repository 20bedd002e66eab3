"""Attainment for every route, from a snapshot of Prometheus refreshed every
`ATTAINMENT_REFRESH_SECONDS` by a fixed number of queries (see selectors), never a query per
route per request. Requests only read the snapshot: nothing else waits for Prometheus, and
when it fails the last good snapshot stays, with its time, beside the reason.

A route's `series` (for its chart) is one query on demand, kept for a refresh interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from slo_api.attainment import recorded as recorded_series
from slo_api.attainment import selectors
from slo_api.attainment.arithmetic import (
    BURN_WINDOWS,
    PERCENTILES,
    Histogram,
    LatencyMetric,
    alerting,
    latency_objective,
    lowest_budget,
    queue_objective,
)
from slo_api.attainment.prometheus import Prometheus, PrometheusError, Sample
from slo_api.attainment.selectors import Selector, selector_of
from slo_api.bounded import BoundedDict
from slo_api.index import CRIndex, resource_version
from slo_api.metrics import Metrics
from slo_api.service import weak_etag

log = logging.getLogger("slo_api.attainment")

Obj = dict[str, Any]
# The windows an answer is over (`?window=`).
WINDOWS = ("1h", "1d", "7d", "28d")
DEFAULT_WINDOW = "28d"
SECONDS = {
    "5m": 300,
    "30m": 1800,
    "1h": 3600,
    "6h": 21600,
    "1d": 86400,
    "7d": 604800,
    "28d": 2419200,
}
# Every window queried: the answers' and the burn rates'.
QUERIED = ("5m", "30m", "1h", "6h", "1d", "7d", "28d")
SERIES_POINTS = 200
MIN_STEP = 300
# Queries in flight at once, so a refresh does not flood Prometheus.
CONCURRENCY = 4
SERIES_CACHED = 1024
# Routes worked on between two turns of the event loop in the walks over every route.
CHUNK = 256
# Refreshes that may be missed (with one query timeout) before the figures are `stale`.
STALE_REFRESHES = 3
# Raw queries name the routes without recorded series when some have them, up to this many
# (past it they select every series: a regex of thousands of names is a cost of its own).
ONLY_ROUTES = 1000
UNMEASURED_RANGE = "vLLM's histograms carry no context length: a range's targets cannot be measured"


def duration(seconds: int) -> str:
    """Seconds as Prometheus writes a duration (`9d2h5m`)."""
    out, rest = "", seconds
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            out += f"{rest // size}{unit}"
            rest %= size
    return out or "0s"


def rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Queue:
    """A job route's queue as last read: its depth now and each window's share of good steps."""

    at: float
    now: float | None
    good: Mapping[str, float | None]


@dataclass
class QueueReading:
    last: Queue | None = None
    problem: str | None = None


@dataclass(frozen=True)
class Snapshot:
    at: float
    # window -> metric -> the template's label values -> histogram
    grouped: Mapping[str, Mapping[str, Mapping[tuple[str, ...], Histogram]]]
    # window -> metric -> a route's own matchers -> histogram
    own: Mapping[str, Mapping[str, Mapping[str, Histogram]]]
    # a route's own matchers -> why its queries failed (the other routes' did not)
    problems: Mapping[str, str] = field(default_factory=dict)
    # window -> metric -> route -> histogram, from the series `sloctl rules` records
    recorded: Mapping[str, Mapping[str, Mapping[str, Histogram]]] = field(default_factory=dict)
    # metric -> the routes read from recorded series (the raw ones are not queried for them)
    covered: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # (window, metric, own) -> the seconds queried instead, and why (0: not queried)
    narrowed: Mapping[tuple[str, str, bool], tuple[int, str]] = field(default_factory=dict)
    # window -> metric -> the template's label values, or a route's own matchers -> the
    # earliest sample Prometheus holds in the window (None, or a window and metric missing:
    # unknown; a route missing: no series)
    earliest: Mapping[str, Mapping[str, Mapping[Any, float | None]]] = field(default_factory=dict)
    # window -> metric -> route -> the earliest recorded sample, for the routes `covered`
    earliest_recorded: Mapping[str, Mapping[str, Mapping[str, float]]] = field(default_factory=dict)
    # (window, metric, source) -> the step each coverage query ran at (source: "raw", "own" or
    # "recorded"); missing: not queried (unknown)
    coverage_steps: Mapping[tuple[str, str, str], int] = field(default_factory=dict)


@dataclass
class _Line:
    body: bytes
    budget: float | None


@dataclass
class _Lines:
    generation: int = -1
    by_window: dict[str, dict[str, _Line]] = field(default_factory=dict)


def histograms(
    buckets: Iterable[Sample], sums: Iterable[Sample], key: Callable[[Mapping[str, str]], Any]
) -> dict[Any, Histogram]:
    """Histograms from `sum by (..., le)` samples, by `key` of their labels; made cumulative
    as histogram_quantile does (an extrapolated increase may dip below a lower bucket's).
    One bound spelt two ways (`1` and `1.0`, as two exporters may) is one bucket: summed."""
    bounds: dict[Any, dict[float, float]] = {}
    for sample in buckets:
        le = sample.labels.get("le")
        if le is None:
            continue
        try:
            bound = float(le)
        except ValueError:
            continue
        counts = bounds.setdefault(key(sample.labels), {})
        counts[bound] = counts.get(bound, 0.0) + max(sample.value, 0.0)
    totals = {key(s.labels): s.value for s in sums}
    out = {}
    for k, by_bound in bounds.items():
        pairs = sorted(by_bound.items())
        if not pairs or not math.isinf(pairs[-1][0]):
            continue
        cumulative, highest = [], 0.0
        for bound, count in pairs:
            highest = max(highest, count)
            cumulative.append((bound, highest))
        out[k] = Histogram(tuple(cumulative), totals.get(k))
    return out


class Attainment:
    def __init__(
        self,
        index: CRIndex,
        kinds: Mapping[str, str],
        metrics: Metrics,
        prometheus: Prometheus | None,
        *,
        labels: Sequence[tuple[str, str]],
        refresh_seconds: float,
        series_limit: int,
        max_samples: int = 50_000_000,
        min_requests: float = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`kinds`: plural -> kind name of each kind of route; `min_requests`: the traffic
        floor, fewer requests in a window is `no_data` (`insufficient_traffic`)."""
        self.index = index
        self.kinds = kinds
        self.plurals = {name: plural for plural, name in kinds.items()}
        self.metrics = metrics
        self.prometheus = prometheus
        self.labels = tuple(labels)
        self.label_names = tuple(label for label, _ in labels)
        self.refresh_seconds = refresh_seconds
        self.series_limit = series_limit
        self.max_samples = max_samples
        self.min_requests = min_requests
        self.clock = clock
        self.snapshot: Snapshot | None = None
        self.reason: str | None = None  # why the last refresh failed, None once it worked
        self._generation = 0  # see `generation`
        self._stale = False
        self.queues: dict[tuple[str, int], QueueReading] = {}
        self._task: asyncio.Task[None] | None = None
        self._lines = _Lines()
        self._series: BoundedDict[tuple[str, str, str, int], list[Any]] = BoundedDict(SERIES_CACHED)
        self._limit = asyncio.Semaphore(CONCURRENCY)
        # One refresh at a time: of two that overlap, the one started first may end last and
        # put its older figures back.
        self._refreshing = asyncio.Lock()
        self._orders: BoundedDict[tuple[Any, ...], list[str]] = BoundedDict(64)
        self._pages: BoundedDict[tuple[Any, ...], tuple[bytes, str]] = BoundedDict(256)
        self._changes = 0  # moves with every change of a route the index reports
        # A route's line is kept until its CRs change (the index says which) or a refresh.
        index.subscribe(self._routes_changed)
        if prometheus is None:
            metrics.attainment_age.set(-1)
        else:
            metrics.attainment_age.set_function(self._age)

    @property
    def configured(self) -> bool:
        return self.prometheus is not None

    @property
    def generation(self) -> int:
        """Moves with every refresh that changes what answers say, and when the figures turn
        stale (no refresh comes to change them then)."""
        stale = self.snapshot is not None and self.clock() - self.snapshot.at > self.stale_after
        if stale != self._stale:
            self._stale = stale
            self._generation += 1
        return self._generation

    @generation.setter
    def generation(self, value: int) -> None:
        self._generation = value

    def _age(self) -> float:
        return -1.0 if self.snapshot is None else max(self.clock() - self.snapshot.at, 0.0)

    # -- the refresh -----------------------------------------------------------------------

    def start(self) -> None:
        if self.prometheus is not None:
            self._task = asyncio.create_task(self._run(), name="attainment")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.prometheus is not None:
            await self.prometheus.close()

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:
                # A bug in a refresh must not end them: the next one may well work.
                self.metrics.attainment_refreshes.labels("error").inc()
                log.exception("attainment refresh failed")
            await asyncio.sleep(self.refresh_seconds)

    async def refresh(self) -> None:
        """Query every route's figures once; a failure keeps the last good snapshot. Asked for
        while one runs, it waits for that one and then refreshes again."""
        async with self._refreshing:
            await self._refresh()

    async def _refresh(self) -> None:
        assert self.prometheus is not None
        at = float(int(self.clock()))
        try:
            snapshot = await self._query_all(at)
        except PrometheusError as exc:
            self.metrics.attainment_refreshes.labels(exc.cause).inc()
            log.warning("attainment unavailable: %s", exc.reason, extra={"cause": exc.cause})
            if self.reason != exc.reason:
                self.generation += 1
            self.reason = exc.reason
            return
        except Exception:
            self.metrics.attainment_refreshes.labels("error").inc()
            log.exception("attainment refresh failed")
            self.reason = "the refresh failed (see slo-api's log)"
            self.generation += 1
            return
        await self._read_queues(at)
        self.snapshot, self.reason = snapshot, None
        self.generation += 1
        self.metrics.attainment_refreshes.labels("ok").inc()

    async def _query(self, purpose: str, expr: str, at: float) -> list[Sample]:
        assert self.prometheus is not None
        async with self._limit:
            try:
                samples = await self.prometheus.query(expr, at)
            except PrometheusError as exc:
                self.metrics.prometheus_queries.labels(purpose, exc.cause).inc()
                raise
        self.metrics.prometheus_queries.labels(purpose, "ok").inc()
        return samples

    async def _objects(self, kind: str) -> AsyncIterator[Obj]:
        async for _, obj in self._claims(kind):
            yield obj

    async def _claims(self, kind: str) -> AsyncIterator[tuple[str, Obj]]:
        """Every CR of a kind that claims a route, with the route, a chunk at a time: at
        100,000 routes one walk would hold the event loop for seconds."""
        plural = self.plurals.get(kind)
        if plural is None:
            return
        for i, route in enumerate(list(self.index.routes(kind))):
            if i % CHUNK == CHUNK - 1:
                await asyncio.sleep(0)
            for p, obj in self.index.claims(route):
                if p == plural:
                    yield route, obj

    async def _query_all(self, at: float) -> Snapshot:
        names = self.label_names
        recorded = await self._recorded(at)
        covered = {
            metric: frozenset(r for w in recorded.values() for r in w.get(metric, {}))
            for metric in selectors.METRICS
        }
        # Each LLM route's series and the metrics it has targets on: no figure is read from a
        # metric's raw series for a route without targets on it.
        routes = [
            (route, selector_of(obj, self.labels), _targeted(obj))
            async for route, obj in self._claims("llm")
        ]

        def by_values(labels: Mapping[str, str]) -> tuple[str, ...]:
            return tuple(labels.get(n, "") for n in names)

        narrowed: dict[tuple[str, str, bool], tuple[int, str]] = {}
        problems: dict[str, str] = {}

        def by_tag(own: Sequence[str]) -> Callable[[Mapping[str, str]], str]:
            def key(labels: Mapping[str, str]) -> str:
                place = selectors.tag_index(labels, len(own))
                return "" if place is None else own[place]

            return key

        async def each_own(window: str, metric: str, own: list[str], per_step: float) -> Any:
            """The routes with their own matchers, joined; when that fails, each alone, so
            one route's failing query is that route's problem, not every route's."""

            def queries(matchers: list[str]) -> Callable[[str], tuple[str, str]]:
                return lambda w: selectors.own(metric, matchers, w)

            try:
                return await one(window, metric, True, queries(own), per_step, by_tag(own))
            except PrometheusError as exc:
                if exc.cause not in ("query", "timeout"):
                    raise  # Prometheus itself fails (unreachable, 5xx): every route's problem

            async def alone(matchers: str) -> Mapping[str, Histogram]:
                try:
                    found: Mapping[str, Histogram] = await one(
                        window, metric, True, queries([matchers]), per_step, by_tag([matchers])
                    )
                except PrometheusError as exc:
                    problems.setdefault(matchers, exc.reason)
                    return {}
                return found

            joined: dict[str, Histogram] = {}
            for result in await asyncio.gather(*(alone(m) for m in own)):
                joined.update(result)
            return joined

        async def one(
            window: str,
            metric: str,
            is_own: bool,
            queries: Callable[[str], tuple[str, str]],
            per_step: float,
            key: Any,
        ) -> Any:
            seconds = self._narrowed(window, metric, per_step, narrowed, is_own)
            if seconds == 0:
                return {}
            buckets_q, sums_q = queries(window if seconds == SECONDS[window] else f"{seconds}s")
            want_sums = window in WINDOWS
            buckets, sums = await asyncio.gather(
                self._query("refresh", buckets_q, at),
                self._query("refresh", sums_q, at) if want_sums else _nothing(),
            )
            return histograms(buckets, sums, key)

        jobs: list[tuple[str, str, bool, Awaitable[Any]]] = []
        # metric -> whether raw series are queried, their matchers, the own matchers queried,
        # and how many histograms each selection holds (for the coverage queries' guard)
        scopes: dict[str, tuple[bool, str, list[str], float, float]] = {}
        for metric in selectors.METRICS:
            # The routes with targets on the metric: without recorded series every series'
            # (by the template's labels), and the routes' own matchers; with some, only the
            # raw series of the routes without. None at all when no route has targets on it.
            wanting = [
                (r, s) for r, s, targeted in routes if metric in targeted and s.problem is None
            ]
            values: list[tuple[str, ...]] = []
            where = ""
            rest = [s for r, s in wanting if r not in covered[metric]]
            own = sorted({s.own for s in rest if s.own is not None})
            if covered[metric]:
                values = sorted({tuple(v for _, v in s.values) for s in rest if s.own is None})
                if len(values) <= ONLY_ROUTES:
                    where = selectors.only(names, values)
                raw = bool(values)
            else:
                raw = any(s.own is None for s in rest)
            # What 5 minutes of the series hold, for the max-samples guard.
            grouped_step, grouped_series = (
                await self._samples_per_step(metric, [where], at) if raw else (0.0, 0.0)
            )
            try:
                own_step, own_series = (
                    await self._samples_per_step(metric, own, at) if own else (0.0, 0.0)
                )
            except PrometheusError as exc:
                if exc.cause not in ("query", "timeout"):
                    raise
                # A route's own matchers that Prometheus refuses: each_own finds which, and
                # only that route is unavailable; the others' queries are not narrowed.
                own_step, own_series = 0.0, 0.0
            scopes[metric] = (raw, where, own, grouped_series, own_series)

            def raw_queries(w: str, m: str = metric, wh: str = where) -> tuple[str, str]:
                return selectors.grouped(m, names, w, wh)

            for window in QUERIED:
                if raw:
                    job = one(window, metric, False, raw_queries, grouped_step, by_values)
                    jobs.append((window, metric, False, job))
                if own:
                    jobs.append((window, metric, True, each_own(window, metric, own, own_step)))
        # Coverage of the routes read from raw series, and of those read from recorded series
        # (from those: their figures rest on them); never of series no figure is read from.
        steps: dict[tuple[str, str, str], int] = {}
        coverage = [
            (
                window,
                metric,
                self._earliest(window, metric, scopes[metric], by_values, by_tag, steps, at),
            )
            for window in WINDOWS
            for metric in selectors.METRICS
        ]
        histograms_recorded = sum(len(routes) for routes in recorded.get("28d", {}).values())
        coverage_recorded = [
            (window, self._earliest_recorded(window, histograms_recorded, steps, at))
            for window in (WINDOWS if any(covered.values()) else ())
        ]
        results = await _all(
            [job for *_, job in jobs]
            + [job for *_, job in coverage]
            + [job for _, job in coverage_recorded]
        )
        grouped: dict[str, dict[str, Mapping[tuple[str, ...], Histogram]]] = {}
        owned: dict[str, dict[str, Mapping[str, Histogram]]] = {}
        for (window, metric, is_own, _), result in zip(jobs, results[: len(jobs)], strict=True):
            (owned if is_own else grouped).setdefault(window, {})[metric] = result
        earliest: dict[str, dict[str, Mapping[Any, float | None]]] = {}
        ends = len(jobs) + len(coverage)
        for (window, metric, _), found in zip(coverage, results[len(jobs) : ends], strict=True):
            if found is not None:
                earliest.setdefault(window, {})[metric] = found
        earliest_recorded = {
            window: found
            for (window, _), found in zip(coverage_recorded, results[ends:], strict=True)
            if found is not None
        }
        return Snapshot(
            at,
            grouped,
            owned,
            problems,
            recorded,
            covered,
            narrowed,
            earliest,
            earliest_recorded,
            steps,
        )

    async def _recorded(self, at: float) -> dict[str, dict[str, dict[str, Histogram]]]:
        """Each window's histograms of the routes `sloctl rules` records, by metric and route."""

        def key(labels: Mapping[str, str]) -> tuple[str, str]:
            return labels.get("metric", ""), labels.get("route", "")

        async def one(window: str) -> dict[str, dict[str, Histogram]]:
            samples = await self._query("recorded", selectors.recorded(SECONDS[window]), at)
            buckets = [s for s in samples if "le" in s.labels]
            sums = [s for s in samples if "le" not in s.labels]
            out: dict[str, dict[str, Histogram]] = {}
            for (metric, route), histogram in histograms(buckets, sums, key).items():
                out.setdefault(metric, {})[route] = histogram
            return out

        results = await _all([one(w) for w in QUERIED])
        return dict(zip(QUERIED, results, strict=True))

    async def _samples_per_step(
        self, metric: str, where: Sequence[str], at: float
    ) -> tuple[float, float]:
        """The bucket samples 5 minutes of the selected series hold, and their histograms."""
        counted = await self._query("samples", selectors.samples_per_step(metric, where), at)
        found = {selectors.tag_index(s.labels, 2): s.value for s in counted}
        return found.get(0, 0.0), found.get(1, 0.0)

    def _coverage_step(self, window: str, histograms: float) -> int | None:
        """The step of a coverage subquery over `window` of that many histograms: a
        thousandth of the window (at least a minute), or coarser so it holds at most
        max_samples at once (Prometheus holds a subquery's every step: `--query.max-samples`);
        None when even one step a window holds more."""
        seconds = SECONDS[window]
        step = selectors.coverage_step(seconds)
        # Every histogram's steps, and one histogram's again while `min_over_time` reads them.
        held = histograms + 1
        if held * (seconds // step + 1) <= self.max_samples:
            return step
        if held * 2 > self.max_samples:
            return None
        # The fewest whole minutes that keep the steps (one more than fit in the window) in.
        steps = int(self.max_samples // held) - 1
        return -(-seconds // steps // 60) * 60

    def _narrowed(
        self,
        window: str,
        metric: str,
        per_step: float,
        narrowed: dict[tuple[str, str, bool], tuple[int, str]],
        is_own: bool,
    ) -> int:
        """The seconds a raw query over `window` may span so it loads at most max_samples:
        the window itself, or fewer (said in `narrowed`), or 0 when even 5 minutes load more.
        `per_step` is what the series hold in 5 minutes now: a window holds its multiple."""
        seconds = SECONDS[window]
        step = recorded_series.STEP_SECONDS
        estimate = per_step * seconds / step
        if estimate <= self.max_samples:
            return seconds
        fits = int(self.max_samples // per_step) * step if per_step > 0 else seconds
        reason = (
            f"the {window} query of {selectors.METRICS[metric]} would load about "
            f"{estimate:.3g} samples, more than ATTAINMENT_MAX_SAMPLES ({self.max_samples}); "
        )
        if fits < step:
            narrowed[(window, metric, is_own)] = (0, reason + "not queried")
            return 0
        narrowed[(window, metric, is_own)] = (
            fits,
            reason + f"over the last {duration(fits)} instead (record the routes with "
            "`sloctl rules` to read the whole window)",
        )
        return fits

    async def _earliest(
        self,
        window: str,
        metric: str,
        scope: tuple[bool, str, list[str], float, float],
        by_values: Callable[[Mapping[str, str]], Any],
        by_tag: Callable[[Sequence[str]], Callable[[Mapping[str, str]], Any]],
        steps: dict[tuple[str, str, str], int],
        at: float,
    ) -> dict[Any, float | None] | None:
        """Each route's earliest raw sample in `window` (see Snapshot.earliest), of the
        routes read from raw series (`scope`, as the raw queries select them); None (for all
        routes, or for a route with its own matchers) when Prometheus refused or gave up on
        the query, or when it would hold more than max_samples: coverage unknown, the figures
        stand."""
        raw, where, own, grouped_histograms, own_histograms = scope

        async def ask(expr: str, key: Callable[[Mapping[str, str]], Any]) -> dict[Any, float]:
            return {key(s.labels): s.value for s in await self._query("coverage", expr, at)}

        found: dict[Any, float | None] = {}
        step = self._coverage_step(window, grouped_histograms)
        if raw:
            if step is None:
                self._too_many(window, metric, grouped_histograms)
                return None
            steps[(window, metric, "raw")] = step
            grouped = selectors.coverage_grouped(metric, self.label_names, window, step, where)
            try:
                found.update(await ask(grouped, by_values))
            except PrometheusError as exc:
                if exc.cause not in ("query", "timeout"):
                    raise
                return None
        if own:
            step = self._coverage_step(window, own_histograms)
            if step is None:
                self._too_many(window, metric, own_histograms)
                found.update({m: None for m in own})
                return found
            steps[(window, metric, "own")] = step
            try:
                found.update(
                    await ask(selectors.coverage_own(metric, own, window, step), by_tag(own))
                )
            except PrometheusError as exc:
                if exc.cause not in ("query", "timeout"):
                    raise
                # Unknown for these routes, not "no series".
                found.update({m: None for m in own})
        return found

    async def _earliest_recorded(
        self, window: str, histograms: float, steps: dict[tuple[str, str, str], int], at: float
    ) -> dict[str, dict[str, float]] | None:
        """Each recorded route's earliest recorded sample in `window`, by metric and route;
        None when unknown (refused, given up on, or more than max_samples)."""
        step = self._coverage_step(window, histograms)
        if step is None:
            self._too_many(window, "recorded", histograms)
            return None
        try:
            samples = await self._query("coverage", selectors.coverage_recorded(window, step), at)
        except PrometheusError as exc:
            if exc.cause not in ("query", "timeout"):
                raise
            return None
        out: dict[str, dict[str, float]] = {}
        for sample in samples:
            metric = sample.labels.get("metric", "")
            out.setdefault(metric, {})[sample.labels.get("route", "")] = sample.value
        for metric in out:
            steps[(window, metric, "recorded")] = step
        return out

    def _too_many(self, window: str, metric: str, histograms: float) -> None:
        log.warning(
            "the %s coverage of %s is not queried: %g histograms hold more samples than "
            "ATTAINMENT_MAX_SAMPLES (%d) at one step a window; coverage unknown",
            window,
            metric,
            histograms,
            self.max_samples,
        )

    async def _read_queues(self, at: float) -> None:
        """Each job route's queue (each distinct query and maxDepth once); a failing query
        is that route's problem, not attainment's."""
        wanted: set[tuple[str, int]] = set()
        async for obj in self._objects("job"):
            queue = (obj.get("spec") or {}).get("queue") or {}
            promql, depth = queue.get("promql"), queue.get("maxDepth") or 0
            if isinstance(promql, str) and promql.strip() and isinstance(depth, int) and depth > 0:
                wanted.add((promql, depth))
        readings = {key: self.queues.get(key) or QueueReading() for key in wanted}
        await asyncio.gather(
            *(self._read_queue(key, reading, at) for key, reading in readings.items())
        )
        self.queues = readings

    async def _read_queue(self, key: tuple[str, int], reading: QueueReading, at: float) -> None:
        promql, depth = key
        try:
            counted = await self._query("queue", selectors.queue_series_count(promql), at)
            count = counted[0].value if counted else 0
            if count > self.series_limit:
                raise PrometheusError(
                    f"it returns {count:g} series, more than "
                    f"ATTAINMENT_SERIES_LIMIT ({self.series_limit})",
                    "query",
                )
            now, *good = await asyncio.gather(
                self._query("queue", selectors.queue_depth(promql), at),
                *(
                    self._query("queue", selectors.queue_good_steps(promql, depth, w), at)
                    for w in WINDOWS
                ),
            )
        except PrometheusError as exc:
            reading.problem = f"queue.promql: {exc.reason}"
            return
        reading.last = Queue(
            at,
            now[0].value if now else None,
            {w: (g[0].value if g else None) for w, g in zip(WINDOWS, good, strict=True)},
        )
        reading.problem = None

    # -- answers ---------------------------------------------------------------------------

    def source(self) -> Obj:
        if self.prometheus is None:
            return {"status": "not_configured", "reason": None, "asOf": None}
        snapshot = self.snapshot
        if snapshot is None:
            return {
                "status": "unavailable",
                "reason": self.reason or "not queried yet",
                "asOf": None,
            }
        if self.reason:
            status, reason = "unavailable", self.reason
        elif self.clock() - snapshot.at > self.stale_after:
            status = "stale"
            reason = f"no refresh has completed for over {self.stale_after:g} s"
        else:
            status, reason = "ok", None
        return {"status": status, "reason": reason, "asOf": rfc3339(snapshot.at)}

    @property
    def stale_after(self) -> float:
        """How old figures may be while refreshes work: a few missed ones and a query's
        timeout; older, a refresh is stuck and they are `stale`, never `ok`."""
        timeout = self.prometheus.timeout if self.prometheus is not None else 0.0
        return STALE_REFRESHES * self.refresh_seconds + timeout

    def answer(self, route: str, kind: str, obj: Obj, window: str) -> Obj:
        """A route's attainment over `window`, without `series`."""
        source = self.source()
        objectives: list[Obj] = []
        unmeasured: list[Obj] = []
        shown: dict[str, str] | None = None
        alerts: list[Obj] = []
        narrowed: list[Obj] = []
        spec = obj.get("spec") or {}
        if kind == "llm":
            selector = selector_of(obj, self.labels)
            shown = selector.shown()
            unmeasured = _unmeasured_ranges(spec)
            alerts = _alerting(spec)
            problem = selector.problem
            if problem is None and self.snapshot is not None and selector.own is not None:
                problem = self.snapshot.problems.get(selector.own)
            if problem is not None and source["status"] != "not_configured":
                source = {**source, "status": "unavailable", "reason": problem}
            elif self.snapshot is not None and problem is None:
                objectives = self._latency(route, selector, spec, window)
                narrowed = self._narrowings(route, selector, objectives, window)
        elif kind == "job":
            queue = spec.get("queue") or {}
            depth = queue.get("maxDepth") or 0
            promql = queue.get("promql")
            if not isinstance(depth, int) or depth <= 0:
                unmeasured = [
                    {
                        "metric": "queue",
                        "range": None,
                        "reason": "queue.maxDepth is 0: not configured",
                    }
                ]
            elif not isinstance(promql, str) or not promql.strip():
                unmeasured = [{"metric": "queue", "range": None, "reason": "no queue.promql"}]
            elif self.snapshot is not None:
                reading = self.queues.get((promql, depth))
                if reading is not None and reading.problem is not None:
                    source = {**source, "status": "unavailable", "reason": reading.problem}
                if reading is not None and reading.last is not None:
                    last = reading.last
                    if last.at != self.snapshot.at:
                        source = {**source, "asOf": rfc3339(last.at)}
                    objectives = [queue_objective(depth, last.now, last.good.get(window))]
                elif reading is None:
                    source = {**source, "status": "unavailable", "reason": "not queried yet"}
        return {
            "route": route,
            "kind": kind,
            "window": window,
            "source": source,
            "selectors": shown,
            "objectives": objectives,
            "unmeasured": unmeasured,
            "alerting": alerts,
            "narrowed": narrowed,
        }

    def _narrowings(
        self, route: str, selector: Selector, objectives: list[Obj], window: str
    ) -> list[Obj]:
        """The answer's metrics whose raw query over `window`, or a burn rate's window, was
        narrowed or not sent."""
        snapshot = self.snapshot
        assert snapshot is not None
        out = []
        for metric in sorted({o["metric"] for o in objectives}):
            if route in snapshot.covered.get(metric, ()):
                continue
            for w in (window, *(b for b in BURN_WINDOWS if b != window)):
                found = snapshot.narrowed.get((w, metric, selector.own is not None))
                if found is not None:
                    seconds, reason = found
                    out.append(
                        {
                            "metric": metric,
                            "window": w,
                            "to": duration(seconds) if seconds else None,
                            "reason": reason,
                        }
                    )
        return out

    def _latency(self, route: str, selector: Selector, spec: Obj, window: str) -> list[Obj]:
        snapshot = self.snapshot
        assert snapshot is not None

        def histogram(w: str, metric: str) -> Histogram | None:
            if route in snapshot.covered.get(metric, ()):
                return snapshot.recorded.get(w, {}).get(metric, {}).get(route)
            if selector.own is not None:
                return snapshot.own.get(w, {}).get(metric, {}).get(selector.own)
            values = tuple(v for _, v in selector.values)
            return snapshot.grouped.get(w, {}).get(metric, {}).get(values)

        key: Any = selector.own
        if key is None:
            key = tuple(v for _, v in selector.values)
        span = SECONDS[window]

        def coverage(metric: str) -> tuple[bool, Obj | None]:
            """Whether the selector matched any series in the window (True when unknown),
            and the part of the window Prometheus holds for it: of the series the figures
            are read from (the recorded ones for a recorded route)."""
            known: Mapping[Any, float | None] | None
            if route in snapshot.covered.get(metric, ()):
                source, found = "recorded", route
                recorded = snapshot.earliest_recorded.get(window)
                known = None if recorded is None else recorded.get(metric, {})
            else:
                source, found = ("raw" if selector.own is None else "own"), key
                known = snapshot.earliest.get(window, {}).get(metric)
            step = snapshot.coverage_steps.get((window, metric, source))
            if known is None:
                return True, None
            if found not in known:
                return False, None
            first = known[found]
            if first is None or step is None:
                return True, None
            since = max(first, snapshot.at - span)
            fraction = min((snapshot.at - since) / span, 1.0)
            shown = {"since": rfc3339(since), "fraction": fraction, "resolution": duration(step)}
            return True, shown

        def forecast(objective: Obj) -> Obj:
            hours = objective.pop("exhaustsIn", None)
            at = None
            if hours is not None:
                at = {
                    w: None if h is None else rfc3339(snapshot.at + h * 3600)
                    for w, h in hours.items()
                }
            return {**objective, "exhaustsAt": at}

        out = []
        metrics: tuple[LatencyMetric, ...] = ("ttft", "otps")
        for metric in metrics:
            matched, covered = coverage(metric)
            section = spec.get(metric) or {}
            for m in (section.get("default") or {}).get("metrics") or []:
                type_, threshold = m.get("type"), m.get("threshold")
                if type_ not in PERCENTILES and type_ != "avg":
                    continue
                if not isinstance(threshold, int | float):
                    continue
                objective = latency_objective(
                    metric,
                    type_,
                    threshold,
                    histogram(window, metric),
                    {w: histogram(w, metric) for w in BURN_WINDOWS},
                    min_requests=self.min_requests,
                    series=matched,
                    window_hours=span / 3600,
                )
                out.append({**forecast(objective), "coverage": covered})
        return out

    # -- one route, with series ------------------------------------------------------------

    async def with_series(self, route: str, kind: str, obj: Obj, window: str) -> Obj:
        answer = self.answer(route, kind, obj, window)
        objectives = answer["objectives"]
        if not objectives:
            return answer
        # While Prometheus fails, the last figures come without a chart rather than after
        # a timeout per request.
        points = (
            await self._series_of(route, kind, obj, window, objectives)
            if answer["source"]["status"] == "ok"
            else []
        )
        answer["objectives"] = [
            {**o, "series": points[i] if i < len(points) else []} for i, o in enumerate(objectives)
        ]
        return answer

    async def _series_of(
        self, route: str, kind: str, obj: Obj, window: str, objectives: list[Obj]
    ) -> list[list[list[float]]]:
        snapshot = self.snapshot
        assert snapshot is not None
        assert self.prometheus is not None
        key = (route, resource_version(obj), window, self.generation)
        cached = self._series.get(key)
        if cached is not None:
            return cached
        span = SECONDS[window]
        step = max(span // SERIES_POINTS, MIN_STEP)
        step_text = f"{step}s"
        if kind == "job":
            queue = (obj.get("spec") or {}).get("queue") or {}
            queries = [selectors.queue_depth(str(queue.get("promql")))]
        else:
            matchers = selector_of(obj, self.labels).matchers
            assert matchers is not None
            queries = [
                selectors.series(o["metric"], o["type"], o["objective"], matchers, step_text)
                for o in objectives
            ]
        end = snapshot.at
        start = end - span + step
        try:
            async with self._limit:
                result = await self.prometheus.query_range(
                    selectors.tagged(queries), start, end, step
                )
        except PrometheusError as exc:
            self.metrics.prometheus_queries.labels("series", exc.cause).inc()
            log.warning("series of %s unavailable: %s", route, exc.reason)
            return []
        self.metrics.prometheus_queries.labels("series", "ok").inc()
        points: list[list[list[float]]] = [[] for _ in queries]
        for series in result:
            place = selectors.tag_index(series.labels, len(points))
            if place is not None:
                points[place] = [[t, v] for t, v in series.points][-SERIES_POINTS:]
        self._series[key] = points
        return points

    # -- many routes -----------------------------------------------------------------------

    def _routes_changed(self, routes: set[str]) -> None:
        # Orders and pages built before this change are not looked up again.
        self._changes += 1
        for cache in self._lines.by_window.values():
            for route in routes:
                cache.pop(route, None)

    def _line(self, route: str, window: str) -> _Line:
        lines = self._lines
        if lines.generation != self.generation:
            lines.generation, lines.by_window = self.generation, {}
        cache = lines.by_window.setdefault(window, {})
        line = cache.get(route)
        if line is not None:
            return line
        claims = self.index.claims(route)
        if len(claims) == 1:
            plural, obj = claims[0]
            answer = self.answer(route, self.kinds[plural], obj, window)
            budget = lowest_budget(answer["objectives"])
        else:
            answer = {
                "route": route,
                "ambiguous": True,
                "kinds": sorted({self.kinds[p] for p, _ in claims}),
                "count": len(claims),
            }
            budget = None
        line = cache[route] = _Line(orjson.dumps(answer), budget)
        return line

    def line(self, window: str) -> Callable[[str], bytes]:
        return lambda route: self._line(route, window).body

    async def page(
        self,
        routes: list[str],
        key: Any,
        window: str,
        by_budget: bool,
        page: int,
        page_size: int,
        render: Callable[[list[str], int, int, bool, Callable[[str], bytes]], bytes],
    ) -> tuple[bytes, str]:
        """A `/config?view=attainment` page of `routes` (named by `key`: the same list while
        `key` is) and its weak ETag, kept until a refresh or a change of any route."""
        page_key = (key, window, by_budget, page, page_size, self.generation, self._changes)
        cached = self._pages.get(page_key)
        if cached is None:
            if by_budget:
                routes = await self.by_budget(routes, window, key)
            body = render(routes, page, page_size, False, self.line(window))
            cached = self._pages[page_key] = (body, weak_etag(body))
        return cached

    async def by_budget(self, routes: list[str], window: str, key: Any) -> list[str]:
        """`routes` by their lowest budget remaining, ascending; those without one last
        (by name). `key` names the list (it is the same list while `key` is). The lines
        missing after a refresh are worked out a chunk at a time, the loop free between."""
        order_key = (key, window, self.generation, self._changes)
        order = self._orders.get(order_key)
        if order is None:
            routes = list(routes)
            budgets: list[tuple[float | None, str]] = []
            for start in range(0, len(routes), CHUNK):
                budgets.extend(
                    (self._line(r, window).budget, r) for r in routes[start : start + CHUNK]
                )
                await asyncio.sleep(0)
            fresh = order_key[2:] == (self.generation, self._changes)
            order = [
                r
                for _, r in sorted(
                    budgets,
                    key=lambda br: (br[0] is None, br[0] if br[0] is not None else 0.0, br[1]),
                )
            ]
            if fresh:
                # Else a refresh or a change came while it was built: this request gets it,
                # the next builds it again.
                self._orders[order_key] = order
        return order


def _targeted(obj: Obj) -> frozenset[str]:
    """The metrics an LLM CR has targets on that attainment reads (as `_latency` reads them)."""
    spec = obj.get("spec") or {}
    return frozenset(
        metric
        for metric in selectors.METRICS
        if any(
            isinstance(m, dict)
            and (m.get("type") in PERCENTILES or m.get("type") == "avg")
            and isinstance(m.get("threshold"), int | float)
            for m in ((spec.get(metric) or {}).get("default") or {}).get("metrics") or []
        )
    )


def _alerting(spec: Obj) -> list[Obj]:
    """Each percentile target's bucket and alert arms: from the targets alone, so alerts can
    be made whether or not Prometheus answers."""
    out = []
    metrics: tuple[LatencyMetric, ...] = ("ttft", "otps")
    for metric in metrics:
        for m in ((spec.get(metric) or {}).get("default") or {}).get("metrics") or []:
            type_, threshold = m.get("type"), m.get("threshold")
            if isinstance(type_, str) and isinstance(threshold, int | float):
                entry = alerting(metric, type_, threshold)
                if entry is not None:
                    out.append(entry)
    return out


def _unmeasured_ranges(spec: Obj) -> list[Obj]:
    out = []
    for metric in ("ttft", "otps"):
        for r in (spec.get(metric) or {}).get("ranges") or []:
            out.append(
                {
                    "metric": metric,
                    "range": {
                        "contextLengthRangeLow": r.get("contextLengthRangeLow"),
                        "contextLengthRangeHigh": r.get("contextLengthRangeHigh"),
                    },
                    "reason": UNMEASURED_RANGE,
                }
            )
    return out


async def _nothing() -> list[Sample]:
    return []


async def _all(jobs: Sequence[Awaitable[Any]]) -> list[Any]:
    """Every job's result; the first failure fails them all (the rest are cancelled)."""
    tasks = [asyncio.ensure_future(j) for j in jobs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
