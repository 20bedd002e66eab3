"""CRIndex: every watched CR in memory, keyed by (plural, namespace, name), with routes beside.

Readers resolve a route name to the CRs that claim it and page through route names in sorted
order; the watch loops and the write path keep it current. All of it runs on one event loop,
so no locks: each method leaves the index consistent before it returns.

A kind may be served under several API groups at once (a migration between groups). The index
keeps each group's copy of a (plural, namespace, name) apart and shows exactly one of them: the
copy from the most preferred group present. The others are migration leftovers: stored, counted,
never listed and never a claim on a route.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import logging
import sys
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from slo_api import heap, versions
from slo_api.managed_fields import Fact, entries_of, facts, last_changed, without_managed_fields
from slo_api.packed import Dictionaries, unpack
from slo_api.route_names import valid_route

Obj = dict[str, Any]
Key = tuple[str, str, str]
# The CRs claiming a route, as the index keeps them: most routes have one, held as its key (a
# tuple of one would cost 56 bytes more for each route); several as a tuple of them.
Claims = Key | tuple[Key, ...]
Name = tuple[str, str]
Listener = Callable[[set[str]], None]
# What one informer follows: (plural, API group, namespace or "" for every namespace).
Source = tuple[str, str, str]


def reach(
    positions: dict[Source, int],
    firsts: dict[Source, int],
    source: Source,
    rv: str | None,
    opaque: set[Source],
) -> None:
    """Note that an informer (`source`) reached `rv`: the first position it reached and its
    newest. Only resourceVersions KEP-5504 lets a client compare are positions; an informer
    that meets any other is `opaque` from then on (see slo_api.versions)."""
    if not rv:
        return
    value = versions.number(rv)
    if value is None:
        opaque.add(source)
        return
    firsts.setdefault(source, value)
    if value > positions.get(source, -1):
        positions[source] = value


# Told of every state of a CR the informers observe, and of none a write's answer brings:
# (plural, API group, name, the object as received (managedFields and all), or a relist's
# entry, or None: gone; and the entry the index made of it, to share rather than copy (a
# relist's: the same; None: gone). A relist tells every CR it listed, and every one it found
# gone.
Observed = Callable[[str, str, "Name", "Obj | Entry | None", "Entry | None"], None]

log = logging.getLogger("slo_api.index")


@dataclass(frozen=True)
class IndexedKind:
    """What the index needs to know about a kind: its name, plural and how to read a route."""

    name: str
    plural: str
    route_of: Callable[[Obj], str]
    members_of: Callable[[Obj], list[str]] | None = None
    # API groups in order of preference; a copy from an unlisted group ranks after them.
    groups: tuple[str, ...] = ()

    def rank(self, group: str) -> tuple[int, str]:
        return (self.groups.index(group) if group in self.groups else len(self.groups), group)


def resource_version(obj: Obj) -> str:
    """`metadata.resourceVersion` as the API server sent it ("" when absent): what an ETag
    quotes and a conditional patch carries."""
    value = (obj.get("metadata") or {}).get("resourceVersion", "")
    return value if isinstance(value, str) else str(value)


def uid_of(obj: Obj) -> str | None:
    uid = (obj.get("metadata") or {}).get("uid")
    return uid if isinstance(uid, str) else None


def rv_number(obj: Obj) -> int | None:
    """The resourceVersion as a number, to tell which of two copies of a CR is newer; None
    when KEP-5504 does not let it be compared (see slo_api.versions)."""
    return versions.number(resource_version(obj))


def _newer(held: Entry, listed: Entry) -> bool:
    """Whether the held copy of a CR is a later version than the listed one (the same CR, and
    resourceVersions that compare); when they cannot be compared, it is not: the list, the
    later arrival, wins."""
    return (
        held.uid == listed.uid
        and held.rv is not None
        and listed.rv is not None
        and held.rv > listed.rv
    )


def _name(obj: Obj) -> Name:
    meta = obj.get("metadata", {})
    # Namespaces repeat across many CRs: one string each, not one per CR.
    return sys.intern(str(meta.get("namespace", ""))), str(meta.get("name", ""))


# Changed CRs a relist applies per turn of the event loop (replace_in_turns): about 20 ms of
# it; and the CRs it compares with what is held per turn before it applies any.
REPLACE_TURN = 1000
DIFF_TURN = 10_000
# Entries of a state replaced by a relist's copy let go of per turn (about 4 ms of freeing).
DROP_TURN = 10_000
# Measured bytes per stored CR besides its packed JSON: the entry, its keys and uid, the
# claims and the sorted route lists (see tests/unit/test_index_memory.py: 514 for a CR with
# one manager, 562 with Argo CD's managedFields kept).
ENTRY_OVERHEAD = 515
# Measured bytes per cached render besides its own bytes: the bytes object's header and the
# cache's slot (see tests/unit/test_index_memory.py).
RENDER_OVERHEAD = 56


_NONE = object()
# What a copy of the index built aside holds and gives over when it is swapped in.
_STATE = (
    "_objects",
    "_copies",
    "_claims",
    "_members",
    "_all",
    "_by_kind",
    "_rendered",
    "encoded_bytes",
    "rendered_bytes",
    "counts",
    "_places",
    "_groups_in",
)


def _size(value: Any) -> int:
    """What a cached render holds beyond RENDER_OVERHEAD: its bytes (renders are encoded)."""
    return len(value) if isinstance(value, bytes) else sys.getsizeof(value)


def exact(data: bytes) -> bytes:
    """A copy of `data` that holds only its own bytes.

    orjson's output keeps the encoder's 4 KiB working buffer behind every bytes object it
    returns; kept for each of 100,000 routes that is 400 MiB where the lines need 20.
    """
    return memoryview(data).tobytes()


def _keys(claims: Claims | None) -> tuple[Key, ...]:
    """A route's claims as a tuple of keys (see Claims)."""
    if not claims:
        return ()
    if isinstance(claims[0], str):
        return (claims,)
    return claims


