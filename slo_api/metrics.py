"""Prometheus metrics, in a registry of the app's own so several apps can share a process."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from slo_api import tracing

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass(frozen=True)
class KindState:
    """What a kind's watch looks like now: read by /readyz, the metrics and the start-up log."""

    kind: str
    synced: bool
    present: bool
    objects: int
    last_event: float | None
    groups: tuple[str, ...] = ()  # the API groups that may serve it, most preferred first
    served: tuple[str, ...] = ()  # those discovery last said serve it
    watched: tuple[str, ...] = ()  # those listed and watched
    # Per group: copies hidden by the same CR under a more preferred group.
    leftovers: Mapping[str, int] = field(default_factory=dict)
    # The index of the kind may be behind the API server: a watch is not open (an outage, a
    # backoff, a task restarting after a failure) or discovery is failing. Readiness does not
    # follow it (once synced, a kind stays ready); /readyz and the metrics show it.
    stale: bool = False


class _KindStateCollector(Collector):
    """Reads per-kind state when scraped, so the gauges are never stale."""

    def __init__(self, states: Callable[[], Iterable[KindState]]):
        self._states = states

    def collect(self) -> Iterable[GaugeMetricFamily]:
        synced = GaugeMetricFamily(
            "slo_api_kind_synced",
            "1 once the kind's first list completed (or its CRD is known absent)",
            labels=["kind"],
        )
        present = GaugeMetricFamily(
            "slo_api_kind_present", "1 when the kind's CRD is served", labels=["kind"]
        )
        objects = GaugeMetricFamily(
            "slo_api_index_objects", "CRs held in the index", labels=["kind"]
        )
        since = GaugeMetricFamily(
            "slo_api_watch_seconds_since_last_event",
            "Seconds since the kind's watch last delivered an event or bookmark "
            "(its least recent group's, when several are watched)",
            labels=["kind"],
        )
        served = GaugeMetricFamily(
            "slo_api_group_served",
            "1 when discovery says the API group serves the kind (at the configured version)",
            labels=["kind", "group"],
        )
        watched = GaugeMetricFamily(
            "slo_api_group_watched",
            "1 when the kind is listed and watched under the API group",
            labels=["kind", "group"],
        )
        leftovers = GaugeMetricFamily(
            "slo_api_group_leftovers",
            "CRs under the API group hidden by the same namespace/name under a more preferred "
            "group (migration leftovers: not listed, not routed)",
            labels=["kind", "group"],
        )
        stale = GaugeMetricFamily(
            "slo_api_kind_stale",
            "1 while the kind's index may be behind the API server: a watch of it is not open "
            "(an outage, a backoff, a task restarting after a failure) or discovery fails",
            labels=["kind"],
        )
        now = time.monotonic()
        for state in self._states():
            kind = state.kind
            synced.add_metric([kind], float(state.synced))
            stale.add_metric([kind], float(state.stale))
            present.add_metric([kind], float(state.present))
            objects.add_metric([kind], float(state.objects))
            if state.last_event is not None:
                since.add_metric([kind], now - state.last_event)
            for group in state.groups:
                served.add_metric([kind, group], float(group in state.served))
                watched.add_metric([kind, group], float(group in state.watched))
                leftovers.add_metric([kind, group], float(state.leftovers.get(group, 0)))
        yield from (synced, present, stale, objects, since, served, watched, leftovers)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "slo_api_http_requests_total",
            "HTTP requests answered",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "slo_api_http_request_duration_seconds",
            "HTTP request latency",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.watch_events = Counter(
            "slo_api_watch_events_total",
            "Watch events applied to the index",
            ["kind", "type"],
            registry=self.registry,
        )
        self.watch_restarts = Counter(
            "slo_api_watch_restarts_total",
            "Watches re-opened (normal close, timeout or error)",
            ["kind", "reason"],
            registry=self.registry,
        )
        self.task_failures = Counter(
            "slo_api_watch_task_failures_total",
            "Unexpected failures of a watch task (`task`: discovery, informer, kind), each "
            "logged and followed by a restart after a backoff",
            ["kind", "task"],
            registry=self.registry,
        )
        self.relists = Counter(
            "slo_api_watch_relists_total",
            "Full lists that replaced a kind's index entries",
            ["kind"],
            registry=self.registry,
        )
        self.upstream = Counter(
            "slo_api_upstream_requests_total",
            "Calls to the Kubernetes API server",
            ["verb", "code"],
            registry=self.registry,
        )
        self.upstream_latency = Histogram(
            "slo_api_upstream_request_duration_seconds",
            "Latency of calls to the API server",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.writes = Counter(
            "slo_api_writes_total",
            "PUT and DELETE outcomes (the HTTP status, or dry_run)",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.history_entries = Counter(
            "slo_api_history_entries_total",
            "Route history revisions: stored, already there (another replica's), or failed",
            ["outcome"],
            registry=self.registry,
        )
        self.index_bytes = Gauge(
            "slo_api_index_estimated_bytes",
            "Estimated memory held by the index: the encoded CRs and cached renders, plus a "
            "measured cost per CR and per cached render",
            registry=self.registry,
        )
        self.routes_over_limits = Gauge(
            "slo_api_routes_over_limits",
            "Routes whose stored values are beyond their namespace's limits (SLOLimits "
            "`default`): admission refuses new writes beyond a cap but never rechecks what "
            "was stored before it",
            registry=self.registry,
        )

        self.watchers = Gauge(
            "slo_api_change_streams_open",
            "Open GET /config?watch=true streams",
            registry=self.registry,
        )
        self.stream_events = Counter(
            "slo_api_change_stream_events_total",
            "Events written to change streams (bookmarks included)",
            registry=self.registry,
        )
        self.watchers_dropped = Counter(
            "slo_api_change_streams_dropped_total",
            "Change streams ended by the server, by the ERROR code sent (too_slow: fell "
            "further behind than the history keeps; unauthorized, forbidden, expired: access; "
            "unavailable: access could not be checked for the grace)",
            ["reason"],
            registry=self.registry,
        )

        self.authentications = Counter(
            "slo_api_authentications_total",
            "Callers authenticated, by method (static, kubernetes) and result",
            ["method", "result"],
            registry=self.registry,
        )
        self.authorizations = Counter(
            "slo_api_authorizations_total",
            "Access decisions, by method (static, kubernetes), verb and result",
            ["method", "verb", "result"],
            registry=self.registry,
        )
        self.review_cache = Counter(
            "slo_api_review_cache_total",
            "TokenReview and SubjectAccessReview cache look-ups, by cache and hit or miss",
            ["cache", "result"],
            registry=self.registry,
        )
        self.events = Counter(
            "slo_api_events_total",
            "Kubernetes Events recorded for writes, by result (recorded, failed, dropped)",
            ["result"],
            registry=self.registry,
        )
        self.prometheus_queries = Counter(
            "slo_api_prometheus_queries_total",
            "Queries sent to Prometheus for attainment, by purpose (refresh, recorded, samples, "
            "coverage, queue, series) and result (ok, timeout, connection, status, malformed, "
            "query, token)",
            ["purpose", "result"],
            registry=self.registry,
        )
        self.attainment_refreshes = Counter(
            "slo_api_attainment_refreshes_total",
            "Attainment refreshes from Prometheus, by result (ok, or why it failed)",
            ["result"],
            registry=self.registry,
        )
        self.attainment_age = Gauge(
            "slo_api_attainment_age_seconds",
            "Seconds since attainment was last refreshed from Prometheus (-1: never)",
            registry=self.registry,
        )

        # The labelled children, looked up once per label set: `labels()` takes a lock and
        # builds a tuple on every call, on every request.
        self._request_children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._upstream_children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def count_request(
        self, method: str, route: str, status: int, seconds: float, traced: bool
    ) -> None:
        key = (method, route, status)
        children = self._request_children.get(key)
        if children is None:
            children = (
                self.requests.labels(method, route, str(status)),
                self.latency.labels(method, route),
            )
            self._request_children[key] = children
        children[0].inc()
        children[1].observe(seconds, tracing.exemplar() if traced else None)

    def observe_upstream(self, verb: str, code: str, seconds: float) -> None:
        key = (verb, code)
        children = self._upstream_children.get(key)
        if children is None:
            children = (self.upstream.labels(verb, code), self.upstream_latency.labels(verb))
            self._upstream_children[key] = children
        children[0].inc()
        children[1].observe(seconds, tracing.exemplar())

    def watch_kind_states(self, states: Callable[[], Iterable[KindState]]) -> None:
        self.registry.register(_KindStateCollector(states))
