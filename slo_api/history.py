"""A route's history: who changed its client-owned fields, when, from what, and the body after.

Where it lives: one immutable `RouteRevision` per change, in the CR's namespace, owned by the
CR (the garbage collector removes them with it), labelled with the CR's uid, and named from
that uid and the resourceVersion the change made: the same change always gets the same name,
so a second replica's create of it is an AlreadyExists that changes nothing, and a CR deleted
and created again (a new uid) starts a history of its own. Each CR keeps its newest
`ROUTE_HISTORY_ENTRIES` revisions: whichever replica stores one then lists the CR's revisions
and deletes the oldest beyond them (see `_prune`). No value is stored beyond
`VALUE_CAP` bytes (a larger one is kept as its sha256 and size), so no revision can grow
past what the API server stores and no route's history can stop recording.

What a revision says comes from the watch only: each is the difference between two
consecutive states the informers observed for one CR (never a write's answer). Who made it:
- a write through slo-api is recorded by the replica that made it, with its caller and
  request ids: the replica notes the resourceVersion the API server answered (`wrote`), and
  the informer's event carrying that version is its change;
- any other change names the field manager whose managedFields entry it touched, or
  `unknown`;
- a change whose manager is slo-api that this replica did not make is some other replica's:
  it is left to that replica for `GRACE` (the upstream timeout: its answer has arrived by
  then), then recorded with the actor `unknown` if nobody did (a create that is a no-op when
  the other replica did). So is a change no manager stamped (`unknown`): a reset through
  slo-api, nulls for the only fields it held, leaves no slo-api entry in managedFields. A
  replica whose own write finds such a placeholder replaces it.
A relist shows a new state without the ones between: the change recorded is from the last
state observed to the listed one; it is a caller's only if it starts at the state the caller's
write was made on, and a revision of the same version made from consecutive states (by a
replica that saw them) replaces it. A read waits only for this replica's own writes.

Beside each change, the GitOps owners in effect after it (see slo_api/ownership.py): kept in
memory per CR for the write guard (`remembered`), and read back from the newest revision after
a restart for the CRs that carry a GitOps marker.

History kept by earlier versions in one ConfigMap per CR (label `LEGACY_LABEL`) is carried
over into revisions once (`migrate`, by any replica, idempotently) and each ConfigMap deleted
once carried; until then reads show its entries too. Nothing in a ConfigMap proves who wrote
it (the built-in `edit` role may write one), but its age does: only a ConfigMap older than the
RouteRevision CRD, named and owned as the earlier version did for a CR, is carried, and of it
only entries as that version wrote them; each carried revision says `migrated`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from slo_api.bounded import BoundedDict
from slo_api.index import Entry, Name, resource_version, uid_of
from slo_api.kinds.base import Kind, Obj
from slo_api.kube import Kube, KubeError, Resource, log_failure
from slo_api.managed_fields import (
    field_entries,
    last_changed,
    manager_key,
    spec_keys,
    stamp_of,
    stamps,
)
from slo_api.metrics import Metrics
from slo_api.ownership import Owner, Ownership
from slo_api.recovery import Backoff
from slo_api.service import Target
from slo_api.upstream import failure

log = logging.getLogger("slo_api.history")

# The field manager slo-api's own writes carry (kube.Kube.patch).
SELF = "slo-api"
UNKNOWN = "unknown"
GROUP = "slo-api.modelsphere.dev"
REVISIONS = Resource(GROUP, "v1alpha1", "routerevisions")
UID_LABEL = f"{GROUP}/uid"
KIND_LABEL = f"{GROUP}/kind"
# Where earlier versions kept a CR's history (one ConfigMap per CR): carried over, then gone.
LEGACY_LABEL = f"{GROUP}/history-of"
# What to check when the API server refuses slo-api its revisions.
ROLE = (
    "that it may get, list, create and delete routerevisions.slo-api.modelsphere.dev "
    "(ClusterRole slo-api:history) and that the RouteRevision CRD is installed"
)
# A value (a field before or after, in the API's JSON) above this many bytes is kept as its
# digest: 5 fields x 3 values stay far below what one object may hold.
VALUE_CAP = 8 * 1024
# This replica's own writes remembered by resourceVersion until their event arrives.
MINE_KEPT = 4096
# Who made the recent changes the informers saw, by resourceVersion (the change stream's `by`).
BY_KEPT = 4096
# What to check when the API server refuses slo-api the ConfigMaps of earlier versions.
MIGRATION_ROLE = (
    "that it may list and delete configmaps and get the CRD "
    "routerevisions.slo-api.modelsphere.dev (ClusterRole slo-api:history-migration, "
    "docs/upgrade.md)"
)
# The RouteRevision CRD: a ConfigMap made after it is not an earlier version's.
REVISIONS_CRD = f"{REVISIONS.plural}.{REVISIONS.group}"
# What an earlier version's entry held, and each of its changes: nothing else was ever written.
LEGACY_KEYS = frozenset({"id", "time", "actor", "via", "requestId", "changes", "after"})
LEGACY_CHANGE_KEYS = frozenset({"field", "from", "to"})
# The digits of a resourceVersion as etcd writes it (a uint64).
RV_DIGITS = 20
# A name's length: an earlier version's ConfigMap names were cut (and hashed) to fit it.
MAX_NAME = 253
# Where a revision replacing a placeholder is copied first (see History._replace).
SPARE = ".spare"
# Deletes of a placeholder and creates in its place, while placeholders keep taking the name.
REPLACE_ATTEMPTS = 3
# CRs first seen in a list looked at per turn of the event loop (about 30 ms of decoding).
FIRSTS_AT_ONCE = 1000
# How long a change is retried while the API server is away or failing before it is given up
# (and counted `failed`).
RECORD_PATIENCE = 300.0
# Reads of the newest revision of GitOps-marked CRs after a restart, at once.
SEEDS_AT_ONCE = 4
# Marks a revision made across a relist's gap (from the last state observed to the listed
# one): a revision of that version made from consecutive states replaces it, so no change is
# in two revisions.
ACROSS_RELIST = f"{GROUP}/across-relist"

# The caller of the write this request is making: (actor, requestId, clientRequestId).
Writer = tuple[str, str | None, str | None]
writer: contextvars.ContextVar[Writer | None] = contextvars.ContextVar(
    "history_writer", default=None
)

# The client-owned fields of each kind, in the API's names and the order a change lists them.
# A pool's live under `pool.`; everything else a GET shows (status, members, an LLM or job
# route's `pool`) is not the client's and is neither diffed nor restored.
OWNED: dict[str, tuple[str, ...]] = {
    "llm": ("priority", "minimumDeployment", "maximumDeployment", "ttft", "otps"),
    "job": ("priority", "minimumDeployment", "maximumDeployment", "queue"),
    "pool": ("pool.default", "pool.swapPolicy", "pool.swapBudget", "pool.reclaimAfter"),
}


def _no_pool(namespace: str, member: str) -> Obj | None:
    return None


def owned_fields(kind: Kind, obj: Obj) -> dict[str, Any]:
    """The client-owned fields of a CR as the API names them, flat (`pool.swapBudget`)."""
    body = kind.project(obj, _no_pool)
    out: dict[str, Any] = {}
    for name in OWNED.get(kind.name, ()):
        if name.startswith("pool."):
            value = (body.get("pool") or {}).get(name[len("pool.") :])
        else:
            value = body.get(name)
        if value is not None:
            out[name] = value
    return out


def body_of(kind: Kind, route: str, fields: Mapping[str, Any]) -> Obj:
    """A route's body from its client-owned fields: what a revert PUTs back."""
    body: Obj = {"route": route, "kind": kind.name}
    for name, value in fields.items():
        if name.startswith("pool."):
            body.setdefault("pool", {})[name[len("pool.") :]] = value
        else:
            body[name] = value
    return body