def group_of(obj: Obj) -> str:
    """The API group of an object's apiVersion ("" for the core group or none)."""
    api_version = obj.get("apiVersion")
    if not isinstance(api_version, str) or "/" not in api_version:
        return ""
    return api_version.split("/", 1)[0]


def slim(obj: Obj) -> Obj:
    """The object as the index keeps it: without managedFields, which nobody here reads."""
    return without_managed_fields(obj)


def _managed_apart(obj: Obj) -> tuple[Fact, ...]:
    """What a trimmed object's managedFields are as facts, when they give the very entries
    back (the last key of its metadata, as the trim leaves them); () to keep them in its JSON."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not meta or list(meta)[-1] != "managedFields":
        return ()
    entries = meta["managedFields"]
    if not isinstance(entries, list) or not entries:
        return ()
    if not all(isinstance(e, dict) for e in entries):
        return ()
    return facts(entries) or ()


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

    def _has(self, name: str) -> bool:
        at = bisect.bisect_left(self.items, name)
        return at < len(self.items) and self.items[at] == name

    def discard(self, name: str) -> None:
        at = bisect.bisect_left(self.items, name)
        if at < len(self.items) and self.items[at] == name:
            del self.items[at]

    def update(self, add: list[str], remove: list[str]) -> None:
        if len(add) + len(remove) > self.BULK:
            # A relist touches many routes that stay (new versions): only real moves count.
            add = [name for name in add if not self._has(name)]
            remove = [name for name in remove if self._has(name)]
        if len(add) + len(remove) <= self.BULK:
            for name in remove:
                self.discard(name)
            for name in add:
                self.add(name)
            return
        gone = set(remove)
        kept = [name for name in self.items if name not in gone] if gone else self.items
        # Two sorted runs, which sorted() merges in linear time (sorting the whole set anew
        # took ~65 ms at 100,000 routes). A new list, not an in-place change: a caller that
        # holds the old one keeps a consistent (if stale) view.
        self.items = sorted(kept + sorted(set(add)))

    def copy(self) -> _SortedNames:
        other = _SortedNames()
        other.items = list(self.items)
        return other


class Entry:
    """One stored copy of a CR: the object's JSON, packed (see slo_api.packed), and what the
    index reads of it.

    Kept packed because a decoded CR costs several times its JSON in Python objects, and
    every replica holds every CR: it is unpacked and decoded when a route is read or written.
    """

    __slots__ = (
        "data",
        "dictionary",
        "group",
        "latest",
        "managed",
        "members",
        "name",
        "route",
        "rv",
        "stamp",
        "uid",
    )

    def __init__(
        self,
        name: Name,
        data: bytes,
        group: str,
        uid: str | None,
        rv: int | None,
        route: str,
        members: tuple[str, ...],
        stamp: float = 0.0,
        latest: tuple[str, ...] = (),
        managed: tuple[Fact, ...] = (),
        dictionary: bytes | None = None,
    ) -> None:
        self.name = name
        # The JSON packed with `dictionary` (its kind's, shared), or as it is (None).
        self.data = data
        self.dictionary = dictionary
        self.group = group
        self.uid = uid
        self.rv = rv
        self.route = route
        self.members = members
        # When the object was last changed, as its managedFields (trimmed from `data`) say:
        # which manager makes its next change is told by whose entry is newer than this.
        # A float: 24 bytes where an int of that size takes 32, for every CR held.
        self.stamp = stamp
        self.latest = latest  # the entries stamped then (manager_key)
        # The managedFields the trim kept (the GitOps ownership's), apart from `data` as
        # shared tuples (see managed_fields.facts): their JSON was a fifth of such a CR's.
        self.managed = managed

    def json(self) -> bytes:
        """The object's JSON as stored (managedFields apart)."""
        return self.data if self.dictionary is None else unpack(self.data, self.dictionary)

    def obj(self) -> Obj:
        value: Obj = orjson.loads(self.json())
        if self.managed:
            value["metadata"]["managedFields"] = entries_of(self.managed)
        return value

    def same(self, other: Entry) -> bool:
        if self.group != other.group or self.managed != other.managed:
            return False
        if self.dictionary is other.dictionary:
            # Packing is deterministic: with one dictionary, equal bytes are equal JSON.
            return self.data == other.data
        # Packed with different dictionaries (or one not packed): only the JSON tells.
        return self.json() == other.json()


