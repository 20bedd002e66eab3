"""Everything one running slo-api holds, started and stopped by the app's lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from slo_api import heap
from slo_api.access import Authorizer
from slo_api.attainment.cache import Attainment
from slo_api.attainment.prometheus import Prometheus
from slo_api.attainment.selectors import parse_route_labels
from slo_api.auth import TokenStore
from slo_api.events import EventRecorder
from slo_api.feed import Feed
from slo_api.groups import KindWatch
from slo_api.history import History
from slo_api.index import CRIndex
from slo_api.kinds import Kind, build_kinds
from slo_api.kube import Kube
from slo_api.limits import EXEMPT_SELECTOR, NAMESPACES_WATCH, PARAMS_WATCH, Limits
from slo_api.metrics import KindState, Metrics
from slo_api.ownership import Ownership
from slo_api.recovery import Backoff, Recovery, stop_tasks, supervise
from slo_api.service import Service
from slo_api.settings import Settings
from slo_api.visible import VisiblePages
from slo_api.watching import Informer, Loops

log = logging.getLogger("slo_api")

KubeFactory = Callable[[Settings, Metrics], Awaitable[Kube]]


async def connect_kube(settings: Settings, metrics: Metrics) -> Kube:
    return await Kube.connect(
        settings.kubeconfig, settings.upstream_timeout_seconds, metrics.observe_upstream
    )


def prometheus_of(settings: Settings) -> Prometheus | None:
    """The Prometheus attainment reads, or None when none is configured."""
    if settings.prometheus_url is None:
        return None
    return Prometheus(
        settings.prometheus_url,
        settings.prometheus_timeout_seconds,
        token_file=settings.prometheus_bearer_token_file,
        ca_file=settings.prometheus_ca_file,
    )


class Runtime:
    def __init__(
        self, settings: Settings, kube: Kube, metrics: Metrics, tokens: TokenStore
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.metrics = metrics
        self.kinds: list[Kind] = build_kinds(settings)
        ownership = Ownership.of(
            settings.gitops_managers,
            settings.gitops_client_side_managers,
            settings.gitops_co_owners,
            settings.gitops_argocd_tracking_label,
        )
        self.index: CRIndex = Service.index_for(self.kinds, ownership)
        # The guardrails' caps per namespace, which routes show (read by the informers below).
        self.limits = Limits()
        self.history = History(kube, self.kinds, settings.route_history_entries, metrics, ownership)
        # The GitOps owners a forced write or a kubectl edit took a field from are remembered
        # with the route's history (from the informers' consecutive states), and the service's
        # GET and write guard read them.
        self.service = Service(
            kube,
            self.kinds,
            self.index,
            ownership,
            remembered=self.history.remembered,
            limits=self.limits,
        )
        self.tokens = tokens
        self.access = Authorizer(settings, kube, self.service, tokens, metrics)
        self.events = EventRecorder(kube, metrics)
        # Before the informers start: every state they observe is looked at, and every
        # write's answer noted (who made which resourceVersion: the history and the stream).
        self.index.on_observed(self.history.observe)
        self.service.on_written = self.history.wrote
        # Before the informers, so it hears every change they make.
        self.feed = Feed(
            self.service,
            metrics,
            history_bytes=settings.watch_history_bytes,
            max_streams=settings.max_watchers,
            streams_per_identity=settings.watch_streams_per_identity,
            bookmark_seconds=settings.watch_bookmark_seconds,
            access_seconds=settings.watch_access_seconds,
            review_grace_seconds=settings.watch_review_grace_seconds,
            flush_seconds=settings.watch_flush_seconds,
            lifetime_seconds=settings.watch_lifetime_seconds,
            by=self.history.by,
        )
        # The pages and their ETags follow the feed's change log: the one change signal.
        self.visible = VisiblePages(self.service, self.index, self.feed.log)
        self.attainment = Attainment(
            self.index,
            {k.resource.plural: k.name for k in self.kinds},
            metrics,
            prometheus_of(settings),
            labels=parse_route_labels(settings.prometheus_route_labels),
            refresh_seconds=settings.attainment_refresh_seconds,
            series_limit=settings.attainment_series_limit,
            max_samples=settings.attainment_max_samples,
            min_requests=settings.attainment_min_requests,
        )
        self.namespaces = settings.watch_namespaces
        self.label_selector = settings.watch_label_selector
        # Wakes every watch loop asleep in its backoff when the API server answers again.
        self.recovery = Recovery(kube.ready)
        # A revision's create that met an outage retries as soon as the API server is back.
        self.history.pause = self.recovery.pause
        loops = Loops(
            kube,
            self.index,
            metrics,
            crd_recheck_seconds=settings.crd_recheck_seconds,
            watch_timeout_seconds=settings.watch_timeout_seconds,
            inactivity_seconds=settings.watch_inactivity_seconds,
        )
        # One watch per kind, each running one informer per API group that serves the kind.
        self.informers = [
            KindWatch(
                loops,
                kind,
                namespaces=self.namespaces,
                label_selector=self.label_selector,
                recovery=self.recovery,
            )
            for kind in self.kinds
        ]
        # The guardrails: each watched namespace's SLOLimits (`default` is kept), and the
        # namespaces labelled exempt (only those are listed).
        self.limit_informers = [
            *(
                Informer(
                    loops,
                    PARAMS_WATCH,
                    store=self.limits,
                    namespace=namespace,
                    recovery=self.recovery,
                )
                for namespace in self.namespaces or (None,)
            ),
            Informer(
                loops,
                NAMESPACES_WATCH,
                store=self.limits,
                label_selector=EXEMPT_SELECTOR,
                recovery=self.recovery,
            ),
        ]
        self.shutting_down = False
        # The kinds' supervised watches: each lives until stop().
        self._tasks: list[asyncio.Task[None]] = []
        # One-shot: once every kind is first listed, freezes the heap and starts attainment.
        self._synced: asyncio.Task[None] | None = None
        self._migrate: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        metrics.watch_kind_states(self.kind_states)
        metrics.index_bytes.set_function(self.index.estimated_bytes)
        metrics.routes_over_limits.set_function(self.service.routes_over_limits)

    def scope(self) -> dict[str, list[str] | str | None]:
        """What is watched: the namespaces (None: all) and the label selector (None: none)."""
        return {
            "namespaces": list(self.namespaces) if self.namespaces else None,
            "labelSelector": self.label_selector or None,
        }

    def kind_states(self) -> list[KindState]:
        return [i.state() for i in self.informers]

    def ready(self) -> bool:
        # The guardrails' informers too: every route's body shows its namespace's limits.
        return (
            not self.shutting_down
            and all(i.synced for i in self.informers)
            and all(i.synced for i in self.limit_informers)
        )

    def not_ready_reason(self) -> str | None:
        if self.shutting_down:
            return "shutting down"
        waiting = [i.kind.name for i in self.informers if not i.synced]
        waiting += [i.kind.name for i in self.limit_informers if not i.synced]
        if waiting:
            return f"index not synced yet: {', '.join(waiting)}"
        return None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.feed.start()
        log.info(
            "watching %s%s",
            f"namespaces {', '.join(self.namespaces)}" if self.namespaces else "every namespace",
            f", CRs selected by {self.label_selector}" if self.label_selector else "",
        )
        self._tasks = [
            asyncio.create_task(self._supervised(i), name=f"watch-{i.kind.name}")
            for i in self.informers
        ]
        self._tasks += [
            asyncio.create_task(
                self._limits_supervised(i),
                name=f"watch-{i.kind.name}",
            )
            for i in self.limit_informers
        ]
        self._synced = asyncio.create_task(self._when_synced(), name="when-synced")
        self._migrate = asyncio.create_task(self._carry_history(), name="history-migration")

    async def _carry_history(self) -> None:
        """Carry route histories of earlier versions (ConfigMaps) over into revisions: once,
        by every replica (what another carried is a no-op), retried while it fails."""
        backoff = Backoff()
        while True:
            try:
                await self.history.migrate(tuple(self.namespaces) or None)
                return
            except Exception:
                delay = backoff.next()
                log.exception("carrying route histories over failed; retrying in %.1fs", delay)
                await self.recovery.pause(delay)

    async def _when_synced(self) -> None:
        """Once every kind is first listed: attainment's first refresh (one before it would find
        no route, and every route would say `no_data` until the next), and a freeze of what is
        alive (the index, its caches, the code), so a full collection then scans only what came
        since (see heap; at 100,000 routes a few hundred ms of stalled loop otherwise)."""
        # Polled: each kind's informers set their own flag, and the first sync happens once.
        while not all(i.synced for i in self.informers):  # noqa: ASYNC110
            await asyncio.sleep(1)
        heap.freeze_alive()
        self.attainment.start()

    async def _supervised(self, watch: KindWatch) -> None:
        def failed(_: BaseException | None) -> None:
            self.metrics.task_failures.labels(watch.kind.name, "kind").inc()

        await supervise(
            f"the watch of {watch.kind.name}",
            watch.run,
            on_failure=failed,
            pause=self.recovery.pause,
        )

    async def _limits_supervised(self, informer: Informer) -> None:
        name = informer.kind.name

        def failed(_: BaseException | None) -> None:
            informer.current = False
            self.metrics.task_failures.labels(name, "informer").inc()

        await supervise(
            f"the watch of {name}", informer.run, on_failure=failed, pause=self.recovery.pause
        )

    def end_streams(self) -> None:
        """End every change stream cleanly; callable from any thread (a signal handler's)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.feed.close_all)

    async def stop(self) -> None:
        self.shutting_down = True
        await self.feed.stop()
        await stop_tasks([*self._tasks, *(t for t in (self._synced, self._migrate) if t)])
        self._tasks, self._synced, self._migrate = [], None, None
        await self.attainment.stop()
        await self.recovery.close()
        await self.events.close()
        await self.history.close()
        await self.kube.close()
