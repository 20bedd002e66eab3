"""`GET /config` for a caller who may list some namespaces only (a Kubernetes identity).

The allowed (kind, namespace) pairs are worked out once per request (by the Authorizer, from
the namespaces and API groups `held` names); the routes they let the
caller see, and the pages built from them, are kept until the index next changes, so a caller
polling its pages pays a few dictionary look-ups, as a static-token caller does.
"""

from __future__ import annotations

from collections.abc import Callable

from slo_api.bounded import BoundedDict
from slo_api.index import CRIndex
from slo_api.service import Allowed, Service, weak_etag

ROUTE_LISTS = 64
PAGES = 256


class VisiblePages:
    def __init__(self, service: Service, index: CRIndex) -> None:
        self.service = service
        self.index = index
        self._plural = {k.name: p for p, k in service.kinds.items()}
        self._name = {p: k.name for p, k in service.kinds.items()}
        self._generation = -1
        self._held: dict[str, dict[str, frozenset[str]]] = {}
        self._everything: Allowed = frozenset()
        self._routes: BoundedDict[tuple[Allowed, str | None], list[str]] = BoundedDict(ROUTE_LISTS)
        self._pages: BoundedDict[tuple[Allowed, int, int, str | None, bool], tuple[bytes, str]] = (
            BoundedDict(PAGES)
        )

    def _follow_index(self) -> None:
        if self._generation == self.index.generation:
            return
        self._generation = self.index.generation
        held: dict[str, dict[str, set[str]]] = {}
        for plural in self.service.kinds:
            spaces = held[self._name[plural]] = {}
            for namespace, group in self.index.placed_groups(plural):
                spaces.setdefault(namespace, set()).add(group)
        self._held = {
            k: {ns: frozenset(groups) for ns, groups in spaces.items()}
            for k, spaces in held.items()
        }
        self._everything = frozenset((k, ns) for k, spaces in self._held.items() for ns in spaces)
        self._routes.clear()
        self._pages.clear()

    def held(self) -> dict[str, dict[str, frozenset[str]]]:
        """By kind name, the namespaces that hold CRs and the API groups of the copies shown
        there: what a caller's `list` is asked about."""
        self._follow_index()
        return self._held

    def page(
        self, allowed: Allowed | None, page: int, page_size: int, kind: str | None, full: bool
    ) -> tuple[bytes, str]:
        """A page of what `allowed` lets a caller see; None: everything (a static token)."""
        self._follow_index()
        if allowed is None or allowed >= self._everything:
            # Sees every namespace there is: the very pages a static token gets.
            return self.service.page(page, page_size, kind, full)
        key = (allowed, page, page_size, kind, full)
        cached = self._pages.get(key)
        if cached is None:
            line = self._line(allowed) if full else None
            body = self.service.render_page(
                self._visible(allowed, kind), page, page_size, full, line
            )
            etag = weak_etag(body)
            cached = self._pages[key] = (body, etag)
        return cached

    def _line(self, allowed: Allowed) -> Callable[[str], bytes]:
        """A route's full item as this caller may see it: a member's `pool` only where the
        caller may list (so read) the pools of the member's namespace."""
        service, claimed_in = self.service, self.index.claimed_in

        def line(route: str) -> bytes:
            return service.line(service.full_view(claimed_in(route), allowed), route)

        return line

    def _visible(self, allowed: Allowed, kind: str | None) -> list[str]:
        """Routes with at least one claiming CR the caller may list (an ambiguous route too)."""
        key = (allowed, kind)
        routes = self._routes.get(key)
        if routes is None:
            seen: set[str] = set()
            for plural, k in self.service.kinds.items():
                for namespace, route in self.index.placed(plural):
                    if (k.name, namespace) in allowed:
                        seen.add(route)
            routes = [route for route in self.index.routes(kind) if route in seen]
            self._routes[key] = routes
        return routes