class CRIndex:
    def __init__(self, kinds: Iterable[IndexedKind], trim: Callable[[Obj], Obj] = slim) -> None:
        self.kinds = {k.plural: k for k in kinds}
        # What of an object is stored: by default without managedFields; the service keeps
        # the GitOps ownership its writes check (see slo_api/ownership.py).
        self._trim = trim
        # The copy shown of each CR: the most preferred group's.
        self._objects: dict[str, dict[Name, Entry]] = {p: {} for p in self.kinds}
        # Every group's copy, only for the CRs held under more than one group (a migration);
        # a CR under one group has just its shown copy.
        self._copies: dict[str, dict[Name, dict[str, Entry]]] = {p: {} for p in self.kinds}
        # Claims as tuples: a set per route would cost more than most CRs' own keys.
        self._claims: dict[str, Claims] = {}
        # Frozen sets, like the claims' tuples: a copy of the index (see _aside) shares them.
        self._members: dict[tuple[str, str], frozenset[Key]] = {}
        self._all = _SortedNames()
        self._by_kind = {k.name: _SortedNames() for k in self.kinds.values()}
        # CRs shown per (plural, namespace, API group): where a caller's access is asked
        # about. Kept as CRs come and go, so a read does not walk them all to find out; and
        # `places_version` moves only when a place appears or goes.
        self._places: Counter[tuple[str, str, str]] = Counter()
        # The same places, as the groups of each (plural, namespace).
        self._groups_in: dict[tuple[str, str], set[str]] = {}
        self.places_version = 0
        # Routes whose claims changed since the sorted lists were last brought up to date.
        self._touched: set[str] = set()
        # Values derived from a route's CRs (its /config line, say), by view then route, so
        # reads do not rebuild them per request. A route's entries are dropped whenever a CR
        # that claims it, or a pool that lists it as a member, is stored or removed.
        self._rendered: dict[str, dict[str, Any]] = {}
        # The dictionary each kind's JSON is packed with. Not part of the state a copy built
        # aside (see _aside) takes over: the copy shares it, so what it packs and compares is
        # packed alike.
        self._dictionaries = Dictionaries()
        # Bytes of packed objects held (every copy), and of cached renders, for the estimate.
        self.encoded_bytes = 0
        self.rendered_bytes = 0
        # Routes whose rendered values were dropped since listeners were last told.
        self._changed: set[str] = set()
        self._listeners: list[Listener] = []
        # The resourceVersion each informer has reached (events, bookmarks, lists) and the
        # first it reached (its first list: nothing before it is known here).
        self.positions: dict[Source, int] = {}
        # Each informer's name, one tuple shared by every change it causes (see _source).
        self._sources: dict[Source, Source] = {}
        self.first_positions: dict[Source, int] = {}
        # Informers that met a resourceVersion KEP-5504 does not let a client compare: where
        # they are cannot be told to another replica (a change stream's revision).
        self.opaque: set[Source] = set()
        # Copies held per informer, and, from each informer's first list, the newest object's
        # resourceVersion and how many it listed: a state another replica names at an older
        # version with as many objects, none newer, is the same state (nothing moved since).
        self.counts: Counter[Source] = Counter()
        self.first_lists: dict[Source, tuple[int, int]] = {}
        # Informers whose relist is being applied (over several turns), and its version.
        self.replacing: dict[Source, int] = {}
        # While listeners run: the source and resourceVersion of what they are told about,
        # and the routes whose copy shown moved to another API group (their renders may be
        # the same bytes, but what a caller's access is asked about is not).
        self.cause: tuple[Source, int] | None = None
        self.moved: frozenset[str] = frozenset()
        self._moved: set[str] = set()
        self._cause: tuple[Source, int] | None = None
        self._observers: list[Observed] = []
        # While a large relist is applied to a copy (see _aside): the changes made here since
        # (plural, name, change), and a future done once the copy is swapped in or dropped.
        self._log: list[tuple[str, Name, dict[str, Entry | None]]] | None = None
        # Meanwhile too: the routes `refresh` dropped the renders of (the copy's are its own).
        self._refreshed: set[str] | None = None
        self._built: asyncio.Future[None] | None = None

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(routes)` after each change with the routes whose derived values
        (their /config lines) may have changed: exactly those whose cached renders it drops."""
        self._listeners.append(listener)

    def reached(self, plural: str, group: str, namespace: str | None, rv: str | None) -> None:
        """An informer reached `rv` (an event, a bookmark or a list), before it applies it."""
        source = (plural, group, namespace or "")
        reach(self.positions, self.first_positions, source, rv, self.opaque)

    def _source(self, plural: str, group: str, namespace: str) -> Source:
        scoped = (plural, group, namespace)
        source = scoped if scoped in self.positions else (plural, group, "")
        # One tuple per informer, not one per event: the change log keeps each change's.
        return self._sources.setdefault(source, source)

    def _caused(self, plural: str, group: str, namespace: str, rv: int | None) -> None:
        # An event's object carries the event's resourceVersion; a write's result its own.
        self._cause = (self._source(plural, group, namespace), rv or 0)

    def on_observed(self, observer: Observed) -> None:
        """Call `observer` for each state the informers observe (see `Observed`), before the
        index stores it and the listeners hear of it."""
        self._observers.append(observer)

    def _observed(
        self,
        plural: str,
        group: str,
        name: Name,
        state: Obj | Entry | None,
        entry: Entry | None = None,
    ) -> None:
        for observer in self._observers:
            try:
                observer(plural, group, name, state, entry)
            except Exception:
                log.exception("index observer failed")

    # -- reads -----------------------------------------------------------------------------

    def get(self, plural: str, namespace: str, name: str) -> Obj | None:
        entry = self._objects[plural].get((namespace, name))
        return entry.obj() if entry is not None else None

    def claims(self, route: str) -> list[tuple[str, Obj]]:
        """The (plural, object) pairs that claim a route, in a stable order."""
        return [
            (plural, self._objects[plural][(ns, name)].obj())
            for plural, ns, name in sorted(_keys(self._claims.get(route)))
        ]

    def claimed_in(self, route: str) -> list[tuple[str, str, str]]:
        """The (plural, namespace, API group of the copy shown) of each CR claiming a route,
        without decoding them."""
        objects = self._objects
        return [
            (plural, ns, objects[plural][(ns, name)].group)
            for plural, ns, name in sorted(_keys(self._claims.get(route)))
        ]

    def claimants(self, route: str) -> tuple[Key, ...]:
        """The (plural, namespace, name) of each CR claiming a route, in no order."""
        return _keys(self._claims.get(route))

    def placed(self, plural: str) -> Iterator[tuple[str, str, str]]:
        """(namespace, API group, route) of every CR of a kind shown, without decoding any."""
        for (namespace, _), entry in self._objects[plural].items():
            yield namespace, entry.group, entry.route

    def groups_in(self, plural: str, namespace: str) -> list[str]:
        """The API groups of the copies of a kind shown in a namespace."""
        return sorted(self._groups_in.get((plural, namespace), ()))

    def places(self) -> Iterable[tuple[str, str, str]]:
        """Each (plural, namespace, API group) that has CRs shown, once: whose rights let a
        caller see them. The same until `places_version` moves."""
        return self._places.keys()

    def routes(self, kind: str | None = None) -> list[str]:
        """Route names in sorted order, all or those claimed by a kind (not a copy)."""
        return (self._all if kind is None else self._by_kind[kind]).items

    def count(self, plural: str) -> int:
        return len(self._objects[plural])

    def estimated_bytes(self) -> int:
        """About what the index holds in memory: the packed objects, their dictionaries and
        cached renders plus a measured cost per stored CR (keys, claims, route lists) and per
        cached render."""
        stored = sum(len(o) for o in self._objects.values())
        renders = sum(len(c) for c in self._rendered.values())
        return (
            self.encoded_bytes
            + self._dictionaries.held_bytes()
            + self.rendered_bytes
            + ENTRY_OVERHEAD * stored
            + RENDER_OVERHEAD * renders
        )

    def leftovers(self, plural: str) -> dict[str, int]:
        """Per group, the copies hidden by a copy of the same CR in a more preferred group."""
        out: dict[str, int] = {}
        visible = self._objects[plural]
        for name, copies in self._copies[plural].items():
            for group, entry in copies.items():
                if entry is not visible.get(name):
                    out[group] = out.get(group, 0) + 1
        return out

    def objects(self, plural: str) -> list[Obj]:
        return [entry.obj() for entry in self._objects[plural].values()]

    def rendered(self, view: str, route: str, render: Callable[[str], Any]) -> Any:
        """`render(route)`, computed once and kept until the route's CRs or pools change.

        `render` must depend only on what the index holds for the route: the CRs claiming it
        and the pools (same namespace) listing it as a member; or on what `refresh` is called
        for when it changes (the limits of its namespace).
        """
        cache = self._rendered.get(view)
        if cache is None:
            cache = self._rendered[view] = {}
        try:
            return cache[route]
        except KeyError:
            value = render(route)
            cache[route] = value = exact(value) if isinstance(value, bytes) else value
            self.rendered_bytes += _size(value)
            return value

    def groups_with_member(self, namespace: str, member: str) -> list[tuple[str, Obj]]:
        """Objects (pools) in a namespace that list `member` among their members."""
        return [
            (plural, self._objects[plural][(ns, name)].obj())
            for plural, ns, name in sorted(self._members.get((namespace, member), ()))
        ]

    # -- writes ----------------------------------------------------------------------------
    #
    # `group` is the API group the object was read from; by default that of its apiVersion.

    def entry(self, plural: str, obj: Obj, group: str | None = None) -> Entry:
        """The compact form in which the index keeps `obj` (trimmed: see __init__)."""
        kind = self.kinds[plural]
        stamp, latest = last_changed(obj)
        obj = self._trim(obj)
        name = _name(obj)
        group = group_of(obj) if group is None else group
        route = kind.route_of(obj)
        uid = uid_of(obj)
        # Each event decodes the CR's strings anew: the copy held already gives its own, so
        # the index, the history and the change log keep one name, uid and route per CR, not
        # one per version seen.
        shown = self._objects[plural].get(name)
        if shown is not None:
            name = shown.name
            route = shown.route if shown.route == route else route
            uid = shown.uid if shown.uid == uid else uid
        managed = _managed_apart(obj)
        rv = rv_number(obj)
        json = orjson.dumps(without_managed_fields(obj) if managed else obj)
        held = self._held(plural, name).get(group) if rv is not None else None
        if held is not None and held.rv == rv and held.json() == json:
            # The version held, listed again (a relist finds most CRs as they were): its
            # packed bytes are shared, not packed anew (unpacking costs a fifth of packing).
            data, dictionary = held.data, held.dictionary
        else:
            data, dictionary = self._dictionaries.packed(plural, json)
            # Packed bytes are a copy of their own already; JSON kept as it is may not be.
            data = data if dictionary is not None else exact(data)
        return Entry(
            name,
            data,
            group,
            uid,
            rv,
            # Most routes are named as their CR: one string for both.
            name[1] if route == name[1] else route,
            tuple(kind.members_of(obj)) if kind.members_of is not None else (),
            float(stamp),
            latest,
            managed,
            dictionary,
        )

    def upsert(
        self, plural: str, obj: Obj, group: str | None = None, *, observed: bool = True
    ) -> bool:
        """Store an object from a watch event (`observed`; else a write's answer) unless the
        index already has a newer one."""
        group = group_of(obj) if group is None else group
        entry = self.entry(plural, obj, group)
        name = entry.name
        if observed:
            # Even when the index holds a newer write's answer: the informers' sequence of
            # states is what a route's history is made of. Before the listeners hear of it:
            # the change stream reads who made it.
            self._observed(plural, group, name, obj, entry)
        old = self._held(plural, name).get(group)
        if (
            old is not None
            and old.uid == entry.uid
            and old.rv is not None
            and entry.rv is not None
            and entry.rv < old.rv
        ):
            return False
        self._caused(plural, group, name[0], entry.rv)
        self._change(plural, name, {group: entry})
        self._settle()
        return True

    def write_through(self, plural: str, obj: Obj) -> bool:
        """Store the object a write returned, if the index still holds that same CR.

        A CR that is gone from the index (deleted meanwhile) is not brought back, and one that
        the watch has already moved past is not rolled back. Where the two resourceVersions
        cannot be compared, nothing is stored: the watch delivers that version anyway.
        """
        group = group_of(obj)
        old = self._held(plural, _name(obj)).get(group)
        if old is None or old.uid != uid_of(obj) or old.rv is None or rv_number(obj) is None:
            return False
        return self.upsert(plural, obj, group, observed=False)

    def delete(self, plural: str, obj: Obj, group: str | None = None) -> bool:
        group = group_of(obj) if group is None else group
        name = _name(obj)
        self._observed(plural, group, name, None)
        old = self._held(plural, name).get(group)
        uid = uid_of(obj)
        if old is None or (uid is not None and old.uid != uid):
            return False
        self._caused(plural, group, name[0], rv_number(obj))
        self._change(plural, name, {group: None})
        self._settle()
        return True

    def replace(
        self,
        plural: str,
        objs: Iterable[Obj | Entry],
        group: str | None = None,
        namespace: str | None = None,
    ) -> None:
        """Make a kind's copies from `group` exactly `objs` (after a relist of that group).

        Without a group, the kind as a whole holds exactly `objs` afterwards, each under the
        group of its apiVersion. With a namespace, only the copies in that namespace are
        replaced (a relist of one watched namespace). Other kinds, and the kind's other groups
        and namespaces, are untouched. `objs` may be entries made by `entry()` (a list builds
        them as it reads).
        """
        for _ in self._replacing(plural, objs, group, namespace):
            pass

    async def replace_in_turns(
        self,
        plural: str,
        objs: Iterable[Obj | Entry],
        group: str | None = None,
        namespace: str | None = None,
    ) -> None:
        """`replace` over several turns of the event loop: a relist of 100,000 CRs does not
        stall it, and readers see the kind as it was until the relist is applied, then as
        listed. It compares first, then applies: one that changes at most `REPLACE_TURN` CRs
        in one step; a larger one on a copy of the index built aside, `REPLACE_TURN` changed
        CRs a turn, and swapped in at once (what changed meanwhile is applied to the copy
        first). The change log stands before the relist until it is applied (`replacing`).
        The collector runs between turns only (see heap)."""
        steps = self._replacing(plural, objs, group, namespace, in_turns=True)
        holding = False
        try:
            for turn, other in enumerate(steps):
                if not holding:  # only a relist that takes more than one turn
                    heap.hold()
                    holding = True
                if other is None:
                    await asyncio.sleep(0)
                else:  # after another relist's copy is swapped in (waiting does not cancel it)
                    await asyncio.wait([other])
                heap.between_turns(turn)
        finally:
            steps.close()  # cancelled half way: nothing of it is applied
            if holding:
                heap.release()

    def _replacing(
        self,
        plural: str,
        objs: Iterable[Obj | Entry],
        group: str | None,
        namespace: str | None,
        in_turns: bool = False,
    ) -> Generator[asyncio.Future[None] | None, None, None]:
        entries = [
            item if isinstance(item, Entry) else self.entry(plural, item, group) for item in objs
        ]
        newest = max((entry.rv or 0 for entry in entries), default=0)
        listed = {(entry.name, entry.group) for entry in entries}
        # A relist: what it finds gone vanished at some point up to the list's version.
        source = (plural, group or "", namespace or "")
        cause = (source, self.positions.get(source, newest))
        names = list(self._objects[plural])
        self.replacing[source] = cause[1]
        target = self
        try:
            # First what differs from what is held, compared DIFF_TURN a turn and applied only
            # once all of it is known. Three lists, not a tuple per change: fewer objects for
            # the collector to scan.
            names_changed: list[Name] = []
            groups_changed: list[str] = []
            listed_changed: list[Entry | None] = []
            compared = 0
            for entry in entries:
                self._observed(plural, entry.group, entry.name, entry, entry)
                kept = self._held(plural, entry.name).get(entry.group)
                if kept is None or not (kept.same(entry) or _newer(kept, entry)):
                    names_changed.append(entry.name)
                    groups_changed.append(entry.group)
                    listed_changed.append(entry)
                compared += 1
                if compared % DIFF_TURN == 0:
                    yield None
            for name in names:
                if namespace is None or name[0] == namespace:
                    for g in self._held(plural, name):
                        if (group is None or g == group) and (name, g) not in listed:
                            self._observed(plural, g, name, None)
                            names_changed.append(name)
                            groups_changed.append(g)
                            listed_changed.append(None)
                compared += 1
                if compared % DIFF_TURN == 0:
                    yield None
            if in_turns and len(names_changed) > REPLACE_TURN:
                while self._built is not None:  # one copy aside at a time
                    yield self._built
                target = self._aside()
            # Each chunk builds only its own changes: few objects live at once for the
            # collector to scan (a full collection over a relist's worth of them stalls the
            # loop too).
            for start in range(0, len(names_changed), REPLACE_TURN):
                chunk: dict[Name, dict[str, Entry | None]] = {}
                end = start + REPLACE_TURN
                for name, g, listed_entry in zip(
                    names_changed[start:end],
                    groups_changed[start:end],
                    listed_changed[start:end],
                    strict=True,
                ):
                    kept = target._held(plural, name).get(g)
                    if listed_entry is not None and kept is not None and _newer(kept, listed_entry):
                        # A write-through newer than the list (a PATCH answered while it was
                        # read, or since): kept; the watch delivers it anyway.
                        listed_entry = kept
                    chunk.setdefault(name, {})[g] = listed_entry
                for name, change in chunk.items():
                    target._change(plural, name, change)
                if target is not self:
                    # The copy's route lists once per turn, not once per object (or all at
                    # the end: sorting 100,000 new names at once is a stall of its own).
                    target._sort_touched()
                    yield None
            replaced: list[dict[Any, Any]] = []
            if target is not self:
                replaced = self._swap(target, (plural, group, namespace, cause[1]))
                self._end_aside()
            del self.replacing[source]
            if source not in self.first_lists:
                self.first_lists[source] = (newest, self.counts[source])
            self._cause = cause
            self._settle()
            # What the copy replaced is let go of DROP_TURN entries a turn: freeing the
            # entries of 100,000 CRs at once is a stall of ~40 ms.
            for held in replaced:
                while held:
                    for _ in range(min(DROP_TURN, len(held))):
                        held.popitem()
                    yield None
        finally:
            self.replacing.pop(source, None)
            if target is not self:
                self._end_aside()

    def _aside(self) -> CRIndex:
        """A copy of the index to apply a large relist to while readers keep this one.

        Shallow where it can be: entries, claims and members are never changed in place, so
        the copy shares them; the dicts and lists that hold them are its own. From here on
        every change made to this index is noted (`_log`) to be made to the copy as well.
        """
        other = copy.copy(self)
        other._objects = {p: dict(held) for p, held in self._objects.items()}
        other._copies = {p: dict(held) for p, held in self._copies.items()}
        other._claims = dict(self._claims)
        other._members = dict(self._members)
        other._all = self._all.copy()
        other._by_kind = {name: names.copy() for name, names in self._by_kind.items()}
        other._rendered = {view: dict(cache) for view, cache in self._rendered.items()}
        other.counts = Counter(self.counts)
        other._places = Counter(self._places)
        other._groups_in = {place: set(groups) for place, groups in self._groups_in.items()}
        other._touched, other._changed, other._moved = set(), set(), set()
        other._listeners, other._observers = [], []
        other._log, other._built, other._refreshed = None, None, None
        self._log, self._refreshed = [], set()
        self._built = asyncio.get_running_loop().create_future()
        return other

    def _swap(
        self, other: CRIndex, relist: tuple[str, str | None, str | None, int]
    ) -> list[dict[Any, Any]]:
        """Make the changes noted since `other` was copied to it, then take its state; the
        large dicts of the state replaced are returned, to be let go of in turns."""
        plural, group, namespace, version = relist
        for p, name, change in self._log or ():
            if p == plural and (namespace is None or name[0] == namespace):
                # A copy the relist covers: the list is the later word, unless this is a
                # write answered after the list's version.
                change = {
                    g: entry
                    for g, entry in change.items()
                    if (group is not None and g != group)
                    or (entry is not None and entry.rv is not None and entry.rv > version)
                }
            if change:
                other._change(p, name, change)
        for route in self._refreshed or ():
            other._forget(route)
        other._sort_touched()
        replaced: list[dict[Any, Any]] = [
            *self._objects.values(),
            *self._copies.values(),
            self._claims,
            self._members,
            *self._rendered.values(),
        ]
        for attr in _STATE:
            setattr(self, attr, getattr(other, attr))
        self.places_version += 1
        # Usually nothing is waiting here (every change is published as it is made): then
        # the copy's sets are taken as they are, not merged into (100,000 routes: ~20 ms).
        self._changed = other._changed if not self._changed else self._changed | other._changed
        self._moved = other._moved if not self._moved else self._moved | other._moved
        return replaced

    def _end_aside(self) -> None:
        built, self._built, self._log, self._refreshed = self._built, None, None, None
        if built is not None and not built.done():
            built.set_result(None)

    def clear(self, plural: str, group: str | None = None, namespace: str | None = None) -> None:
        self.replace(plural, (), group, namespace)

    def refresh(self, namespaces: set[str], cause: tuple[Source, int] | None = None) -> None:
        """Drop the renders of every route with a CR in `namespaces`, and tell the listeners:
        something they show from outside the index changed there (its limits), at `cause`
        (the informer and resourceVersion that brought it)."""
        self._cause = cause
        for objects in self._objects.values():
            for (namespace, _), entry in objects.items():
                if namespace in namespaces and valid_route(entry.route):
                    self._forget(entry.route)
                    if self._refreshed is not None:
                        self._refreshed.add(entry.route)
        self._publish()

    def placed_objects(self, namespaces: set[str]) -> Iterator[tuple[str, Obj]]:
        """(plural, object) of every CR shown in `namespaces`."""
        for plural, objects in self._objects.items():
            for (namespace, _), entry in objects.items():
                if namespace in namespaces:
                    yield plural, entry.obj()

    # -- bookkeeping -----------------------------------------------------------------------

    def _held(self, plural: str, name: Name) -> dict[str, Entry]:
        """Every group's copy of a CR."""
        copies = self._copies[plural].get(name)
        if copies is not None:
            return copies
        shown = self._objects[plural].get(name)
        return {shown.group: shown} if shown is not None else {}

    def _change(self, plural: str, name: Name, change: dict[str, Entry | None]) -> None:
        """Apply new copies (None: gone) of a CR and show the most preferred group's."""
        if self._log is not None:
            self._log.append((plural, name, change))
        held = self._held(plural, name)
        copies = dict(held)
        for group, entry in change.items():
            if (entry is None) == (group in held):  # a copy comes or goes
                self.counts[self._source(plural, group, name[0])] += 1 if entry else -1
            if entry is None:
                copies.pop(group, None)
            else:
                kept = copies.get(group)
                # An unchanged copy (a relist, a repeated event) keeps its entry, so nothing
                # derived from it is dropped.
                copies[group] = kept if kept is not None and kept.same(entry) else entry
        self.encoded_bytes += sum(len(e.data) for e in copies.values()) - sum(
            len(e.data) for e in held.values()
        )
        if len(copies) > 1:
            self._copies[plural][name] = copies
        else:
            self._copies[plural].pop(name, None)
        if not copies:
            self._unstore(plural, name)
            if not self._objects[plural]:
                self._dictionaries.forget(plural)
            return
        kind = self.kinds[plural]
        best = (
            copies[min(copies, key=kind.rank)] if len(copies) > 1 else next(iter(copies.values()))
        )
        if self._objects[plural].get(name) is not best:
            self._store(plural, best.name, best)

    def _store(self, plural: str, name: Name, entry: Entry) -> None:
        old = self._objects[plural].get(name)
        key = (plural, *name)
        if old is not None:
            self._unlink(key, old)
            if old.group != entry.group:
                self._moved.add(entry.route)
                self._unplace((plural, name[0], old.group))
                self._place((plural, name[0], entry.group))
        else:
            self._place((plural, name[0], entry.group))
        self._objects[plural][name] = entry
        self._link(key, entry)

    def _unstore(self, plural: str, name: Name) -> None:
        old = self._objects[plural].pop(name, None)
        if old is not None:
            self._unlink((plural, *name), old)
            self._unplace((plural, name[0], old.group))

    def _place(self, place: tuple[str, str, str]) -> None:
        self._places[place] += 1
        if self._places[place] == 1:
            self._groups_in.setdefault(place[:2], set()).add(place[2])
            self.places_version += 1

    def _unplace(self, place: tuple[str, str, str]) -> None:
        left = self._places[place] - 1
        if left:
            self._places[place] = left
        else:
            del self._places[place]
            groups = self._groups_in[place[:2]]
            groups.discard(place[2])
            if not groups:
                del self._groups_in[place[:2]]
            self.places_version += 1

    def _forget(self, route: str) -> None:
        for cache in self._rendered.values():
            if (value := cache.pop(route, _NONE)) is not _NONE:
                self.rendered_bytes -= _size(value)
        self._changed.add(route)

    def _publish(self) -> None:
        cause, self._cause = self._cause, None
        if not self._changed:
            return
        changed, self._changed = self._changed, set()
        self.cause = cause
        self.moved, self._moved = frozenset(self._moved), set()
        try:
            for listener in self._listeners:
                try:
                    listener(changed)
                except Exception:
                    # A listener's bug must not leave the index half-updated for everyone else.
                    log.exception("index listener failed")
        finally:
            self.cause = None
            self.moved = frozenset()

    def _link(self, key: Key, entry: Entry) -> None:
        route = entry.route
        # A route the API refuses to address is not listed: /config would offer what 400s.
        if valid_route(route):
            claims = _keys(self._claims.get(route))
            if key not in claims:
                self._claims[route] = (*claims, key) if claims else key
            self._touched.add(route)
            self._forget(route)
        for member in entry.members:
            place = (key[1], member)
            self._members[place] = self._members.get(place, frozenset()) | {key}
            self._forget(member)

    def _unlink(self, key: Key, entry: Entry) -> None:
        route = entry.route
        claims = self._claims.get(route)
        if claims is not None:
            rest = tuple(k for k in _keys(claims) if k != key)
            if rest:
                self._claims[route] = rest[0] if len(rest) == 1 else rest
            else:
                del self._claims[route]
            self._touched.add(route)
            self._forget(route)
        for member in entry.members:
            self._forget(member)
            place = (key[1], member)
            holders = self._members.get(place)
            if holders is not None:
                others = holders - {key}
                if others:
                    self._members[place] = others
                else:
                    del self._members[place]

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
            claims = _keys(self._claims.get(route))
            (present if claims else gone).append(route)
            kinds = {self.kinds[p].name for p, _, _ in claims} if claims else set()
            for name, (add, remove) in per_kind.items():
                (add if name in kinds else remove).append(route)
        self._all.update(present, gone)
        for name, (add, remove) in per_kind.items():
            self._by_kind[name].update(add, remove)
