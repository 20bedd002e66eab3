"""One list+watch loop per kind and API group, keeping the CRIndex current the way client-go's
reflector does.

- List (streamed, or paged), replace the kind's entries, then watch from the list's
  resourceVersion with bookmarks and a randomised server timeout.
- A normal close or a lost connection re-watches from the last resourceVersion (after a backoff
  if it ended at once); 410 Gone/Expired relists at once (the API server answered: nothing to
  wait for); an unknown error relists after a backoff; 429 waits for Retry-After and re-watches.
- The backoff (slo_api.recovery) is reset by any answer: a list, a watch that opens and lives,
  a 410. A loop asleep in it during an outage is woken when the API server answers again.
- No bytes for `watch_inactivity_seconds` (bookmarks arrive about every minute) reconnects, so a
  silently dead connection heals; a watch that is not even accepted in time backs off.
- A CRD that is not served (404 without a JSON Status) leaves the group's copies empty but
  synced, and is looked up again every `crd_recheck_seconds` (slo_api.groups also stops the loop
  once discovery agrees the group is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from slo_api.index import CRIndex, Name
from slo_api.kinds.base import Obj
from slo_api.kube import Kube, KubeError, KubeTimeout, KubeUnavailable, Resource, log_failure
from slo_api.metrics import Metrics
from slo_api.recovery import Backoff, Recovery

log = logging.getLogger("slo_api.watch")

INITIAL_EVENTS_END = "k8s.io/initial-events-end"
QUICK_CLOSE_SECONDS = 1.0
# After an API server refused a streamed list (no WatchList feature), lists are paged this
# long before a stream is tried again (the API server may have been upgraded meanwhile).
STREAM_RETRY_SECONDS = 600.0
# What to check when the API server refuses slo-api's lists and watches.
ROLE = (
    "its ClusterRole (or with WATCH_NAMESPACES, its Role in the namespace) grants get, list, "
    "watch and patch"
)


async def _sleep(seconds: float) -> None:
    # Every sleep of the loop goes through here (tests put a fake clock behind it).
    await asyncio.sleep(seconds)


class Watched(Protocol):
    """What an informer watches: a name for its metrics and logs, and where it lives (a Kind,
    or any other resource slo-api reads, such as the guardrails' parameters)."""

    @property
    def name(self) -> str: ...

    @property
    def resource(self) -> Resource: ...


class Held(Protocol):
    """What a store keeps of one object, made as a list is read."""

    @property
    def name(self) -> Name: ...


class Store(Protocol):
    """Where an informer keeps what it lists and watches: the CRIndex for the route kinds, or a
    store of its own for what else slo-api reads (it keeps only what it needs of each)."""

    def entry(self, plural: str, obj: Obj, group: str | None = None) -> Held: ...

    def reached(self, plural: str, group: str, namespace: str | None, rv: str | None) -> None: ...

    async def replace_in_turns(
        self,
        plural: str,
        objs: Iterable[Any],
        group: str | None = None,
        namespace: str | None = None,
    ) -> None: ...

    def upsert(self, plural: str, obj: Obj, group: str | None = None) -> bool: ...

    def delete(self, plural: str, obj: Obj, group: str | None = None) -> bool: ...

    def clear(
        self, plural: str, group: str | None = None, namespace: str | None = None
    ) -> None: ...


@dataclass(frozen=True)
class Loops:
    """What every list+watch loop of a process is given: the seam, the index the loops fill,
    the metrics, and their pacing (from the settings)."""

    kube: Kube
    index: CRIndex
    metrics: Metrics
    # How often a CRD that is not served is looked for again.
    crd_recheck_seconds: float = 60.0
    # A watch's server-side timeout is randomised between this and twice this.
    watch_timeout_seconds: int = 300
    # A watch without an event or bookmark this long is reconnected.
    inactivity_seconds: float = 90.0


class _Relist(Exception):
    """The watch cannot resume: list again. `reason` labels the restart metric."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class _CrdGone(Exception):
    """The kind is not served any more."""


class Informer:
    """The kind's CRs under one API group (`resource`; the kind's preferred one by default),
    in one namespace or all of them, those a label selector selects or all of them."""

    def __init__(
        self,
        loops: Loops,
        kind: Watched,
        *,
        store: Store | None = None,
        resource: Resource | None = None,
        namespace: str | None = None,
        label_selector: str = "",
        on_synced: Callable[[], None] | None = None,
        recovery: Recovery | None = None,
    ) -> None:
        self.loops = loops
        self.kube, self.metrics = loops.kube, loops.metrics
        self.index: Store = loops.index if store is None else store
        self.kind = kind
        self.resource = resource or kind.resource
        self.group = self.resource.group
        self.namespace = namespace
        self.label_selector = label_selector
        # Called after each list, and each time the CRD is found absent.
        self.on_synced = on_synced or (lambda: None)
        self.synced = False
        self.present = False
        # True from a list (or the CRD found absent) or a watch that opened, until a failure:
        # while False the index may be behind the API server (what `stale` reports).
        self.current = False
        self.last_event: float | None = None
        self.backoff = Backoff()
        # Shared by every loop of the process (see Recovery); without one, plain sleeps.
        self.recovery = recovery or Recovery(None, sleep=_sleep)
        # Lists are streamed unless the API server refused a stream lately; the next list
        # pages after a 410.
        self._streams_refused_at: float | None = None
        self._page_next = False
        # A 410 relists at once; one straight after that relist backs off (no hot loop).
        self._relisted_at_once = False
        self._plural = self.resource.plural
        # How logs name what this loop watches (its own and its owner's): `plural.group`, as
        # kubectl does (`namespaces` for the core group), and the namespace when it watches one.
        self.name = ".".join(filter(None, (self.resource.plural, self.group))) + (
            f" in {namespace}" if namespace else ""
        )

    @property
    def streams(self) -> bool:
        """Whether the next list (unless it follows a 410) is streamed."""
        refused = self._streams_refused_at
        return refused is None or time.monotonic() - refused >= STREAM_RETRY_SECONDS

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                resource_version = await self._list()
                if resource_version is None:
                    await _sleep(self.loops.crd_recheck_seconds)
                    continue
                await self._watch(resource_version)
            except asyncio.CancelledError:
                raise
            except _CrdGone:
                log.warning("%s: the CRD is no longer served; its routes are gone", self.name)
                self._absent()
                await _sleep(self.loops.crd_recheck_seconds)
            except _Relist as exc:
                self.current = False
                self.metrics.watch_restarts.labels(self.kind.name, exc.reason).inc()
                # After a 410 the watch cache could not serve our version: list from etcd
                # in pages, as client-go does, rather than stream from that same cache.
                self._page_next = exc.reason == "expired"
                if exc.reason == "expired" and not self._relisted_at_once:
                    # The API server answered: it is there, so relist now, not after the
                    # backoff an outage grew (a restarted API server answers 410).
                    log.info("%s: relisting at once (%s)", self.name, exc)
                    self.backoff.reset()
                    self._relisted_at_once = True
                    continue
                delay = self.backoff.next()
                log.info("%s: relisting in %.1fs (%s)", self.name, delay, exc)
                await self._pause(delay)
            except KubeError as exc:
                self.current = False
                self.metrics.watch_restarts.labels(self.kind.name, "error").inc()
                delay = exc.retry_after or self.backoff.next()
                log_failure(
                    log, exc, f"the list/watch of {self.name}", ROLE, f"; retrying in {delay:.1f}s"
                )
                if exc.retry_after:
                    await _sleep(delay)  # the API server said how long: no probe needed
                else:
                    await self._pause(delay)
            except Exception:
                self.current = False
                delay = self.backoff.next()
                self.metrics.task_failures.labels(self.kind.name, "informer").inc()
                log.exception("%s: unexpected failure; relisting in %.1fs", self.name, delay)
                await self._pause(delay)

    def _server_timeout(self) -> int:
        # Randomised, as client-go's reflector does: the watches of many replicas (and kinds)
        # do not all end and reconnect at once.
        timeout = self.loops.watch_timeout_seconds
        return random.randint(timeout, 2 * timeout)

    async def _pause(self, delay: float) -> None:
        """Back off, unless the API server answers again first (then start afresh)."""
        if await self.recovery.pause(delay):
            self.backoff.reset()

    def _answered(self) -> None:
        """The API server answered (a list, a watch that opened): the backoff starts over."""
        self.backoff.reset()
        self.current = True

    def _absent(self) -> None:
        self.index.clear(self._plural, self.group, self.namespace)
        self.present = False
        self.synced = True
        self._answered()
        self.on_synced()

    async def _list(self) -> str | None:
        """List every CR of the kind; None when the CRD is not served.

        Streamed through a watch (sendInitialEvents) where the API server supports it, so
        neither side holds the whole list at once; in pages otherwise, and after a 410.
        """
        try:
            if self.streams and not self._page_next:
                try:
                    return await self._stream_list()
                except KubeError as exc:
                    if exc.status not in (400, 422):
                        raise
                    # An API server without the WatchList feature refuses the parameter: page
                    # for a while, then try again (it may be upgraded; one 400 may be chance).
                    log.info(
                        "%s: lists are not streamed here (%s); paging for %gs",
                        self.name,
                        exc,
                        STREAM_RETRY_SECONDS,
                    )
                    self._streams_refused_at = time.monotonic()
            return await self._page_list()
        except KubeError as exc:
            if exc.status == 404 and not exc.is_status:
                if self.present or not self.synced:
                    log.warning(
                        "%s: CRD not served; indexing the kind as empty and looking again "
                        "every %gs",
                        self.name,
                        self.loops.crd_recheck_seconds,
                    )
                self._absent()
                return None
            raise

    async def _stream_list(self) -> str:
        # Every event before the initial-events-end bookmark applies, as in client-go's watch
        # list: an API server may interleave MODIFIED or DELETED with the ADDED ones.
        entries: dict[Name, Held] = {}
        events = self.kube.watch(
            self.resource,
            resource_version="",
            timeout_seconds=self._server_timeout(),
            read_timeout=self.loops.inactivity_seconds,
            initial_events=True,
            namespace=self.namespace,
            label_selector=self.label_selector,
        )
        async with contextlib.aclosing(events):
            async for event in events:
                obj = event.get("object")
                if not isinstance(obj, dict):
                    continue
                kind = event.get("type")
                if kind in ("ADDED", "MODIFIED"):
                    # Compact at once: the stream is never held decoded.
                    entry = self.index.entry(self._plural, obj, self.group)
                    entries[entry.name] = entry
                elif kind == "DELETED":
                    entries.pop(self.index.entry(self._plural, obj, self.group).name, None)
                elif kind == "BOOKMARK":
                    meta = obj.get("metadata") or {}
                    if (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                        return await self._listed(
                            list(entries.values()), str(meta.get("resourceVersion") or "")
                        )
        raise _Relist("relist", "the list stream ended before its initial events did")

    async def _page_list(self) -> str:
        items: list[Held] = []
        continue_: str | None = None
        while True:
            try:
                page = await self.kube.list(
                    self.resource,
                    continue_=continue_,
                    namespace=self.namespace,
                    label_selector=self.label_selector,
                )
            except KubeError as exc:
                if exc.status == 410 and continue_:
                    items, continue_ = [], None  # the continue token expired: start over
                    continue
                raise
            # Each page is made compact (the index's encoded entries, without managedFields)
            # before the next is read: a long list never holds every CR decoded at once.
            items.extend(
                self.index.entry(self._plural, obj, self.group) for obj in page.get("items") or []
            )
            meta = page.get("metadata") or {}
            continue_ = meta.get("continue") or None
            if not continue_:
                break
        return await self._listed(items, str(meta.get("resourceVersion") or ""))

    async def _listed(self, items: list[Held], resource_version: str) -> str:
        """The kind's CRs under this group are `items` as of `resource_version`."""
        self._page_next = False
        self._answered()
        self.index.reached(self._plural, self.group, self.namespace, resource_version)
        # In turns of the loop: a relist of 100,000 CRs must not stall every request and stream.
        await self.index.replace_in_turns(self._plural, items, self.group, self.namespace)
        self.metrics.relists.labels(self.kind.name).inc()
        if not self.present:
            log.info("%s: listed %d objects", self.name, len(items))
        self.present = True
        self.synced = True
        self.last_event = time.monotonic()
        self.on_synced()
        return resource_version

    async def _watch(self, resource_version: str) -> None:
        while True:
            started = time.monotonic()
            events = 0
            opened = False

            def open_() -> None:
                nonlocal opened
                opened = True
                self.current = True

            try:
                async for event in self.kube.watch(
                    self.resource,
                    resource_version=resource_version,
                    timeout_seconds=self._server_timeout(),
                    read_timeout=self.loops.inactivity_seconds,
                    namespace=self.namespace,
                    label_selector=self.label_selector,
                    on_open=open_,
                ):
                    if not events:
                        self._answered()
                        self._relisted_at_once = False
                    events += 1
                    resource_version = self._apply(event) or resource_version
            except KubeTimeout as exc:
                if opened:
                    # The watch went silent (a dead connection): reconnect at once.
                    log.warning("%s: %s; reconnecting", self.name, exc.message)
                    self.metrics.watch_restarts.labels(self.kind.name, "inactive").inc()
                    continue
                # Not even accepted in time: an API server that takes connections and never
                # answers must not get a new watch every timeout, for ever.
                self.current = False
                delay = self.backoff.next()
                log.warning("%s: %s; retrying in %.1fs", self.name, exc.message, delay)
                self.metrics.watch_restarts.labels(self.kind.name, "timeout").inc()
                await self._pause(delay)
                continue
            except KubeUnavailable as exc:
                # A dropped or refused connection (an API server restarting, say) says nothing
                # about the index: like client-go, resume from the last resourceVersion. The
                # server replays what was missed, or answers 410 and we relist.
                log.warning(
                    "%s: watch lost (%s); resuming from %s", self.name, exc, resource_version
                )
                ended = "unavailable"
            except KubeError as exc:
                if exc.status == 410:
                    raise _Relist(
                        "expired", f"resourceVersion {resource_version} expired"
                    ) from None
                if exc.status == 404 and not exc.is_status:
                    raise _CrdGone from None
                if exc.status == 429:
                    delay = exc.retry_after or self.backoff.next()
                    self.metrics.watch_restarts.labels(self.kind.name, "throttled").inc()
                    await _sleep(delay)
                    continue
                if exc.rbac:
                    log_failure(log, exc, f"the watch of {self.name}", ROLE)
                raise _Relist("relist", str(exc)) from None
            else:
                ended = "closed"
            # A watch that ends at once with nothing in it (refused, or closed by the server)
            # is a failure in disguise: back off before the next one. One that opened and
            # lived was an answer: the backoff starts over.
            quick = events == 0 and time.monotonic() - started < QUICK_CLOSE_SECONDS
            if quick and ended == "closed":
                ended = "quick-close"
            self.metrics.watch_restarts.labels(self.kind.name, ended).inc()
            if quick:
                self.current = False
                await self._pause(self.backoff.next())
            elif opened:
                self._answered()
                self._relisted_at_once = False

    def _apply(self, event: Obj) -> str | None:
        kind = str(event.get("type"))
        obj = event.get("object")
        if not isinstance(obj, dict):
            return None
        self.last_event = time.monotonic()
        self.metrics.watch_events.labels(self.kind.name, kind.lower()).inc()
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        # Where this informer is in the cluster's history (a bookmark too): change streams'
        # revisions are built from it.
        self.index.reached(self._plural, self.group, self.namespace, str(rv) if rv else None)
        if kind in ("ADDED", "MODIFIED"):
            self.index.upsert(self._plural, obj, self.group)
        elif kind == "DELETED":
            self.index.delete(self._plural, obj, self.group)
        return str(rv) if rv else None