def owned_body(kind: Kind, obj: Obj) -> Obj:
    """The route's body restricted to what a client may change."""
    return body_of(kind, kind.route_of(obj), owned_fields(kind, obj))


def diff(kind: Kind, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Obj]:
    """Each client-owned field that differs, with its value before and after (None: unset)."""
    return [
        {"field": name, "from": old.get(name), "to": new.get(name)}
        for name in OWNED.get(kind.name, ())
        if old.get(name) != new.get(name)
    ]


def changes_between(kind: Kind, before: Obj, after: Obj) -> list[Obj]:
    return diff(kind, owned_fields(kind, before), owned_fields(kind, after))


def capped(value: Any) -> Any:
    """`value`, or where its JSON is over VALUE_CAP bytes, its sha256 and size instead."""
    if value is None or isinstance(value, bool | int | float):
        return value
    data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    if len(data) <= VALUE_CAP:
        return value
    return {"digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}


def revision_name(uid: str, rv: str) -> str:
    """One change's revision: the CR's uid (36 characters) and the version the change made.
    The version is opaque: one that is not plain decimal digits (the names revisions have had
    since the first version, kept) is named by its digest, so any version makes a valid name
    (an `x` first: no decimal version is ever taken for one)."""
    if rv.isascii() and rv.isdecimal():
        return f"{uid}.{rv}"
    return f"{uid}.x{hashlib.sha256(rv.encode()).hexdigest()[:40]}"


def _generation(obj: Obj) -> int | None:
    """`metadata.generation`: the API server counts every change of the spec in it, so of two
    states of one CR the one with the lower generation is the older (resourceVersions are
    opaque and not compared)."""
    value = (obj.get("metadata") or {}).get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def changed_by(
    before: Mapping[str, int] | None,
    last: tuple[float, tuple[str, ...]],
    obj: Obj,
    fields: Iterable[str] = (),
) -> tuple[str, str | None]:
    """The field manager that made a change, and when: the one whose managedFields entry the
    change stamped, compared with each manager's stamp before it (`before`) or, when only the
    newest stamp and the entries that carried it are known (a state first seen in a list:
    `last`), newer than that. None stamped (a field removed by a manager that then owns
    nothing keeps no entry): `unknown`."""
    newest, latest = last

    def stamped(e: Obj) -> bool:
        time = stamp_of(e.get("time"))
        if before is not None:
            return before.get(manager_key(e)) != time
        return time > newest or (time == newest and manager_key(e) not in latest)

    entries = field_entries(obj)
    touched = [e for e in entries if stamped(e)]
    if not touched and entries:
        # A manager changing it again within the second its entry was stamped in leaves the
        # stamp as it was: then the one that owns a changed field and was stamped last.
        keys = {f.removeprefix("pool.") for f in fields}
        newest = max(stamp_of(e.get("time")) for e in entries)
        touched = [
            e for e in entries if stamp_of(e.get("time")) == newest and keys & set(spec_keys(e))
        ]
    chosen = max(touched, key=lambda e: stamp_of(e.get("time")), default=None)
    if chosen is None:
        return UNKNOWN, None
    time = chosen.get("time")
    return str(chosen.get("manager") or UNKNOWN), str(time) if time else None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _order(entry: Obj) -> tuple[int, str, int, str]:
    """Oldest first. The decimal versions API servers hand out sort by their digits (shorter
    first, then as text: the order they were made, with no int()). Any other version sorts
    after them by when the change was made, then by its text. `time` alone cannot order
    decimal versions: it comes from different clocks (a manager's managedFields stamp, or the
    second a replica saw a change no manager stamped), so two changes made within a second
    of each other could swap."""
    ident = str(entry.get("id", ""))
    if ident.isascii() and ident.isdecimal():
        return 0, "", len(ident), ident
    return 1, str(entry.get("time") or ""), len(ident), ident


def _owners_json(owners: Mapping[str, Owner]) -> Obj:
    return {
        f: {"manager": o.manager, "operation": o.operation, "time": o.time}
        for f, o in sorted(owners.items())
    }


def _owners_of(entry: Obj) -> dict[str, Owner]:
    raw = entry.get("owners")
    if not isinstance(raw, dict):
        return {}
    return {
        str(f): Owner(str(f), str(o.get("manager")), str(o.get("operation")), str(o.get("time")))
        for f, o in raw.items()
        if isinstance(o, dict)
    }


@dataclass(slots=True)
class _Seen:
    """The last state the informers observed of one CR (per API group): enough to diff. A
    state first seen in a list is kept as the index's entry (shared, not copied) and decoded
    only when the CR changes: a list of 100,000 CRs decodes none of them here."""

    uid: str | None
    # The version as its source gives it (the index's entry's, or the object's
    # resourceVersion): only ever compared for equality.
    rv: int | str | None
    # metadata.generation (None: not known, a state first seen in a list).
    gen: int | None
    entry: Entry | None
    fields: dict[str, Any] | None
    # When each manager last changed it (None: only the newest of them, `last`, is known: the
    # index's copy keeps no managedFields but the GitOps tools').
    managers: dict[str, int] | None
    last: tuple[float, tuple[str, ...]]

    def decoded(self, kind: Kind) -> dict[str, Any]:
        if self.fields is None:
            self.fields = owned_fields(kind, self.entry.obj() if self.entry is not None else {})
            self.entry = None
        return self.fields


@dataclass(frozen=True, slots=True)
class _Change:
    kind: Kind
    obj: Obj
    changes: list[Obj]
    when: str
    # Across a relist's gap: the digest of the state before it (see _state_digest); None for
    # two consecutive states.
    gap: bytes | None = None


@dataclass(frozen=True, slots=True)
class _Mine:
    """A write this replica made: its caller, and the digest of the client-owned fields it
    was made on (its precondition's state; None: not known)."""

    writer: Writer
    before: bytes | None

    def made(self, change: _Change) -> bool:
        """Whether `change` is this write alone: consecutive states, or a relist's gap that
        starts at the state the write was made on (then its changed fields are the write's)."""
        return change.gap is None or (self.before is not None and self.before == change.gap)


def _state_digest(fields: Mapping[str, Any]) -> bytes:
    return hashlib.blake2b(
        orjson.dumps(fields, option=orjson.OPT_SORT_KEYS), digest_size=16
    ).digest()


class History:
    def __init__(
        self,
        kube: Kube,
        kinds: list[Kind],
        limit: int,
        metrics: Metrics | None = None,
        ownership: Ownership | None = None,
        grace: float | None = None,
        pause: Callable[[float], Awaitable[object]] | None = None,
    ) -> None:
        self.kube = kube
        self.metrics = metrics or Metrics()
        self.kinds = {k.resource.plural: k for k in kinds}
        self.limit = limit
        self.ownership = ownership or Ownership()
        # How long a change made through slo-api is left to the replica that made it.
        self.grace = kube.timeout if grace is None else grace
        # How a recording waits before it retries: the runtime's wakes when the API server
        # answers again after an outage (True then), so no outage-grown backoff is slept out.
        self.pause: Callable[[float], Awaitable[object]] = pause or asyncio.sleep
        self._seen: dict[tuple[str, str, Name], _Seen] = {}
        self._mine: BoundedDict[str, _Mine] = BoundedDict(MINE_KEPT)
        self._by: BoundedDict[str, Obj] = BoundedDict(BY_KEPT)
        # The GitOps owners in effect after the newest change observed, per CR uid.
        self._remembered: dict[str, dict[str, Owner]] = {}
        # Per CR uid: recordings of this replica's own writes under way (a read on this
        # replica waits for them, no other).
        self._recording: dict[str, set[asyncio.Task[None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Changes made by slo-api that no answer here named yet, waiting (by version), with
        # the task that records them.
        self._answers: dict[str, tuple[asyncio.Event, asyncio.Task[None]]] = {}
        # Per CR uid: this replica's writes whose change the informers have not brought yet.
        self._unseen: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}
        # The generation the informers last reached of the CRs most recently changed (a
        # write's answer may come after its event).
        self._reached: BoundedDict[str, int] = BoundedDict(MINE_KEPT)
        self._seeds = asyncio.Semaphore(SEEDS_AT_ONCE)
        # Per CR uid whose seed (see _seed) is under way: the newest state observed since.
        self._seeding: dict[str, Obj] = {}
        # CRs first seen in a list, waiting to be looked at (see _first_sight).
        self._firsts: list[tuple[Kind, Entry]] = []
        self._firsts_task: asyncio.Task[None] | None = None
        # ConfigMaps of earlier versions not carried over yet (None: not looked for yet).
        self._legacy_left: bool | None = None
        # When the RouteRevision CRD was made (None: not known, so nothing is carried); read once.
        self._revisions_since: datetime | None = None
        self._crd_read = False
        # ConfigMaps and entries of earlier versions left alone, each logged once.
        self._noted: set[tuple[str, ...]] = set()

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    # -- what the write path and the change stream ask -------------------------------------

    def wrote(self, obj: Obj, before: Obj | None = None, kind: Kind | None = None) -> None:
        """A write through this replica, made on `before` (its precondition), was answered
        with `obj`: its change is this caller's."""
        mine, rv, uid = writer.get(), resource_version(obj), uid_of(obj)
        if mine is not None and rv:
            start = None
            if before is not None and kind is not None:
                start = _state_digest(owned_fields(kind, before))
            self._mine[rv] = _Mine(mine, start)
            pending = self._answers.get(rv)
            if pending is not None:  # its event came first, and waits for this answer
                pending[0].set()
                if uid:
                    self._own(uid, pending[1])
            gen = _generation(obj)
            if uid and self.enabled and (gen is None or self._reached.get(uid, -1) < gen):
                # Until the watch brings it, a read of this route here waits for it.
                waiting = asyncio.get_running_loop().create_future()
                self._unseen.setdefault(uid, []).append((gen or 0, waiting))

    def by(self, rv: int | str) -> Obj | None:
        """Who made the change at resourceVersion `rv`, as the history records it: the caller
        and request ids for a write through this replica, the field manager for a change the
        informers saw; None when not known."""
        key = str(rv)
        mine = self._mine.get(key)
        if mine is not None:
            return _who(mine.writer[0], SELF, mine.writer[1], mine.writer[2])
        return self._by.get(key)

    def tracked(self) -> set[str]:
        """The CR uids this replica keeps anything for (beyond the last state seen)."""
        return {
            *self._remembered,
            *self._unseen,
            *self._reached,
            *self._seeding,
            *self._recording,
        }

    def remembered(self, obj: Obj) -> Mapping[str, Owner]:
        """The GitOps owners in effect for the CR after its newest observed change."""
        uid = uid_of(obj)
        return self._remembered.get(uid, {}) if uid else {}

    def _owners_after(
        self, before: Mapping[str, Owner], old: Obj | None, new: Obj
    ) -> dict[str, Owner]:
        # The one place the ownership rule is applied to a change: a field a GitOps tool
        # applied stays the tool's after a forced write or a kubectl edit, until it applies
        # again (`before` is what was in effect after the previous observed state).
        return self.ownership.carry(before, old, new)

    # -- observing -------------------------------------------------------------------------

    def observe(self, plural: str, group: str, name: Name, state: Obj | Entry | None) -> None:
        """The index's observer: a state the informers saw (an event or a relist's), or None
        when the CR is gone."""
        kind = self.kinds.get(plural)
        if kind is None:
            return
        key = (plural, group, name)
        if state is None:
            seen = self._seen.pop(key, None)
            if seen is not None and seen.uid:
                self._forget(seen.uid)
            return
        prev = self._seen.get(key)
        if isinstance(state, Entry):
            if (
                prev is not None
                and prev.uid == state.uid
                and state.rv is not None
                and prev.rv in (state.rv, str(state.rv))
            ):
                return  # a relist's copy of what was seen: nothing to decode
            if prev is None or prev.uid != state.uid:
                if prev is not None and prev.uid:
                    self._forget(prev.uid)  # re-created while the watch was away
                last = (state.stamp, state.latest)
                self._seen[key] = _Seen(state.uid, state.rv, None, state, None, None, last)
                self._first_sight(kind, state)
                return
            obj = state.obj()
        else:
            obj = state
        uid, gen = uid_of(obj), _generation(obj)
        if prev is not None and prev.uid == uid:
            if prev.rv == resource_version(obj):
                return  # a repeated event
            if gen is not None and prev.gen is not None and gen < prev.gen:
                return  # older than what was seen (a late event)
        fields = owned_fields(kind, obj)
        if isinstance(state, Entry):  # a relist's: managedFields trimmed
            last = (state.stamp, state.latest)
            self._seen[key] = _Seen(uid, state.rv, gen, None, fields, None, last)
        else:
            rv = resource_version(obj)
            self._seen[key] = _Seen(uid, rv, gen, None, fields, stamps(obj), last_changed(obj))
        if uid is None:
            return
        if prev is not None and prev.uid and prev.uid != uid:
            self._forget(prev.uid)
        if uid in self._seeding:
            self._seeding[uid] = obj
        if uid in self._unseen:
            self._arrived(uid, gen)
        if gen is not None and prev is not None:  # a change, not a first sight
            self._reached.pop(uid, None)
            self._reached[uid] = gen
        before = self._remembered.get(uid)
        owners = self._owners_after(before or {}, None, obj)
        if owners or before:
            self._remembered[uid] = owners
        if prev is None or prev.uid != uid:
            # First seen here (a start, or a re-created CR): nothing to diff with. A CR at
            # generation 1 was seen from its creation on: no change of it is stored yet, so
            # there is nothing to read back (and its first change need not wait to name owners).
            if before is None and gen != 1 and self.enabled and self.ownership.markers(obj):
                self._start_seed(kind, obj, uid)
            return
        if (
            prev.entry is not None  # first seen in a list, and not looked at since
            and before is None
            and uid not in self._seeding
            and self.enabled
            and self.ownership.markers(obj)
        ):
            self._start_seed(kind, obj, uid)
        # Until its seed is in, this replica does not know the owners in effect: it says
        # nothing of them rather than that there are none.
        recorded = None if uid in self._seeding else owners
        old = prev.decoded(kind)
        changes = diff(kind, old, fields)
        if not changes:
            return
        manager, when = changed_by(prev.managers, prev.last, obj, [c["field"] for c in changes])
        gap = _state_digest(old) if isinstance(state, Entry) else None
        change = _Change(kind, obj, changes, when or _now(), gap)
        version = resource_version(obj)
        mine = self._mine.get(version)
        if mine is not None and mine.made(change):
            self._record(change, mine.writer[0], SELF, *mine.writer[1:], recorded, own=True)
            return
        actor = UNKNOWN if manager == SELF else manager
        self._by[version] = _who(actor, manager, None, None)
        if mine is not None:
            # A relist's gap that ends at this replica's write but holds more than it: it is
            # not pinned on the caller.
            self._record(change, actor, manager, None, None, recorded)
        elif manager in (SELF, UNKNOWN):
            # Another replica's write, or this one's whose answer is still on its way: a
            # reset through slo-api (nulls for the only fields it held) leaves no slo-api
            # entry in managedFields, so a change no manager stamped may be one too.
            self._later(change, version, manager, recorded)
        else:
            self._record(change, manager, manager, None, None, recorded)

    def _start_seed(self, kind: Kind, obj: Obj, uid: str) -> None:
        self._seeding[uid] = obj
        self._spawn(self._seed(kind, uid))

    def _forget(self, uid: str) -> None:
        """A CR gone (deleted, or found re-created under a new uid): nothing kept of it."""
        self._remembered.pop(uid, None)
        self._reached.pop(uid, None)
        self._seeding.pop(uid, None)
        self._arrived(uid, None)

    def _first_sight(self, kind: Kind, entry: Entry) -> None:
        """A CR first seen in a list: its GitOps owners, and for a CR with a GitOps marker
        those its newest revision remembers, are looked at in the background, `FIRSTS_AT_ONCE`
        a turn of the loop (a list of 100,000 CRs must not stall it)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # an index filled outside a running service: nothing to look up
        self._firsts.append((kind, entry))
        if self._firsts_task is None or self._firsts_task.done():
            self._firsts_task = loop.create_task(self._look_at_firsts())

    async def _look_at_firsts(self) -> None:
        while self._firsts:
            batch, self._firsts = self._firsts[:FIRSTS_AT_ONCE], self._firsts[FIRSTS_AT_ONCE:]
            for kind, entry in batch:
                if entry.uid is None or entry.uid in self._remembered or entry.uid in self._seeding:
                    continue  # gone or changed since: what was seen then is newer
                obj = entry.obj()
                owners = self._owners_after({}, None, obj)
                if owners:
                    self._remembered[entry.uid] = owners
                if self.enabled and self.ownership.markers(obj):
                    self._start_seed(kind, obj, entry.uid)
            await asyncio.sleep(0)

    def _arrived(self, uid: str, gen: int | None) -> None:
        """The informers reached generation `gen` of a CR (None: it is gone, or a state that
        does not say): this replica's writes up to it are no longer awaited."""
        left = []
        for wanted, waiting in self._unseen.pop(uid, []):
            if gen is None or wanted <= gen:
                if not waiting.done():
                    waiting.set_result(None)
            else:
                left.append((wanted, waiting))
        if left:
            self._unseen[uid] = left

    def _later(self, change: _Change, rv: str, via: str, owners: dict[str, Owner] | None) -> None:
        if not self.enabled:
            return

        answered = asyncio.Event()

        async def wait() -> None:
            # Until this replica's own answer names the change (see `wrote`), or the grace
            # is over: then it was another replica's.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.grace):
                    await answered.wait()
            held = self._answers.get(rv)
            if held is not None and held[0] is answered:
                del self._answers[rv]
            mine = self._mine.get(rv)
            if mine is not None and mine.made(change):
                await self._store(change, mine.writer[0], SELF, *mine.writer[1:], owners)
            else:
                await self._store(change, UNKNOWN, via, None, None, owners, placeholder=True)

        # Not a recording a read here waits for, unless this replica's answer names it.
        self._answers[rv] = (answered, self._spawn(wait()))

    def _record(
        self,
        change: _Change,
        actor: str,
        via: str,
        request_id: str | None,
        client_request_id: str | None,
        owners: dict[str, Owner] | None,
        *,
        own: bool = False,
    ) -> None:
        if self.enabled:
            task = self._spawn(
                self._store(change, actor, via, request_id, client_request_id, owners)
            )
            uid = uid_of(change.obj)
            if own and uid:
                self._own(uid, task)

    def _spawn(self, work: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _own(self, uid: str, task: asyncio.Task[None]) -> None:
        """`task` records this replica's own write: a read of the CR here waits for it."""
        if task.done():
            return
        waiting = self._recording.setdefault(uid, set())
        waiting.add(task)

        def done(t: asyncio.Task[None]) -> None:
            waiting.discard(t)
            if not waiting and self._recording.get(uid) is waiting:
                del self._recording[uid]

        task.add_done_callback(done)

    # -- storing ---------------------------------------------------------------------------

    def _entry(
        self,
        change: _Change,
        actor: str,
        via: str,
        request_id: str | None,
        client_request_id: str | None,
        owners: Mapping[str, Owner] | None,
    ) -> Obj:
        kind, obj = change.kind, change.obj
        after = owned_fields(kind, obj)
        return {
            "id": resource_version(obj),
            "time": change.when,
            "actor": actor,
            "via": via,
            "requestId": request_id,
            "clientRequestId": client_request_id,
            "changes": [
                {"field": c["field"], "from": capped(c["from"]), "to": capped(c["to"])}
                for c in change.changes
            ],
            "after": body_of(kind, kind.route_of(obj), {k: capped(v) for k, v in after.items()}),
            "owners": None if owners is None else _owners_json(owners),
        }

    def _revision(self, kind: Kind, obj: Obj, entry: Obj, *, across: bool = False) -> Obj:
        meta = obj.get("metadata") or {}
        uid = uid_of(obj) or ""
        return {
            "apiVersion": f"{REVISIONS.group}/{REVISIONS.version}",
            "kind": "RouteRevision",
            "metadata": {
                "name": revision_name(uid, str(entry["id"])),
                "namespace": str(meta.get("namespace", "")),
                "labels": {
                    "app.kubernetes.io/managed-by": SELF,
                    UID_LABEL: uid,
                    KIND_LABEL: kind.name,
                },
                **({"annotations": {ACROSS_RELIST: "true"}} if across else {}),
                "ownerReferences": [
                    {
                        "apiVersion": str(obj.get("apiVersion", "")),
                        "kind": str(obj.get("kind", "")),
                        "name": str(meta.get("name", "")),
                        "uid": uid,
                    }
                ],
            },
            "data": orjson.dumps(entry).decode(),
        }

    async def _store(
        self,
        change: _Change,
        actor: str,
        via: str,
        request_id: str | None,
        client_request_id: str | None,
        owners: Mapping[str, Owner] | None,
        *,
        placeholder: bool = False,
    ) -> None:
        entry = self._entry(change, actor, via, request_id, client_request_id, owners)
        body = self._revision(change.kind, change.obj, entry, across=change.gap is not None)
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        backoff = Backoff()
        loop = asyncio.get_running_loop()
        given_up_at = loop.time() + RECORD_PATIENCE
        retried = False
        # Once stored, only the pruning is left to retry (a second create would be a no-op
        # that prunes nothing).
        stored = False
        while True:
            doing = "pruning the history" if stored else "recording a change"
            try:
                if not stored:
                    stored = await self._create(
                        body, replaces=via == SELF and actor != UNKNOWN and not placeholder
                    )
                    self._count("stored" if stored else "already")
                    if not stored:
                        return
                await self._prune(namespace, uid_of(change.obj) or "")
                return
            except KubeError as exc:
                delay = exc.retry_after or backoff.next()
                # The API server away, or busy, or just restarted and not serving revisions
                # yet (404: the CR's namespace exists, it was just observed): the change waits
                # for it (a while), rather than be lost from the history.
                if (_passing(exc) or exc.status == 404) and loop.time() + delay < given_up_at:
                    if not retried:  # once, not at every retry
                        log_failure(log, exc, f"{doing} of {namespace}/{name}", ROLE)
                    retried = True
                    if await self.pause(delay):
                        backoff.reset()  # woken as the API server answers again
                    continue
                if not stored:
                    self._count("failed")
                log_failure(log, exc, f"{doing} of {namespace}/{name}", ROLE)
                return
            except Exception:
                if not stored:
                    self._count("failed")
                log.exception("%s of %s failed", doing, namespace)
                return

    async def _create(self, body: Obj, *, replaces: bool) -> bool:
        """Create a revision; False when it exists already (another replica's). With
        `replaces` (this replica's own write), a placeholder another replica left for it
        (`unknown`: it could not tell whose it was) gives way to it; and one made across a
        relist's gap gives way to one made from consecutive states."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        across = _across(body)
        try:
            await self.kube.create(REVISIONS, namespace, body)
            return True
        except KubeError as exc:
            if exc.status != 409:
                raise
            if not replaces and across:
                return False
        held = await self.kube.get(REVISIONS, namespace, name)
        if not ((replaces and _placeholder(_data(held))) or (_across(held) and not across)):
            return False
        return await self._replace(body, held)

    async def _replace(self, body: Obj, held: Obj) -> bool:
        """Put the revision `body` where the placeholder `held` is. A revision is immutable,
        so the placeholder is deleted and `body` created under its name; a copy of `body` is
        created first under a name of its own (`SPARE`), so that a failure or a crash between
        the delete and the create loses nothing: a read prefers it to a placeholder, and it is
        pruned as any revision is. Retried while a placeholder holds the name again (another
        replica's, whose grace ended meanwhile); the copy stays only if one still does. False
        when another replica replaced it first."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        spare = {**body, "metadata": {**meta, "name": name + SPARE}}
        try:
            await self.kube.create(REVISIONS, namespace, spare)
        except KubeError as exc:
            if exc.status != 409:
                raise
        replaced = False
        for _ in range(REPLACE_ATTEMPTS):
            uid = str((held.get("metadata") or {}).get("uid", ""))
            if uid:  # only that very placeholder: never what replaced it meanwhile
                try:
                    await self.kube.delete(REVISIONS, namespace, name, uid=uid)
                except KubeError as exc:
                    if exc.status not in (404, 409):
                        raise
            try:
                await self.kube.create(REVISIONS, namespace, body)
                replaced = True
                break
            except KubeError as exc:
                if exc.status != 409:
                    raise
            try:
                held = await self.kube.get(REVISIONS, namespace, name)
            except KubeError as exc:
                if exc.status != 404:
                    raise
                held = {}
                continue
            if not _placeholder(_data(held)):
                break  # another replica's replacement: the copy is not needed
        else:
            return False  # a placeholder holds the name still: the copy is what is read
        with contextlib.suppress(KubeError):
            await self.kube.delete(REVISIONS, namespace, name + SPARE)
        return replaced

    async def _list(self, namespace: str, uid: str) -> list[Obj]:
        items: list[Obj] = []
        continue_: str | None = None
        waited = 0.0
        while True:
            try:
                page = await self.kube.list(
                    REVISIONS,
                    namespace=namespace,
                    label_selector=f"{UID_LABEL}={uid}",
                    continue_=continue_,
                )
            except KubeError as exc:
                # 429: the API server asks to come back (its cache of a newly installed kind
                # is still filling, say): within the upstream timeout, as it says.
                delay = exc.retry_after or 1.0
                if exc.status != 429 or waited + delay > self.kube.timeout:
                    raise
                waited += delay
                await asyncio.sleep(delay)
                continue
            items.extend(i for i in page.get("items") or [] if isinstance(i, dict))
            continue_ = (page.get("metadata") or {}).get("continue") or None
            if not continue_:
                return items

    async def _prune(self, namespace: str, uid: str) -> None:
        """Keep the CR's newest `limit` changes, whichever replica recorded each: after each
        revision stored, the CR's revisions are listed (as the API server holds them: at
        most `limit` and the few recorded meanwhile) and the oldest beyond the bound deleted.
        A change's spare copy (see `_replace`) counts with it and goes with it."""
        changes: dict[str, list[Obj]] = {}
        for item in await self._list(namespace, uid):
            changes.setdefault(str(_data(item).get("id")), []).append(item)
        oldest_first = sorted(changes.values(), key=lambda copies: _order(_data(copies[0])))
        for copies in oldest_first[: max(0, len(oldest_first) - self.limit)]:
            for item in copies:
                meta = item.get("metadata") or {}
                try:
                    await self.kube.delete(
                        REVISIONS, namespace, str(meta.get("name")), uid=str(meta.get("uid", ""))
                    )
                except KubeError as exc:
                    if exc.status not in (404, 409):
                        raise

    def _count(self, outcome: str) -> None:
        self.metrics.history_entries.labels(outcome).inc()

    async def _seed(self, kind: Kind, uid: str) -> None:
        """After a start: the GitOps owners a marked CR's newest revision that says remembers,
        merged with those observed since (which win), re-checked on the newest state observed
        (the index's copy)."""
        obj = self._seeding.get(uid)
        if obj is None:
            return
        namespace = str((obj.get("metadata") or {}).get("namespace", ""))
        try:
            async with self._seeds:
                try:
                    entries = [_data(r) for r in await self._list(namespace, uid)]
                except KubeError as exc:
                    log_failure(log, exc, f"reading the history of a CR in {namespace}", ROLE)
                    return
            current = self._seeding.get(uid)
            if current is None:
                return  # gone meanwhile
            told = [e for e in entries if isinstance(e.get("owners"), dict)]
            newest = max(told, key=_order, default=None)
            seeded = _owners_of(newest) if newest is not None else {}
            merged = {**seeded, **self._remembered.get(uid, {})}
            owners = self._owners_after(merged, None, current)
            if owners:
                self._remembered[uid] = owners
            else:
                self._remembered.pop(uid, None)
        finally:
            self._seeding.pop(uid, None)

    # -- reading ---------------------------------------------------------------------------

    async def read(self, target: Target) -> list[Obj]:
        """The route's history (the CR the route resolved to, by uid), newest first."""
        # A caller reads its own write: the change it made here is waited for (the watch
        # brings it within milliseconds), and so is its recording.
        unseen = [waiting for _, waiting in self._unseen.get(target.uid, [])]
        if unseen:
            await asyncio.wait(unseen, timeout=self.kube.timeout)
        pending = self._recording.get(target.uid)
        if pending:
            await asyncio.wait(list(pending), timeout=self.kube.timeout)
        try:
            items = await self._list(target.namespace, target.uid)
        except KubeError as exc:
            raise failure(exc, "reading a route's history", ROLE) from None
        entries: dict[str, Obj] = {}
        for e in map(_data, items):
            # One entry per change: a replacement (or its spare copy) over a placeholder.
            held = entries.get(str(e.get("id")))
            if e and (held is None or _placeholder(held)):
                entries[str(e.get("id"))] = e
        if self._legacy_left is not False:
            for e in await self._legacy(target):
                entries.setdefault(str(e.get("id")), e)
        out = sorted(entries.values(), key=_order, reverse=True)
        out = out[: self.limit] if self.limit else out
        return [{**e, "migrated": e.get("migrated") is True} for e in out]

    # -- carrying over the ConfigMaps of earlier versions ----------------------------------

    async def _legacy(self, target: Target) -> list[Obj]:
        """The entries an earlier version kept for this CR in its ConfigMap, if still there
        and one it wrote (see `_refusal`)."""
        since = await self._crd_created()
        wanted = legacy_name(target.kind.name, target.name)
        for cm in await self._legacy_maps(target.namespace):
            if (cm.get("metadata") or {}).get("name") != wanted:
                continue
            why = _refusal(cm, target.kind, target.obj, since)
            if why is not None:
                self._left_alone(cm, why)
                return []
            return self._carried_entries(cm, target.kind, target.obj)
        return []

    async def _legacy_page(self, namespace: str | None, continue_: str | None = None) -> Obj:
        try:
            return await self.kube.list_config_maps(namespace, LEGACY_LABEL, continue_=continue_)
        except KubeError as exc:
            if exc.status in (403, 404):
                if exc.status == 403 and self._legacy_left is None:
                    log.warning(
                        "may not list ConfigMaps: history kept by an earlier version, if any "
                        "is left, is not carried over (docs/upgrade.md: "
                        "slo-api:history-migration)"
                    )
                    self._legacy_left = False
                return {}  # the grant dropped once carried: nothing to carry
            raise failure(
                exc, "reading the history of an earlier version", MIGRATION_ROLE
            ) from None

    async def _legacy_maps(self, namespace: str | None) -> list[Obj]:
        page = await self._legacy_page(namespace)
        return [i for i in page.get("items") or [] if isinstance(i, dict)]

    async def _crd_created(self) -> datetime | None:
        """When the RouteRevision CRD was made: the ConfigMaps of earlier versions are older."""
        if not self._crd_read:
            try:
                crd = await self.kube.get_crd(REVISIONS_CRD)
            except KubeError as exc:
                if exc.status not in (403, 404):
                    raise failure(
                        exc, "reading the history of an earlier version", MIGRATION_ROLE
                    ) from None
                log.warning(
                    "cannot read the CRD %s (%s): without its age no ConfigMap of an earlier "
                    "version can be told from one made since, so none is carried over "
                    "(docs/upgrade.md)",
                    REVISIONS_CRD,
                    exc.status,
                )
                crd = {}
            self._revisions_since = _timestamp((crd.get("metadata") or {}).get("creationTimestamp"))
            self._crd_read = True
        return self._revisions_since

    async def migrate(self, namespaces: tuple[str, ...] | None = None) -> int:
        """Carry every ConfigMap history an earlier version wrote over into revisions, then
        delete it; returns the entries carried. Safe on any replica at any time: creates of
        what exists are no-ops, and a ConfigMap is deleted only as it was read (its
        resourceVersion). A ConfigMap or an entry that is not an earlier version's is left
        alone and logged; one failing create is skipped, unless the API server is away (then
        the whole is retried)."""
        carried = 0
        since = await self._crd_created()
        for namespace in namespaces or (None,):
            continue_: str | None = None
            while since is not None:
                page = await self._legacy_page(namespace, continue_)
                for cm in page.get("items") or []:
                    if isinstance(cm, dict):
                        carried += await self._carry(cm, since)
                continue_ = (page.get("metadata") or {}).get("continue") or None
                if not continue_:
                    break
        self._legacy_left = False
        if carried:
            log.info("carried %d history entries over from ConfigMaps into revisions", carried)
        return carried

    async def _carry(self, cm: Obj, since: datetime) -> int:
        meta = cm.get("metadata") or {}
        namespace = str(meta.get("namespace", ""))
        kind, cr = await self._legacy_owner(cm)
        why = _refusal(cm, kind, cr, since)
        if why is not None or kind is None or cr is None:
            self._left_alone(cm, why or "")
            return 0
        entries = self._carried_entries(cm, kind, cr)
        left = len(_legacy_raw(cm)) - len(entries)
        carried = 0
        for entry in entries:
            body = self._revision(kind, cr, entry)
            try:
                await self._carry_one(body, entry)
                carried += 1
            except KubeError as exc:
                if _passing(exc):
                    raise  # the API server away: the migration is retried as a whole
                left += 1
                log_failure(log, exc, f"carrying entry {entry['id']} of {_where(cm)}", ROLE)
        if left:
            self._note(
                (namespace, str(meta.get("name")), "kept"),
                "%s kept: %d of its entries were not carried over (logged above)",
                _where(cm),
                left,
            )
            return carried
        try:
            await self.kube.delete_config_map(
                namespace, str(meta.get("name")), resource_version=str(meta.get("resourceVersion"))
            )
        except KubeError as exc:
            if exc.status not in (404, 409):
                raise
        return carried

    async def _carry_one(self, body: Obj, entry: Obj) -> None:
        """Create one carried revision. Where a placeholder holds its name (a write an old
        pod made during the rollout, seen here but not whose it was), the ConfigMap names its
        caller: the placeholder gives way to what the watch saw, attributed to that caller."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        try:
            await self.kube.create(REVISIONS, namespace, body)
            return
        except KubeError as exc:
            if exc.status != 409:
                raise
        if entry["via"] != SELF or entry["actor"] == UNKNOWN:
            return
        held = await self.kube.get(REVISIONS, namespace, name)
        seen = _data(held)
        if not _placeholder(seen):
            return
        named = {
            **seen,
            "actor": entry["actor"],
            "requestId": entry["requestId"],
            "clientRequestId": None,
            "via": SELF,
            "migrated": True,
        }
        await self._replace({**body, "data": orjson.dumps(named).decode()}, held)

    async def _legacy_owner(self, cm: Obj) -> tuple[Kind | None, Obj | None]:
        """The kind the ConfigMap is labelled with and the CR its owner reference names, as
        the API server has it now (None: no such kind or CR)."""
        meta = cm.get("metadata") or {}
        label = (meta.get("labels") or {}).get(LEGACY_LABEL)
        kind = next((k for k in self.kinds.values() if k.name == label), None)
        if kind is None:
            return None, None
        for ref in meta.get("ownerReferences") or []:
            if not isinstance(ref, dict):
                continue
            group = str(ref.get("apiVersion", "")).partition("/")[0]
            res = kind.resources.get(group)
            if res is None or not isinstance(ref.get("name"), str):
                continue
            try:
                cr = await self.kube.get(res, str(meta.get("namespace", "")), ref["name"])
            except KubeError as exc:
                if exc.status not in (403, 404):
                    raise
                continue
            if uid_of(cr) == ref.get("uid"):
                return kind, cr
        return kind, None

    def _carried_entries(self, cm: Obj, kind: Kind, cr: Obj) -> list[Obj]:
        """The entries of an earlier version's ConfigMap as revisions hold them; each other
        one logged (once) and left out."""
        rv = _decimal(resource_version(cr))
        out: dict[str, Obj] = {}
        for n, raw in enumerate(_legacy_raw(cm)):
            entry, why = _legacy_entry(raw, kind, rv or "")
            if entry is None:
                shown = raw.get("id") if isinstance(raw, dict) else raw
                self._note(
                    (*_key(cm), str(n)),
                    "entry %d (id %s) of %s left out: %s",
                    n,
                    repr(shown)[:40],
                    _where(cm),
                    why,
                )
            else:
                out.setdefault(entry["id"], entry)
        return list(out.values())

    def _left_alone(self, cm: Obj, why: str) -> None:
        self._note(_key(cm), "%s left alone: %s (not carried over, not deleted)", _where(cm), why)

    def _note(self, key: tuple[str, ...], message: str, *args: Any) -> None:
        if key not in self._noted:
            self._noted.add(key)
            log.warning(message, *args)

    async def close(self) -> None:
        """Let the recordings under way finish, those waiting out their grace included
        (bounded by the grace and the upstream timeout)."""
        if self._firsts_task is not None:
            self._firsts_task.cancel()
        pending = list(self._tasks)
        if pending:
            _, left = await asyncio.wait(pending, timeout=self.grace + self.kube.timeout)
            for task in left:
                task.cancel()


def _passing(exc: KubeError) -> bool:
    """A failure that passes: the API server unreachable, timing out, busy or failing."""
    return exc.status in (0, 429) or exc.status >= 500


def _who(actor: str, via: str, request_id: str | None, client_request_id: str | None) -> Obj:
    return {
        "actor": actor,
        "via": via,
        "requestId": request_id,
        "clientRequestId": client_request_id,
    }


def _across(revision: Obj) -> bool:
    annotations = (revision.get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(ACROSS_RELIST) == "true")


def _data(revision: Obj) -> Obj:
    raw = revision.get("data")
    try:
        value = orjson.loads(raw) if isinstance(raw, str) else None
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _placeholder(entry: Obj) -> bool:
    """A revision no replica could attribute when it was made (`unknown`, via slo-api or not:
    a reset through slo-api may leave no slo-api manager in managedFields for another replica
    to see), which the writer's own record, or a carried entry naming the caller, replaces."""
    return entry.get("actor") == UNKNOWN and not entry.get("migrated")


# -- what an earlier version wrote -------------------------------------------------------------


def legacy_name(kind_name: str, name: str) -> str:
    """The ConfigMap an earlier version kept a CR's history in, as it named it."""
    full = f"slo-history.{kind_name}.{name}"
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.blake2b(name.encode(), digest_size=8).hexdigest()
    return f"{full[: MAX_NAME - len(digest) - 1].rstrip('.-')}.{digest}"


def _decimal(value: Any) -> str | None:
    """`value` if it is a resourceVersion as etcd writes one (ASCII digits, no leading zero,
    a uint64), else None. isdecimal() alone admits other scripts' digits, isdigit() even
    "¹", which int() refuses."""
    if not isinstance(value, str) or not 0 < len(value) <= RV_DIGITS:
        return None
    if not (value.isascii() and value.isdecimal()) or (value[0] == "0" and value != "0"):
        return None
    return value


def _not_after(ident: str, rv: str) -> bool:
    """Two `_decimal`s compared as the numbers they write, with no int(): the longer is the
    larger, and of equal length the text orders them."""
    return (len(ident), ident) <= (len(rv), rv)


def _timestamp(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _refusal(cm: Obj, kind: Kind | None, cr: Obj | None, since: datetime | None) -> str | None:
    """Why `cm` is not the ConfigMap an earlier version kept the history of the CR `cr` in
    (None: it may be). Nothing in it proves who wrote it (namespace editors may write
    ConfigMaps), but its age does: the earlier version ran before the RouteRevision CRD."""
    meta = cm.get("metadata") or {}
    if kind is None:
        return f"its label {LEGACY_LABEL} names no kind slo-api serves"
    if cr is None:
        return "no owner reference names a CR of that kind by its uid"
    if meta.get("name") != legacy_name(kind.name, str((cr.get("metadata") or {}).get("name"))):
        return "not named as the earlier version named its CR's history"
    refs = [r for r in meta.get("ownerReferences") or [] if isinstance(r, dict)]
    if not any(r.get("uid") == uid_of(cr) for r in refs):
        return "not owned by its CR"
    created = _timestamp(meta.get("creationTimestamp"))
    if since is None:
        return f"the age of the CRD {REVISIONS_CRD} is not known"
    if created is None or not created < since:
        return f"made no earlier than the CRD {REVISIONS_CRD}: not by an earlier version"
    if _decimal(resource_version(cr)) is None:
        # Opaque in general; the earlier version's ids were its CRs' resourceVersions, which
        # it ordered as numbers: with a CR's not one, no id can be checked against it.
        return "its CR's resourceVersion is not a number, so no id can be checked"
    return None


def _legacy_raw(cm: Obj) -> list[Any]:
    raw = (cm.get("data") or {}).get("entries")
    try:
        value = orjson.loads(raw) if isinstance(raw, str) and raw else []
    except orjson.JSONDecodeError:
        return [raw]
    return value if isinstance(value, list) else [value]


def _text(value: Any, *, optional: bool = False) -> bool:
    if value is None:
        return optional
    return isinstance(value, str) and len(value) <= VALUE_CAP


def _legacy_entry(raw: Any, kind: Kind, rv: str) -> tuple[Obj | None, str]:
    """An earlier version's entry as a revision holds it (values capped as new ones are, and
    `migrated`), or None and why it is not one that version wrote."""
    if not isinstance(raw, dict):
        return None, "not an object"
    extra = sorted(str(k) for k in raw if k not in LEGACY_KEYS)
    if extra:
        return None, f"keys no earlier version wrote: {', '.join(extra)[:80]}"
    ident = _decimal(raw.get("id"))
    if ident is None:
        return None, "its id is not a resourceVersion"
    if not rv or not _not_after(ident, rv):
        return None, "its id is after the CR's current resourceVersion"
    if not all(_text(raw.get(k)) for k in ("time", "actor", "via")) or not _text(
        raw.get("requestId"), optional=True
    ):
        return None, "time, actor, via or requestId is not a string of at most 8 KiB"
    owned = OWNED.get(kind.name, ())
    changes = raw.get("changes")
    if not isinstance(changes, list) or not all(
        isinstance(c, dict) and set(c) <= LEGACY_CHANGE_KEYS and c.get("field") in owned
        for c in changes
    ):
        return None, "its changes are not a list of {field, from, to} of the kind's fields"
    after = raw.get("after")
    tops = {"route", "kind", *(f.split(".")[0] for f in owned)}
    if not isinstance(after, dict) or not set(after) <= tops:
        return None, "its after is not a body of the kind"
    if not isinstance(after.get("pool", {}), dict):
        return None, "its after's pool is not an object"
    body: Obj = {}
    for name, value in after.items():
        if name == "pool":
            body[name] = {str(k): capped(v) for k, v in value.items()}
        else:
            body[name] = value if name in ("route", "kind") else capped(value)
    if not all(_text(body.get(k)) for k in ("route", "kind")):
        return None, "its after names no route and kind"
    return {
        "id": ident,
        "time": raw["time"],
        "actor": raw["actor"],
        "via": raw["via"],
        "requestId": raw.get("requestId"),
        "clientRequestId": None,
        "changes": [
            {"field": c["field"], "from": capped(c.get("from")), "to": capped(c.get("to"))}
            for c in changes
        ],
        "after": body,
        "migrated": True,
    }, ""


def _key(cm: Obj) -> tuple[str, str, str]:
    meta = cm.get("metadata") or {}
    return (str(meta.get("namespace")), str(meta.get("name")), str(meta.get("resourceVersion")))


def _where(cm: Obj) -> str:
    meta = cm.get("metadata") or {}
    return f"history ConfigMap {meta.get('namespace')}/{meta.get('name')}"
