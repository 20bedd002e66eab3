"""One list+watch loop per kind and API group, keeping the CRIndex current the way client-go's
reflector does.

- List (paged), replace the kind's entries, then watch from the list's resourceVersion with
  bookmarks and a randomised server timeout.
- A normal close or a lost connection re-watches from the last resourceVersion (after a backoff
  if it ended at once); 410 Gone/Expired or an unknown error relists; 429 waits for Retry-After
  and re-watches.
- No bytes for `watch_inactivity_seconds` (bookmarks arrive about every minute) reconnects, so a
  silently dead connection heals.
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
from collections.abc import Callable
from dataclasses import dataclass

from slo_api.index import CRIndex, Entry
from slo_api.kinds.base import Kind, Obj
from slo_api.kube import Kube, KubeError, KubeTimeout, KubeUnavailable, Resource
from slo_api.metrics import Metrics

log = logging.getLogger("slo_api.watch")

HEALTHY_RESET_SECONDS = 120.0
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
QUICK_CLOSE_SECONDS = 1.0


@dataclass
class Backoff:
    """Capped exponential backoff with jitter; forgets failures after a healthy stretch."""

    initial: float = 0.8
    cap: float = 30.0
    _delay: float = 0.0
    _last_failure: float = 0.0

    def next(self) -> float:
        now = time.monotonic()
        if self._delay and now - self._last_failure > HEALTHY_RESET_SECONDS:
            self._delay = 0.0
        self._delay = min(self.cap, self._delay * 2 if self._delay else self.initial)
        self._last_failure = now
        return self._delay * (1 + random.random())


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
        kube: Kube,
        kind: Kind,
        index: CRIndex,
        metrics: Metrics,
        *,
        crd_recheck_seconds: float,
        watch_timeout_seconds: int,
        inactivity_seconds: float,
        resource: Resource | None = None,
        namespace: str | None = None,
        label_selector: str = "",
        on_synced: Callable[[], None] | None = None,
    ) -> None:
        self.kube = kube
        self.kind = kind
        self.resource = resource or kind.resource
        self.group = self.resource.group
        self.namespace = namespace
        self.label_selector = label_selector
        # Called after each list, and each time the CRD is found absent.
        self.on_synced = on_synced or (lambda: None)
        self.index = index
        self.metrics = metrics
        self.crd_recheck_seconds = crd_recheck_seconds
        self.watch_timeout_seconds = watch_timeout_seconds
        self.inactivity_seconds = inactivity_seconds
        self.synced = False
        self.present = False
        self.last_event: float | None = None
        self.backoff = Backoff()
        # Lists are streamed until the API server refuses it; the next list pages after a 410.
        self.streams = True
        self._page_next = False
        self._plural = self.resource.plural
        # How logs name what this loop watches: `plural.group`, as kubectl does.
        self._name = f"{self.resource.plural}.{self.group}" + (
            f" in {namespace}" if namespace else ""
        )

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                resource_version = await self._list()
                if resource_version is None:
                    await asyncio.sleep(self.crd_recheck_seconds)
                    continue
                await self._watch(resource_version)
            except asyncio.CancelledError:
                raise
            except _CrdGone:
                log.warning("%s: the CRD is no longer served; its routes are gone", self._name)
                self._absent()
                await asyncio.sleep(self.crd_recheck_seconds)
            except _Relist as exc:
                self.metrics.watch_restarts.labels(self.kind.name, exc.reason).inc()
                log.info("%s: relisting (%s)", self._name, exc)
                # After a 410 the watch cache could not serve our version: list from etcd
                # in pages, as client-go does, rather than stream from that same cache.
                self._page_next = exc.reason == "expired"
                await asyncio.sleep(self.backoff.next())
            except KubeError as exc:
                delay = exc.retry_after or self.backoff.next()
                level = logging.ERROR if exc.status in (401, 403) else logging.WARNING
                log.log(
                    level, "%s: list/watch failed (%s); retrying in %.1fs", self._name, exc, delay
                )
                self.metrics.watch_restarts.labels(self.kind.name, "error").inc()
                await asyncio.sleep(delay)
            except Exception:
                delay = self.backoff.next()
                log.exception("%s: unexpected failure; relisting in %.1fs", self._name, delay)
                await asyncio.sleep(delay)

    def _absent(self) -> None:
        self.index.clear(self._plural, self.group, self.namespace)
        self.present = False
        self.synced = True
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
                    # An API server without the WatchList feature refuses the parameter.
                    log.info("%s: lists are not streamed here (%s); paging", self._name, exc)
                    self.streams = False
            return await self._page_list()
        except KubeError as exc:
            if exc.status == 404 and not exc.is_status:
                if self.present or not self.synced:
                    log.warning(
                        "%s: CRD not served; indexing the kind as empty and looking again "
                        "every %gs",
                        self._name,
                        self.crd_recheck_seconds,
                    )
                self._absent()
                return None
            raise

    async def _stream_list(self) -> str:
        entries: list[Entry] = []
        timeout = random.randint(self.watch_timeout_seconds, 2 * self.watch_timeout_seconds)
        events = self.kube.watch(
            self.resource,
            resource_version="",
            timeout_seconds=timeout,
            read_timeout=self.inactivity_seconds,
            initial_events=True,
            namespace=self.namespace,
            label_selector=self.label_selector,
        )
        async with contextlib.aclosing(events):
            async for event in events:
                obj = event.get("object")
                if not isinstance(obj, dict):
                    continue
                if event.get("type") == "ADDED":
                    # Compact at once: the stream is never held decoded.
                    entries.append(self.index.entry(self._plural, obj, self.group))
                elif event.get("type") == "BOOKMARK":
                    meta = obj.get("metadata") or {}
                    if (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                        return self._listed(entries, str(meta.get("resourceVersion") or ""))
        raise _Relist("relist", "the list stream ended before its initial events did")

    async def _page_list(self) -> str:
        items: list[Entry] = []
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
        return self._listed(items, str(meta.get("resourceVersion") or ""))

    def _listed(self, items: list[Entry], resource_version: str) -> str:
        """The kind's CRs under this group are `items` as of `resource_version`."""
        self._page_next = False
        self.index.reached(self._plural, self.group, self.namespace, resource_version)
        self.index.replace(self._plural, items, self.group, self.namespace)
        self.metrics.relists.labels(self.kind.name).inc()
        if not self.present:
            log.info("%s: listed %d objects", self._name, len(items))
        self.present = True
        self.synced = True
        self.last_event = time.monotonic()
        self.on_synced()
        return resource_version

    async def _watch(self, resource_version: str) -> None:
        while True:
            started = time.monotonic()
            events = 0
            timeout = random.randint(self.watch_timeout_seconds, 2 * self.watch_timeout_seconds)
            try:
                async for event in self.kube.watch(
                    self.resource,
                    resource_version=resource_version,
                    timeout_seconds=timeout,
                    read_timeout=self.inactivity_seconds,
                    namespace=self.namespace,
                    label_selector=self.label_selector,
                ):
                    events += 1
                    resource_version = self._apply(event) or resource_version
            except KubeTimeout as exc:
                # Either the watch went silent (a dead connection) or it was not accepted in
                # time; the message says which.
                log.warning("%s: %s; reconnecting", self._name, exc.message)
                self.metrics.watch_restarts.labels(self.kind.name, "inactive").inc()
                continue
            except KubeUnavailable as exc:
                # A dropped or refused connection (an API server restarting, say) says nothing
                # about the index: like client-go, resume from the last resourceVersion. The
                # server replays what was missed, or answers 410 and we relist.
                log.warning(
                    "%s: watch lost (%s); resuming from %s", self._name, exc, resource_version
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
                    await asyncio.sleep(delay)
                    continue
                if exc.status in (401, 403):
                    log.error(
                        "RBAC: the API server refused slo-api's watch of %s (%s); check its "
                        "ClusterRole (or with WATCH_NAMESPACES, its Role in the namespace) "
                        "grants get, list, watch and patch",
                        self._name,
                        exc,
                    )
                raise _Relist("relist", str(exc)) from None
            else:
                ended = "closed"
            # A watch that ends at once with nothing in it (refused, or closed by the server)
            # is a failure in disguise: back off before the next one.
            quick = events == 0 and time.monotonic() - started < QUICK_CLOSE_SECONDS
            if quick and ended == "closed":
                ended = "quick-close"
            self.metrics.watch_restarts.labels(self.kind.name, ended).inc()
            if quick:
                await asyncio.sleep(self.backoff.next())

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
