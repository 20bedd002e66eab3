"""CRIndex: every watched CR in memory, keyed by (plural, namespace, name), with routes beside.

Readers resolve a route name to the CRs that claim it and page through route names in sorted
order; the watch loops and the write path keep it current. All of it runs on one event loop,
so no locks: each method leaves the index consistent before it returns.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str]
Name = tuple[str, str]
Listener = Callable[[set[str]], None]

log = logging.getLogger("slo_api.index")


@dataclass(frozen=True)
class IndexedKind:
    """What the index needs to know about a kind: its name, plural and how to read a route."""

    name: str
    plural: str
    route_of: Callable[[Obj], str]
    members_of: Callable[[Obj], list[str]] | None = None


def _rv(obj: Obj) -> int | None:
    value = obj.get("metadata", {}).get("resourceVersion", "")
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _uid(obj: Obj) -> str | None:
    uid = obj.get("metadata", {}).get("uid")
    return uid if isinstance(uid, str) else None


def _name(obj: Obj) -> Name:
    meta = obj.get("metadata", {})
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def slim(obj: Obj) -> Obj:
    """The object as the index keeps it: without managedFields, which nobody here reads."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


class _SortedNames:
    """Sorted, duplicate-free route names: O(log n) lookups, cheap pages at any offset."""

    # Above this many changes in one go, one sort beats inserting each name into the list
    # (every insert moves the tail: a relist of 50,000 routes would move ~10^9 pointers).
    BULK = 64

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, name: str) -> None:
        at = bisect.bisect_left(self.items, name)
        if at == len(self.items) or self.items[at] != name:
            self.items.insert(at, name)

    def discard(self, name: str) -> None:
        at = bisect.bisect_left(self.items, name)
        if at < len(self.items) and self.items[at] == name:
            del self.items[at]

    def update(self, add: list[str], remove: list[str]) -> None:
        if len(add) + len(remove) <= self.BULK:
            for name in remove:
                self.discard(name)
            for name in add:
                self.add(name)
            return
        names = set(self.items)
        names.difference_update(remove)
        names.update(add)
        # A new list, not an in-place change: a caller that holds the old one keeps a
        # consistent (if stale) view.
        self.items = sorted(names)


