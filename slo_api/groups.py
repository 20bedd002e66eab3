"""Which API groups serve a kind, and one Informer per group that does.

A kind has a list of API groups in order of preference (a cluster may still serve an older
group, or both during a migration). Discovery is asked at start and every
`crd_recheck_seconds`. A group that starts serving the kind gets an Informer, listed and then
watched, without a restart; one that stops has its Informer stopped and its CRs dropped from
the index, as a deleted CRD does. A group that does not serve the configured version counts as
absent. Which copy of a CR served under several groups is shown is the index's business.

With `WATCH_NAMESPACES` set, each served group gets one Informer per namespace instead of one
for the whole cluster, so namespaced Roles are all slo-api needs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from slo_api.kinds.base import Kind
from slo_api.kube import KubeError, log_failure
from slo_api.metrics import KindState
from slo_api.recovery import Backoff, Recovery, stop_tasks, supervise
from slo_api.watching import Informer, Loops

log = logging.getLogger("slo_api.watch")


class KindWatch:
    """The watch of one kind across its API groups: what /readyz and the metrics report."""

    def __init__(
        self,
        loops: Loops,
        kind: Kind,
        *,
        namespaces: tuple[str, ...] = (),
        label_selector: str = "",
        recovery: Recovery | None = None,
    ) -> None:
        self.loops = loops
        self.kube, self.index, self.metrics = loops.kube, loops.index, loops.metrics
        self.kind = kind
        # Where each served group is watched: the listed namespaces, or (None) all of them.
        self.namespaces: tuple[str | None, ...] = namespaces or (None,)
        self.label_selector = label_selector
        self.discovered = False
        self.served: tuple[str, ...] = ()
        # By (group, namespace).
        self.informers: dict[tuple[str, str | None], Informer] = {}
        self._tasks: dict[tuple[str, str | None], asyncio.Task[None]] = {}
        self._was_synced = False
        self._reported: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self.backoff = Backoff()
        # One per process, shared by every loop: it wakes them when an outage ends.
        self.recovery = recovery or Recovery(None)
        # False while discovery fails: what is served may have changed unseen.
        self.discovery_ok = False

    # -- state -----------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once discovery answered and every served group completed its first list.

        It stays true (as readiness does): a group that appears later is not waited for.
        """
        if not self._was_synced:
            self._was_synced = self.discovered and all(i.synced for i in self.informers.values())
        return self._was_synced

    @property
    def stale(self) -> bool:
        """The kind's index may be behind the API server: discovery fails, or one of its
        informers has no watch open (an outage, a backoff, a restart after a failure)."""
        return not self.discovery_ok or any(not i.current for i in self.informers.values())

    @property
    def present(self) -> bool:
        return any(i.present for i in self.informers.values())

    @property
    def watched(self) -> tuple[str, ...]:
        present = {g for (g, _), i in self.informers.items() if i.present}
        return tuple(g for g in self.kind.groups if g in present)

    @property
    def last_event(self) -> float | None:
        """The least recent of the watched groups' last events: how stale the kind may be."""
        times = [i.last_event for i in self.informers.values() if i.last_event is not None]
        return min(times) if times else None

    def state(self) -> KindState:
        plural = self.kind.resource.plural
        return KindState(
            kind=self.kind.name,
            synced=self.synced,
            present=self.present,
            objects=self.index.count(plural),
            last_event=self.last_event,
            groups=self.kind.groups,
            served=self.served,
            watched=self.watched,
            leftovers=self.index.leftovers(plural),
            stale=self.stale,
        )

    def describe(self) -> str:
        """One line for the log: which groups serve and are watched, and the leftovers."""
        state = self.state()
        parts = []
        for group in state.groups:
            if group in state.watched:
                parts.append(f"{group} (served, watched)")
            elif group in state.served:
                parts.append(f"{group} (served, not watched yet)")
            else:
                parts.append(f"{group} (not served)")
        leftovers = sum(state.leftovers.values())
        return (
            f"{self.kind.name} ({self.kind.resource.plural}/{self.kind.resource.version}): "
            f"{', '.join(parts)}; {state.objects} CRs, {leftovers} migration leftovers skipped"
        )

    def _report(self) -> None:
        """Log the groups once the kind is synced, and again whenever they change."""
        if not self.synced:
            return
        now = (self.served, self.watched)
        if now == self._reported:
            return
        self._reported = now
        log.info("groups of %s", self.describe())
        if len(self.watched) > 1:
            log.warning(
                "%s is served under %s at once (a migration): a CR under several with the "
                "same namespace and name is shown and written from %s; the other copies are "
                "leftovers, neither listed nor routed",
                self.kind.resource.plural,
                " and ".join(self.watched),
                self.watched[0],
            )

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self.discover()
                except asyncio.CancelledError:
                    raise
                except KubeError as exc:
                    self.discovery_ok = False
                    delay = exc.retry_after or self.backoff.next()
                    log_failure(
                        log,
                        exc,
                        f"the discovery of the API groups of {self.kind.resource.plural}",
                        "its credentials and roles",
                        f"; retrying in {delay:.1f}s",
                    )
                    await self._pause(delay)
                    continue
                except Exception:
                    # A 200 that is not JSON, a credential plugin failing inside the client,
                    # a bug: the kind's watch goes on, its informers keep running.
                    self.discovery_ok = False
                    self.metrics.task_failures.labels(self.kind.name, "discovery").inc()
                    delay = self.backoff.next()
                    log.exception(
                        "%s: discovery of its API groups failed unexpectedly; retrying in %.1fs",
                        self.kind.resource.plural,
                        delay,
                    )
                    await self._pause(delay)
                    continue
                self.backoff.reset()
                await asyncio.sleep(self.loops.crd_recheck_seconds)
        finally:
            await self._stop(self.kind.groups)

    async def _pause(self, delay: float) -> None:
        if await self.recovery.pause(delay):
            self.backoff.reset()

    async def discover(self) -> None:
        """Ask which groups serve the kind; start and stop group informers to match."""
        version, plural = self.kind.resource.version, self.kind.resource.plural
        served = []
        for group in self.kind.groups:
            if plural in await self.kube.served(group, version):
                served.append(group)
        await self.follow(tuple(served))
        self.discovery_ok = True

    async def follow(self, served: tuple[str, ...]) -> None:
        """Watch the groups in `served`; stop those gone from it whose lists found them gone.

        A group discovery no longer lists is kept while its informers still list it, or have
        not listed yet: discovery can lag behind (right after an API server restart, say), and
        a CRD really deleted ends its watches, whose informers then find it absent and drop
        its CRs themselves. Stopping an informer before its first list would leave the kind
        "synced" with nothing listed.
        """
        gone = sorted({g for g, _ in self._tasks if g not in served and self._found_absent(g)})
        if gone:
            log.warning(
                "%s is no longer served under %s; its CRs there are gone",
                self.kind.resource.plural,
                ", ".join(gone),
            )
            await self._stop(gone)
        for group in served:
            for namespace in self.namespaces:
                if (group, namespace) not in self._tasks:
                    self._start(group, namespace)
        self.served = served
        self.discovered = True
        self._report()

    def _found_absent(self, group: str) -> bool:
        """Every informer of the group has listed or looked, and none found the CRD served."""
        mine = [i for (g, _), i in self.informers.items() if g == group]
        return all(i.synced and not i.present for i in mine)

    def _start(self, group: str, namespace: str | None) -> None:
        informer = Informer(
            self.loops,
            self.kind,
            resource=self.kind.resources[group],
            namespace=namespace,
            label_selector=self.label_selector,
            on_synced=self._report,
            recovery=self.recovery,
        )
        self.informers[(group, namespace)] = informer
        name = "-".join(filter(None, ("watch", self.kind.name, group, namespace)))

        def failed(_: BaseException | None) -> None:
            informer.current = False
            self.metrics.task_failures.labels(self.kind.name, "informer").inc()

        # Informer.run handles what a list or watch can raise; this catches the rest (a bug
        # in a handler, say), so nothing ends a group's watch for good.
        task = supervise(
            f"the watch of {informer.name}",
            informer.run,
            on_failure=failed,
            pause=self.recovery.pause,
        )
        self._tasks[(group, namespace)] = asyncio.create_task(task, name=name)

    async def _stop(self, groups: Iterable[str]) -> None:
        """Stop the groups' informers and drop their CRs from the index."""
        keys = [key for key in self._tasks if key[0] in groups]
        try:
            await stop_tasks([self._tasks.pop(key) for key in keys])
        finally:
            for key in keys:
                self.informers.pop(key, None)
            for group in {group for group, _ in keys}:
                self.index.clear(self.kind.resource.plural, group)
