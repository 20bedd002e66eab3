"""Prometheus metrics, in a registry of the app's own so several apps can share a process."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class _KindStateCollector(Collector):
    """Reads per-kind state when scraped, so the gauges are never stale."""

    def __init__(self, states: Callable[[], Iterable[tuple[str, bool, bool, int, float | None]]]):
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
            "Seconds since the kind's watch last delivered an event or bookmark",
            labels=["kind"],
        )
        now = time.monotonic()
        for kind, is_synced, is_present, count, last in self._states():
            synced.add_metric([kind], float(is_synced))
            present.add_metric([kind], float(is_present))
            objects.add_metric([kind], float(count))
            if last is not None:
                since.add_metric([kind], now - last)
        yield from (synced, present, objects, since)


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

    def observe_upstream(self, verb: str, code: str, seconds: float) -> None:
        self.upstream.labels(verb, code).inc()
        self.upstream_latency.labels(verb).observe(seconds)

    def watch_kind_states(
        self, states: Callable[[], Iterable[tuple[str, bool, bool, int, float | None]]]
    ) -> None:
        self.registry.register(_KindStateCollector(states))