class CRIndex:
    def __init__(self, kinds: Iterable[IndexedKind]) -> None:
        self.kinds = {k.plural: k for k in kinds}
        self._objects: dict[str, dict[Name, Obj]] = {p: {} for p in self.kinds}
        self._claims: dict[str, set[Key]] = {}
        self._members: dict[tuple[str, str], set[Key]] = {}
        self._all = _SortedNames()
        self._by_kind = {k.name: _SortedNames() for k in self.kinds.values()}
        # Routes whose claims changed since the sorted lists were last brought up to date.
        self._touched: set[str] = set()
        # Values derived from a route's CRs (its /config line, say), by view then route, so
        # reads do not rebuild them per request. A route's entries are dropped whenever a CR
        # that claims it, or a pool that lists it as a member, is stored or removed.
        self._rendered: dict[str, dict[str, Any]] = {}
        self.generation = 0
        # Routes whose rendered values were dropped since listeners were last told.
        self._changed: set[str] = set()
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(routes)` after each change with the routes whose derived values
        (their /config lines) may have changed: exactly those whose cached renders it drops."""
        self._listeners.append(listener)

    # -- reads -----------------------------------------------------------------------------

    def get(self, plural: str, namespace: str, name: str) -> Obj | None:
        return self._objects[plural].get((namespace, name))

    def claims(self, route: str) -> list[tuple[str, Obj]]:
        """The (plural, object) pairs that claim a route, in a stable order."""
        return [
            (plural, self._objects[plural][(ns, name)])
            for plural, ns, name in sorted(self._claims.get(route, ()))
        ]

    def routes(self, kind: str | None = None) -> list[str]:
        """Route names in sorted order, all or those claimed by a kind (not a copy)."""
        return (self._all if kind is None else self._by_kind[kind]).items

    def count(self, plural: str) -> int:
        return len(self._objects[plural])

    def objects(self, plural: str) -> list[Obj]:
        return list(self._objects[plural].values())

    def rendered(self, view: str, route: str, render: Callable[[str], Any]) -> Any:
        """`render(route)`, computed once and kept until the route's CRs or pools change.

        `render` must depend only on what the index holds for the route: the CRs claiming it
        and the pools (same namespace) listing it as a member.
        """
        cache = self._rendered.get(view)
        if cache is None:
            cache = self._rendered[view] = {}
        try:
            return cache[route]
        except KeyError:
            value = cache[route] = render(route)
            return value

    def groups_with_member(self, namespace: str, member: str) -> list[tuple[str, Obj]]:
        """Objects (pools) in a namespace that list `member` among their members."""
        return [
            (plural, self._objects[plural][(ns, name)])
            for plural, ns, name in sorted(self._members.get((namespace, member), ()))
        ]

    # -- writes ----------------------------------------------------------------------------

    def upsert(self, plural: str, obj: Obj) -> bool:
        """Store an object from a watch event unless the index already has a newer one."""
        name = _name(obj)
        old = self._objects[plural].get(name)
        if old is not None and _uid(old) == _uid(obj):
            old_rv, new_rv = _rv(old), _rv(obj)
            if old_rv is not None and new_rv is not None and new_rv < old_rv:
                return False
        self._store(plural, name, slim(obj))
        self._settle()
        return True

    def write_through(self, plural: str, obj: Obj) -> bool:
        """Store the object a write returned, if the index still holds that same CR.

        A CR that is gone from the index (deleted meanwhile) is not brought back, and one that
        the watch has already moved past is not rolled back.
        """
        name = _name(obj)
        old = self._objects[plural].get(name)
        if old is None or _uid(old) != _uid(obj):
            return False
        return self.upsert(plural, obj)

    def delete(self, plural: str, obj: Obj) -> bool:
        name = _name(obj)
        old = self._objects[plural].get(name)
        if old is None or (_uid(obj) is not None and _uid(old) != _uid(obj)):
            return False
        self._unstore(plural, name)
        self._settle()
        return True

    def replace(self, plural: str, objs: Iterable[Obj]) -> None:
        """Make a kind hold exactly `objs` (after a relist); other kinds are untouched."""
        fresh = {_name(o): slim(o) for o in objs}
        for name in [n for n in self._objects[plural] if n not in fresh]:
            self._unstore(plural, name)
        for name, obj in fresh.items():
            self._store(plural, name, obj)
        # The sorted route lists once for the whole relist, not once per object.
        self._settle()

    def clear(self, plural: str) -> None:
        self.replace(plural, ())

    # -- bookkeeping -----------------------------------------------------------------------

    def _store(self, plural: str, name: Name, obj: Obj) -> None:
        kind = self.kinds[plural]
        old = self._objects[plural].get(name)
        key = (plural, *name)
        if old is not None:
            self._unlink(kind, key, old)
        self._objects[plural][name] = obj
        self._link(kind, key, obj)
        self.generation += 1

    def _unstore(self, plural: str, name: Name) -> None:
        old = self._objects[plural].pop(name, None)
        if old is not None:
            self._unlink(self.kinds[plural], (plural, *name), old)
            self.generation += 1

    def _forget(self, route: str) -> None:
        for cache in self._rendered.values():
            cache.pop(route, None)
        self._changed.add(route)

    def _publish(self) -> None:
        if not self._changed:
            return
        changed, self._changed = self._changed, set()
        for listener in self._listeners:
            try:
                listener(changed)
            except Exception:
                # A listener's bug must not leave the index half-updated for everyone else.
                log.exception("index listener failed")

    def _link(self, kind: IndexedKind, key: Key, obj: Obj) -> None:
        route = kind.route_of(obj)
        if route:
            self._claims.setdefault(route, set()).add(key)
            self._touched.add(route)
            self._forget(route)
        if kind.members_of is not None:
            for member in kind.members_of(obj):
                self._members.setdefault((key[1], member), set()).add(key)
                self._forget(member)

    def _unlink(self, kind: IndexedKind, key: Key, obj: Obj) -> None:
        route = kind.route_of(obj)
        claims = self._claims.get(route)
        if claims is not None:
            claims.discard(key)
            if not claims:
                del self._claims[route]
            self._touched.add(route)
            self._forget(route)
        if kind.members_of is not None:
            for member in kind.members_of(obj):
                self._forget(member)
                holders = self._members.get((key[1], member))
                if holders is not None:
                    holders.discard(key)
                    if not holders:
                        del self._members[(key[1], member)]

    def _settle(self) -> None:
        """Bring the sorted route lists up to date, then tell the listeners what changed."""
        self._sort_touched()
        self._publish()

    def _sort_touched(self) -> None:
        """Bring the sorted route lists in line with the claims of every touched route.

        A route is listed while any CR claims it, and under a kind while a CR of that kind
        claims it.
        """
        if not self._touched:
            return
        touched, self._touched = self._touched, set()
        present: list[str] = []
        gone: list[str] = []
        per_kind: dict[str, tuple[list[str], list[str]]] = {
            name: ([], []) for name in self._by_kind
        }
        for route in touched:
            claims = self._claims.get(route)
            (present if claims else gone).append(route)
            kinds = {self.kinds[p].name for p, _, _ in claims} if claims else set()
            for name, (add, remove) in per_kind.items():
                (add if name in kinds else remove).append(route)
        self._all.update(present, gone)
        for name, (add, remove) in per_kind.items():
            self._by_kind[name].update(add, remove)
