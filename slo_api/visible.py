"""`GET /config` pages for every caller, kept until the change log next moves.

The change log (slo_api/feed) is the one change signal: its `seq` moves with every change it
publishes in a view it follows, so a page built at one `seq` stays true until the next. The
allowed (kind, namespace) pairs of a caller who may list some namespaces only (a Kubernetes
identity) are worked out once per request (by the Authorizer, from the namespaces and API
groups `held` names); the pages built for them are kept the same way, so a caller polling its
pages pays a few dictionary look-ups, as a static-token caller does. The routes such a caller
may see are kept across changes: each change puts the routes it touched in or out of them, so
no read after a change walks every CR.

An ETag is a hash of the page's bytes: the same content has the same ETag on every replica
(a poller behind a Service gets its 304 from either), and it changes whenever the content does.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any, Protocol

from slo_api.bounded import BoundedDict
from slo_api.index import CRIndex
from slo_api.service import Allowed, Owners, Service, shown, weak_etag

ROUTE_LISTS = 64
PAGES = 256
# Above this many (route, kept list) pairs in one change (a relist), the kept route lists are
# dropped and built again when next read: one walk instead of a long turn of the loop.
MOVES = 20_000
PageKey = tuple[Allowed | None, int, int, str | None, bool]


class Changes(Protocol):
    """What the pages need of the change log."""

    # Moves with every change published in a followed view (and only then).
    seq: int

    def follow(self, view: str) -> None:
        """Publish the changes of `view` from now on."""
        ...


class VisiblePages:
    def __init__(self, service: Service, index: CRIndex, changes: Changes) -> None:
        self.service = service
        self.index = index
        self.changes = changes
        self._name = {p: k.name for p, k in service.kinds.items()}
        # The change log's seq and the index's places_version the caches below were built at.
        self._at = (-1, -1)
        self._full = False  # whether the change log follows the full view yet
        self._held: dict[str, dict[str, frozenset[str]]] = {}
        self._everything: Allowed = frozenset()
        # Sorted, as the index's: the routes a caller may see, by (allowed, kind), kept current
        # by each change (`_claims_changed`).
        self._routes: BoundedDict[tuple[Allowed, str | None], list[str]] = BoundedDict(ROUTE_LISTS)
        self._pages: BoundedDict[PageKey, tuple[bytes, str]] = BoundedDict(PAGES)
        index.subscribe(self._claims_changed)

    def _follow_changes(self) -> None:
        at = (self.changes.seq, self.index.places_version)
        if at == self._at:
            return
        if at[1] != self._at[1]:
            # A namespace or API group got its first CR of a kind or lost its last: rare, and
            # a walk of the places, not of the CRs.
            held: dict[str, dict[str, set[str]]] = {k: {} for k in self._name.values()}
            for plural, namespace, group in self.index.places():
                if plural in self._name:
                    held[self._name[plural]].setdefault(namespace, set()).add(group)
            self._held = {
                k: {ns: frozenset(groups) for ns, groups in spaces.items()}
                for k, spaces in held.items()
            }
            self._everything = frozenset(
                (k, ns) for k, spaces in self._held.items() for ns in spaces
            )
        self._at = at
        self._pages.clear()

    def held(self) -> dict[str, dict[str, frozenset[str]]]:
        """By kind name, the namespaces that hold CRs and the API groups of the copies shown
        there: what a caller's `list` is asked about."""
        self._follow_changes()
        return self._held

    def page(
        self, allowed: Allowed | None, page: int, page_size: int, kind: str | None, full: bool
    ) -> tuple[bytes, str]:
        """A page of what `allowed` lets a caller see; None: everything (a static token)."""
        if full and not self._full:
            # The log follows the full view from its first reader on (rendering every
            # route's full item costs CPU and memory nobody may need): its changes then move
            # `seq` too. Before the page is built, so the page is at a `seq` that covers it.
            self.changes.follow("full")
            self._full = True
        self._follow_changes()
        if allowed is not None and allowed >= self._everything:
            allowed = None  # sees every namespace there is: the very pages a static token gets
        key = (allowed, page, page_size, kind, full)
        cached = self._pages.get(key)
        if cached is None:
            if allowed is None:
                routes, line = self.index.routes(kind), None
            else:
                routes = self._visible(allowed, kind)
                line = self._line(allowed) if full else None
            body = self.service.render_page(routes, page, page_size, full, line)
            etag = weak_etag(body)
            cached = self._pages[key] = (body, etag)
        return cached

    def routes(self, allowed: Allowed | None, kind: str | None) -> tuple[list[str], Any]:
        """The routes `allowed` lets a caller see (None: every one), and a key that names
        this list until a change moves it (what a view built from the list is kept by)."""
        self._follow_changes()
        if allowed is not None and allowed >= self._everything:
            allowed = None
        routes = self.index.routes(kind) if allowed is None else self._visible(allowed, kind)
        return routes, (allowed, kind, self._at)

    def _line(self, allowed: Allowed) -> Callable[[str], bytes]:
        """A route's full item as this caller may see it: a member's `pool` only where the
        caller may list (so read) the pools of the member's namespace."""
        service, claimed_in = self.service, self.index.claimed_in

        def line(route: str) -> bytes:
            return service.line(service.full_view(claimed_in(route), allowed), route)

        return line

    def _visible(self, allowed: Allowed, kind: str | None) -> list[str]:
        """The routes `shown` to a caller: worked out from the CRs in one pass (at 100,000
        CRs about a quarter of the time `shown` takes route by route), then kept."""
        key = (allowed, kind)
        routes = self._routes.get(key)
        if routes is None:
            seen: set[str] = set()  # claimed by at least one CR the caller may list
            for plural, k in self.service.kinds.items():
                for namespace, route in self.index.placed(plural):
                    if (k.name, namespace) in allowed:
                        seen.add(route)
            # ...and by one of the kind asked for.
            routes = [route for route in self.index.routes(kind) if route in seen]
            self._routes[key] = routes
        return routes

    def _shown(self, route: str, allowed: Allowed, kind: str | None) -> bool:
        names = self._name
        owners: Owners = tuple((names[p], ns) for p, ns, _ in self.index.claimants(route))
        return shown(owners, kind, allowed)

    def _claims_changed(self, routes: set[str]) -> None:
        """The index told which routes changed (their claims among them): each kept list
        takes in or lets go of those routes, in their sorted place."""
        if not self._routes:
            return
        if len(routes) * len(self._routes) > MOVES:
            self._routes.clear()
            return
        for (allowed, kind), listed in self._routes.items():
            for route in routes:
                at = bisect.bisect_left(listed, route)
                there = at < len(listed) and listed[at] == route
                if self._shown(route, allowed, kind):
                    if not there:
                        listed.insert(at, route)
                elif there:
                    del listed[at]
