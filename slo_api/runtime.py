"""Everything one running slo-api holds, started and stopped by the app's lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from slo_api.auth import TokenStore
from slo_api.events import EventRecorder
from slo_api.identity import Gatekeeper
from slo_api.index import CRIndex
from slo_api.kinds import Kind, build_kinds
from slo_api.kube import Kube
from slo_api.metrics import Metrics
from slo_api.service import Service
from slo_api.settings import Settings
from slo_api.visible import VisiblePages
from slo_api.watching import Informer

log = logging.getLogger("slo_api")

STOP_RECANCEL_SECONDS = 1.0
KubeFactory = Callable[[Settings, Metrics], Awaitable[Kube]]


async def connect_kube(settings: Settings, metrics: Metrics) -> Kube:
    return await Kube.connect(
        settings.kubeconfig, settings.upstream_timeout_seconds, metrics.observe_upstream
    )


class Runtime:
    def __init__(
        self, settings: Settings, kube: Kube, metrics: Metrics, tokens: TokenStore
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.metrics = metrics
        self.kinds: list[Kind] = build_kinds(settings)
        self.index: CRIndex = Service.index_for(self.kinds)
        self.service = Service(kube, self.kinds, self.index)
        self.tokens = tokens
        self.gate = Gatekeeper(settings, kube, self.kinds, tokens, metrics)
        self.visible = VisiblePages(self.service, self.index)
        self.events = EventRecorder(kube, metrics)
        self.informers = [
            Informer(
                kube,
                kind,
                self.index,
                metrics,
                crd_recheck_seconds=settings.crd_recheck_seconds,
                watch_timeout_seconds=settings.watch_timeout_seconds,
                inactivity_seconds=settings.watch_inactivity_seconds,
            )
            for kind in self.kinds
        ]
        self.shutting_down = False
        self._tasks: list[asyncio.Task[None]] = []
        metrics.watch_kind_states(self.kind_states)

    def kind_states(self) -> list[tuple[str, bool, bool, int, float | None]]:
        return [
            (
                i.kind.name,
                i.synced,
                i.present,
                self.index.count(i.kind.resource.plural),
                i.last_event,
            )
            for i in self.informers
        ]

    def ready(self) -> bool:
        return not self.shutting_down and all(i.synced for i in self.informers)

    def not_ready_reason(self) -> str | None:
        if self.shutting_down:
            return "shutting down"
        waiting = [i.kind.name for i in self.informers if not i.synced]
        if waiting:
            return f"index not synced yet: {', '.join(waiting)}"
        return None

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(i.run(), name=f"watch-{i.kind.name}") for i in self.informers
        ]

    async def stop(self) -> None:
        self.shutting_down = True
        pending = set(self._tasks)
        for task in pending:
            task.cancel()
        while pending:
            _, pending = await asyncio.wait(pending, timeout=STOP_RECANCEL_SECONDS)
            for task in pending:
                # A cancellation can be lost (asyncio.wait_for on Python 3.11 drops one that
                # races with the result): ask again rather than hang the shutdown.
                log.warning("%s did not stop when cancelled; cancelling again", task.get_name())
                task.cancel()
        self._tasks = []
        await self.events.close()
        await self.kube.close()
