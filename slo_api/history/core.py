"""A route's history: who changed its client-owned fields, when, from what, and the body after.

Where it lives: one immutable `RouteRevision` per change (see revisions.py),
owned by the CR and named from its uid and the resourceVersion the change made. No value is
stored beyond `VALUE_CAP` bytes (a larger one is kept as its sha256 and size), so no revision
can grow past what the API server stores and no route's history can stop recording.

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
  replica whose own write finds such a placeholder replaces it (see attribution.py).
A relist shows a new state without the ones between: the change recorded is from the last
state observed to the listed one; where it ends at this replica's write, it is split at the
state the write was made on (the caller's part from there, see Mine.split), and a revision of
the same version made from consecutive states (by a replica that saw them) replaces it. A read
waits only for this replica's own writes.

Beside each change, the GitOps owners in effect after it (see slo_api/ownership.py), for the
write guard (`remembered`): those the last state's managedFields name are read from the
index's entry of it again when asked; only the rest, owners whose field another manager took
(which no state names), are kept in memory per CR. They are read back from the newest revision
after a restart for the CRs that carry a GitOps marker.

History kept by earlier versions in ConfigMaps is carried over into revisions once, and read
beside them until then (see legacy.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from hashlib import blake2b
from typing import Any

import orjson

from slo_api.bounded import BoundedDict, Shared
from slo_api.history.attribution import (
    SELF,
    UNKNOWN,
    Mine,
    Parts,
    Who,
    changed_by,
    who,
    writer,
)
from slo_api.history.changes import Change, diff, generation, owned_fields, state_digest
from slo_api.history.legacy import Legacy
from slo_api.history.revisions import (
    ROLE,
    Revisions,
    across_relist,
    data_of,
    is_placeholder,
    order,
    owners_of,
    repeats,
)
from slo_api.index import Entry, Name, exact, group_of, resource_version, uid_of
from slo_api.kinds.base import Kind, Obj
from slo_api.kube import Kube, KubeError, log_failure
from slo_api.managed_fields import Fact, last_changed, without_managed_fields
from slo_api.metrics import Metrics
from slo_api.ownership import Owner, Ownership
from slo_api.service import Target
from slo_api.upstream import failure

log = logging.getLogger("slo_api.history")

# This replica's own writes remembered by resourceVersion until their event arrives.
MINE_KEPT = 4096
# Who made the recent changes the informers saw, by resourceVersion (the change stream's `by`).
BY_KEPT = 4096
# CRs first seen in a list looked at per turn of the event loop (about 30 ms of decoding).
FIRSTS_AT_ONCE = 1000
# Reads of the newest revision of GitOps-marked CRs after a restart, at once.
SEEDS_AT_ONCE = 4
# Recordings stored at once (each a create, and a prune once the CR may hold more than the
# bound): a GitOps sync that changes 10,000 CRs is recorded a few at a time, not as 10,000
# requests at once, each a task holding its change while it waits for a connection (a peak
# the pod's memory limit would have to hold, and containers grown for it that never shrink).
# Each storer keeps a TLS connection to the API server open, whose buffers (256 KiB) the
# allocator keeps once it closes; a recording waiting holds its change (a KB or two). So
# STORERS at once, and one more for each BACKLOG_PER_STORER waiting, up to STORES_AT_ONCE:
# on a busy API server fewer let a sync's backlog grow past what the connections cost.
STORERS = 4
BACKLOG_PER_STORER = 256
STORES_AT_ONCE = 8
# What a recording reads of a CR (see revisions.revision_of): the rest is not kept for it.
_RECORDED = ("apiVersion", "kind", "metadata", "spec")
# Distinct GitOps owners shared among the CRs that remember them (see History._keep).
OWNERS_SHARED = 4096
# Bytes that tell a state's JSON still holds managedFields (the index keeps them apart as
# facts: see Entry.managed, unless they would not give the same entries back).
_MANAGED_KEY = b'"managedFields"'
# A CR's GitOps owners as the history keeps them (see History._keep): most CRs that keep any
# keep one, held as it is (a tuple of one costs 56 bytes more per CR).
Kept = Owner | tuple[Owner, ...]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _encoded(fields: dict[str, Any]) -> bytes | dict[str, Any]:
    """Client-owned fields as a state observed without the index's entry keeps them: their
    JSON, a fraction of what the decoded values cost; the values themselves should one not
    encode (an integer beyond 64 bits)."""
    try:
        return exact(orjson.dumps(fields))
    except TypeError:
        return fields


# The digest of a state first seen in a list, its fields not read yet (a digest is never < 0),
# and not looked at (see History._first_sight) either; LOOKED: looked at since.
UNREAD = -1
LOOKED = -2
# The digest's key: without it nobody can make two values of a CR's client-owned fields that
# digest alike (a change the history would then skip as none); it never leaves the process.
_DIGEST_KEY = os.urandom(16)


def _digest(encoded: bytes | dict[str, Any]) -> int | None:
    """What tells two states' client-owned fields (see _encoded) apart without keeping them:
    7 bytes, an int of 32 bytes where their JSON took hundreds; None for fields that do not
    encode (then they are always compared)."""
    if not isinstance(encoded, bytes):
        return None
    return int.from_bytes(blake2b(encoded, key=_DIGEST_KEY, digest_size=7).digest())


@dataclass(slots=True)
class _Seen:
    """The last state the informers observed of one CR (per API group): enough to diff.

    The state is the index's entry of it, shared, not copied: decoded only when the CR's
    client-owned fields changed (a list of 100,000 CRs decodes none of them here, a status
    update none either)."""

    uid: str | None
    # The version as its source gives it (the index's entry's, or the object's
    # resourceVersion): only ever compared for equality.
    rv: int | str | None
    # metadata.generation (None: not known, a state first seen in a list).
    gen: int | None
    # The index's entry; a state observed without one (not through an index): its
    # client-owned fields (see _encoded).
    state: Entry | bytes | dict[str, Any]
    # The client-owned fields' digest (see _digest); UNREAD or LOOKED: not read yet; None:
    # fields that do not encode.
    digest: int | None
    # When it was last changed (its managedFields' newest stamp) and the entries stamped
    # then; None: the entry's (`state`), which read the same managedFields.
    last: tuple[float, tuple[str, ...]] | None

    def stamped(self) -> tuple[float, tuple[str, ...]]:
        """When the state was last changed, and the managedFields entries stamped then."""
        if self.last is not None:
            return self.last
        state = self.state
        return (state.stamp, state.latest) if isinstance(state, Entry) else (0.0, ())

    def decoded(self, kind: Kind) -> dict[str, Any]:
        state = self.state
        if isinstance(state, Entry):
            return owned_fields(kind, state.obj())
        if isinstance(state, bytes):
            decoded: dict[str, Any] = orjson.loads(state)
            return decoded
        return state


def _managed(entry: Entry) -> tuple[Fact, ...] | None:
    """The entry's managedFields as facts (see Entry.managed); None when they are in its JSON."""
    if entry.managed or _MANAGED_KEY not in entry.json():
        return entry.managed
    return None


def _namespace(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("namespace", ""))


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
        # Per (plural, API group), then per CR: a key tuple per CR would cost 64 bytes each.
        self._seen: dict[tuple[str, str], dict[Name, _Seen]] = {}
        self._mine: BoundedDict[str, Mine] = BoundedDict(MINE_KEPT)
        self._by: BoundedDict[str, Who] = BoundedDict(BY_KEPT)
        # Few managers make most changes: one tuple each, not one per change kept.
        self._whos: Shared[Who] = Shared(OWNERS_SHARED)
        # Per CR uid, of the GitOps owners in effect after the newest change observed, those
        # its last state does not name (see _keep).
        self._remembered: dict[str, Kept] = {}
        self._shared: Shared[Owner] = Shared(OWNERS_SHARED)
        # Per CR uid: recordings of this replica's own writes under way (a read on this
        # replica waits for them, no other).
        self._recording: dict[str, set[asyncio.Future[None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Recordings waiting for one of the STORES_AT_ONCE storers, each with the future done
        # once it is stored (what a read here waits for).
        self._store_queue: deque[tuple[Callable[[], Awaitable[None]], asyncio.Future[None]]] = (
            deque()
        )
        self._storers = 0
        # Changes made by slo-api that no answer here named yet, waiting (by version), with
        # the task that records them.
        self._answers: dict[str, tuple[asyncio.Event, asyncio.Task[None]]] = {}
        # Per CR uid: this replica's writes whose change the informers have not brought yet.
        self._unseen: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}
        # CRs whose seed waits (uid, namespace), and the tasks seeding them, at most
        # SEEDS_AT_ONCE: a start seeds every marked CR, and a task each would cost more than
        # what is seeded.
        self._seed_queue: deque[tuple[str, str]] = deque()
        self._seeders = 0
        # Per CR uid whose seed (see _seed) is under way: the newest state observed since,
        # as the index keeps it (its entry, or that encoded: see _pending).
        self._seeding: dict[str, Entry | bytes] = {}
        # CRs first seen in a list, waiting to be looked at (see _first_sight).
        self._firsts: list[_Seen] = []
        self._firsts_task: asyncio.Task[None] | None = None
        self.revisions = Revisions(kube, limit, self.metrics, pause, self._newest_generation)
        self.legacy = Legacy(kube, self.kinds, self.revisions)

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    @property
    def pause(self) -> Callable[[float], Awaitable[object]]:
        """How a recording waits before it retries (see Revisions.pause)."""
        return self.revisions.pause

    @pause.setter
    def pause(self, pause: Callable[[float], Awaitable[object]]) -> None:
        self.revisions.pause = pause

    # -- what the write path and the change stream ask -------------------------------------

    def wrote(self, obj: Obj, before: Obj | None = None, kind: Kind | None = None) -> None:
        """A write through this replica, made on `before` (its precondition), was answered
        with `obj`: its change is this caller's."""
        mine, rv, uid = writer.get(), resource_version(obj), uid_of(obj)
        if mine is not None and rv:
            made_on = None
            if before is not None and kind is not None:
                # Kept for when a relist skips from an older state to this write's (see
                # Mine.split): a few hundred bytes, for the newest MINE_KEPT writes.
                made_on = (resource_version(before), orjson.dumps(owned_fields(kind, before)))
            self._mine[rv] = Mine(mine, made_on)
            pending = self._answers.get(rv)
            if pending is not None:  # its event came first, and waits for this answer
                pending[0].set()
                if uid:
                    self._own(uid, pending[1])
            gen = generation(obj)
            # The generation the informers reached, from the last state seen of the CR (its
            # answer may come after its event).
            seen = self._last_seen(obj, uid) if uid else None
            reached = seen.gen if seen is not None and seen.gen is not None else -1
            if uid and self.enabled and (gen is None or reached < gen):
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
            return who(mine.writer[0], SELF, mine.writer[1], mine.writer[2])
        found = self._by.get(key)
        return who(*found) if found is not None else None

    def tracked(self) -> set[str]:
        """The CR uids this replica keeps anything for (beyond the last state seen)."""
        return {
            *self._remembered,
            *self._unseen,
            *self._seeding,
            *self._recording,
        }

    def remembered(self, obj: Obj) -> Mapping[str, Owner]:
        """The GitOps owners in effect for the CR after its newest observed change."""
        uid = uid_of(obj)
        if not uid:
            return {}
        seen = self._last_seen(obj, uid)
        if seen is None:
            return self._owners(uid) or {}
        same = str(seen.rv) == resource_version(obj)
        return self._in_effect(seen, uid, obj if same else None) or {}

    def _last_seen(self, obj: Obj, uid: str) -> _Seen | None:
        """The last state observed of the CR `obj` is a copy of (any version), if any."""
        group, meta = group_of(obj), obj.get("metadata") or {}
        name = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        for (_, g), seens in self._seen.items():
            seen = seens.get(name) if g == group else None
            if seen is not None and seen.uid == uid:
                return seen
        return None

    def _newest_generation(self, obj: Obj) -> int | None:
        """The newest generation observed of the CR `obj` is a state of: `obj`'s own, or a
        later state's seen since; None when `obj` has none."""
        gen, uid = generation(obj), uid_of(obj)
        seen = self._last_seen(obj, uid) if uid else None
        if gen is None or seen is None or seen.gen is None:
            return gen
        return max(gen, seen.gen)

    def _owners(self, uid: str) -> dict[str, Owner] | None:
        kept = self._remembered.get(uid)
        if kept is None:
            return None
        return {owner.field: owner for owner in (kept if isinstance(kept, tuple) else (kept,))}

    def _in_effect(self, seen: _Seen, uid: str, obj: Obj | None = None) -> dict[str, Owner] | None:
        """The GitOps owners in effect after the state `seen` of CR `uid` (`obj`: that state
        decoded, if at hand): those kept, with those its managedFields name (see _keep); None
        when nothing is known of them (a state first seen in a list, not looked at yet)."""
        kept = self._owners(uid)
        state = seen.state
        if not isinstance(state, Entry) or seen.digest == UNREAD:
            return kept
        if obj is None:
            if not kept and _managed(state) == ():
                return {}
            obj = state.obj()
        return self.ownership.owners(obj, kept or {})

    def _keep(self, uid: str, owners: Mapping[str, Owner], state: object) -> None:
        """Remember what no state says of a CR's GitOps owners (in effect after `state`, as
        the history keeps it): with the index's entry of the state, only the owners whose
        field another manager took (`Owner.remembered`: its managedFields name the rest, read
        again when asked); else all of them. A tuple, each owner shared with every CR that has
        the same one (a tool applies many CRs within a second), not a dict of copies per CR;
        nothing at all for most CRs."""
        every = not isinstance(state, Entry)
        shared = self._shared
        kept = []
        for owner in owners.values():
            if not (every or owner.remembered):
                continue
            kept.append(shared.share(owner, _interned))
        if kept:
            self._remembered[uid] = kept[0] if len(kept) == 1 else tuple(kept)
        else:
            self._remembered.pop(uid, None)

    def _pending(self, obj: Obj, entry: Entry | None) -> Entry | bytes:
        """A state kept while a seed is under way: the index's entry of it (trimmed: what the
        ownership rules read); without one, the object trimmed alike, encoded."""
        return entry if entry is not None else exact(orjson.dumps(self.ownership.trim(obj)))

    def _owners_after(
        self, before: Mapping[str, Owner], old: Obj | None, new: Obj
    ) -> dict[str, Owner]:
        # The one place the ownership rule is applied to a change: a field a GitOps tool
        # applied stays the tool's after a forced write or a kubectl edit, until it applies
        # again (`before` is what was in effect after the previous observed state).
        return self.ownership.carry(before, old, new)

    def _owners_since(self, prev: _Seen | None, uid: str, new: Obj) -> dict[str, Owner]:
        """The owners in effect after the state `new` of CR `uid`, the one after `prev`."""
        if prev is None or prev.uid != uid:
            return self._owners_after({}, None, new)
        state = prev.state
        kept = self._owners(uid) or {}
        if not isinstance(state, Entry) or prev.digest == UNREAD:
            return self._owners_after(kept, None, new)
        # The owners `prev`'s managedFields name matter only for a field no GitOps manager
        # holds in `new` (a forced write or a kubectl edit took it): most changes leave every
        # such field where it was, and `prev` is not decoded for them.
        owners = self._owners_after(kept, None, new)
        named = {f for f, owner in owners.items() if not owner.remembered}
        managed = _managed(state)
        if managed is not None and self.ownership.held(managed) <= named:
            return owners
        return self._owners_after(kept, state.obj(), new)

    # -- observing -------------------------------------------------------------------------

    def observe(
        self,
        plural: str,
        group: str,
        name: Name,
        state: Obj | Entry | None,
        entry: Entry | None = None,
    ) -> None:
        """The index's observer: a state the informers saw (an event or a relist's), or None
        when the CR is gone; and the index's entry of it, kept rather than a copy."""
        kind = self.kinds.get(plural)
        if kind is None:
            return
        seens = self._seen.get((plural, group))
        if seens is None:
            seens = self._seen[(plural, group)] = {}
        if state is None:
            seen = seens.pop(name, None)
            if seen is not None:
                if seen.digest == UNREAD:
                    seen.digest = LOOKED  # gone: nothing to look at (see _look_at_firsts)
                if seen.uid:
                    self._forget(seen.uid)
            return
        prev = seens.get(name)
        if isinstance(state, Entry):
            if (
                prev is not None
                and prev.uid == state.uid
                and state.rv is not None
                and prev.rv in (state.rv, str(state.rv))
            ):
                return  # a relist's copy of what was seen: nothing to decode
            if prev is None or prev.uid != state.uid:
                if prev is not None:
                    if prev.digest == UNREAD:
                        prev.digest = LOOKED  # gone (see _look_at_firsts)
                    if prev.uid:
                        self._forget(prev.uid)  # re-created while the watch was away
                seen = seens[name] = _Seen(state.uid, state.rv, None, state, UNREAD, None)
                self._first_sight(seen)
                return
            obj, entry = state.obj(), state
        else:
            obj = state
        uid, gen = uid_of(obj), generation(obj)
        if entry is not None and entry.uid == uid:
            uid = entry.uid  # the index's string, not this event's copy of it
        if prev is not None and prev.uid == uid:
            if prev.rv == resource_version(obj):
                return  # a repeated event
            if gen is not None and prev.gen is not None and gen < prev.gen:
                return  # older than what was seen (a late event)
        fields = owned_fields(kind, obj)
        encoded = _encoded(fields)
        digest = _digest(encoded)
        kept = entry if entry is not None else encoded
        # The newest stamp: the entry's where there is one (it read the same managedFields).
        last = None if entry is not None else last_changed(obj)
        rv = state.rv if isinstance(state, Entry) else resource_version(obj)
        seens[name] = _Seen(uid, rv, gen, kept, digest, last)
        if uid is None:
            return
        if prev is not None and prev.uid and prev.uid != uid:
            self._forget(prev.uid)
        if uid in self._seeding:
            self._seeding[uid] = self._pending(obj, entry)
        if uid in self._unseen:
            self._arrived(uid, gen)
        known = uid in self._remembered
        owners = self._owners_since(prev, uid, obj)
        self._keep(uid, owners, kept)
        if prev is None or prev.uid != uid:
            # First seen here (a start, or a re-created CR): nothing to diff with. A CR at
            # generation 1 was seen from its creation on: no change of it is stored yet, so
            # there is nothing to read back (and its first change need not wait to name owners).
            if not known and gen != 1 and self.enabled and self.ownership.markers(obj):
                self._start_seed(self._pending(obj, entry), uid, _namespace(obj))
            return
        if (
            prev.digest == UNREAD  # first seen in a list, and not looked at since
            and uid not in self._seeding
            and self.enabled
            and self.ownership.markers(obj)
        ):
            self._start_seed(self._pending(obj, entry), uid, _namespace(obj))
        if prev.digest == UNREAD:
            prev.digest = LOOKED  # looked at now: not again (see _look_at_firsts)
        # Until its seed is in, this replica does not know the owners in effect: it says
        # nothing of them rather than that there are none.
        recorded = None if uid in self._seeding else owners
        if digest is not None and prev.digest == digest:
            return  # nothing client-owned changed (a status update): nothing to decode
        old = prev.decoded(kind)
        changes = diff(kind, old, fields)
        if not changes:
            return
        manager, when = changed_by(prev.stamped(), obj, [c["field"] for c in changes])
        gap = state_digest(old) if isinstance(state, Entry) else None
        # Only what a revision is made of (not managedFields nor status, most of a decoded
        # CR): the recording may wait for a storer, and a GitOps sync queues thousands.
        made_of = without_managed_fields({k: obj[k] for k in _RECORDED if k in obj})
        change = Change(kind, exact(orjson.dumps(made_of)), changes, when or _now(), gap)
        version = resource_version(obj)
        mine = self._mine.get(version)
        parts = mine.split(change) if mine is not None else None
        if mine is not None and parts is not None:
            self._spawn_mine(uid, mine, parts, recorded)
            return
        actor = UNKNOWN if manager == SELF else manager
        told: Who = (actor, manager, None, None)
        self._by[version] = self._whos.share(told)
        if mine is not None:
            # A relist's gap that ends at this replica's write but holds more than it, from a
            # state it cannot tell apart: it is not pinned on the caller.
            self._record(change, actor, manager, None, None, recorded)
        elif manager in (SELF, UNKNOWN):
            # Another replica's write, or this one's whose answer is still on its way: a
            # reset through slo-api (nulls for the only fields it held) leaves no slo-api
            # entry in managedFields, so a change no manager stamped may be one too.
            self._later(change, version, manager, recorded)
        else:
            self._record(change, manager, manager, None, None, recorded)

    def _start_seed(self, state: Entry | bytes, uid: str, namespace: str) -> None:
        self._seeding[uid] = state
        self._seed_queue.append((uid, namespace))
        if self._seeders < SEEDS_AT_ONCE:
            self._seeders += 1
            self._spawn(self._seeder())

    async def _seeder(self) -> None:
        try:
            while self._seed_queue:
                await self._seed(*self._seed_queue.popleft())
        finally:
            self._seeders -= 1

    def _forget(self, uid: str) -> None:
        """A CR gone (deleted, or found re-created under a new uid): nothing kept of it."""
        self._remembered.pop(uid, None)
        self._seeding.pop(uid, None)
        self._arrived(uid, None)

    def _first_sight(self, seen: _Seen) -> None:
        """A CR first seen in a list: its GitOps owners, and for a CR with a GitOps marker
        those its newest revision remembers, are looked at in the background, `FIRSTS_AT_ONCE`
        a turn of the loop (a list of 100,000 CRs must not stall it)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # an index filled outside a running service: nothing to look up
        self._firsts.append(seen)
        if self._firsts_task is None or self._firsts_task.done():
            self._firsts_task = loop.create_task(self._look_at_firsts())

    async def _look_at_firsts(self) -> None:
        while self._firsts:
            batch, self._firsts = self._firsts[:FIRSTS_AT_ONCE], self._firsts[FIRSTS_AT_ONCE:]
            for seen in batch:
                entry = seen.state
                if seen.digest != UNREAD or not isinstance(entry, Entry) or entry.uid is None:
                    continue  # gone or changed since: what was seen then is newer
                # From now on its owners are those its managedFields name (see _in_effect):
                # none is kept, as no other manager took a field from a tool yet.
                seen.digest = LOOKED
                if entry.uid in self._seeding:
                    continue
                obj = entry.obj()
                if self.enabled and self.ownership.markers(obj):
                    # The index's entry, shared, not the decoded object: a start seeds every
                    # marked CR, a few at a time.
                    self._start_seed(entry, entry.uid, entry.name[0])
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

    def _later(self, change: Change, rv: str, via: str, owners: dict[str, Owner] | None) -> None:
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
            parts = mine.split(change) if mine is not None else None
            if mine is not None and parts is not None:
                work = functools.partial(self._store_mine, mine, parts, owners)
                await self._queue(work, first=True)
            else:
                store = self.revisions.store
                await self._queue(
                    functools.partial(
                        store, change, UNKNOWN, via, None, None, owners, placeholder=True
                    )
                )

        # Not a recording a read here waits for, unless this replica's answer names it.
        self._answers[rv] = (answered, self._spawn(wait()))

    def _spawn_mine(
        self, uid: str, mine: Mine, parts: Parts, owners: dict[str, Owner] | None
    ) -> None:
        if self.enabled:
            work = functools.partial(self._store_mine, mine, parts, owners)
            self._own(uid, self._queue(work, first=True))

    async def _store_mine(self, mine: Mine, parts: Parts, owners: dict[str, Owner] | None) -> None:
        """This replica's write (see Mine.split): what came before it across a relist's gap,
        nobody's (the owners after it not known), then the caller's own change."""
        before, own = parts
        if before is not None:
            await self.revisions.store(before, UNKNOWN, UNKNOWN, None, None, None)
        if own is not None:
            await self.revisions.store(own, mine.writer[0], SELF, *mine.writer[1:], owners)

    def _record(
        self,
        change: Change,
        actor: str,
        via: str,
        request_id: str | None,
        client_request_id: str | None,
        owners: dict[str, Owner] | None,
        *,
        own: bool = False,
    ) -> None:
        if self.enabled:
            store = self.revisions.store
            done = self._queue(
                functools.partial(store, change, actor, via, request_id, client_request_id, owners),
                first=own,
            )
            uid = uid_of(change.obj) if own else None
            if uid:
                self._own(uid, done)

    def _queue(
        self, work: Callable[[], Awaitable[None]], first: bool = False
    ) -> asyncio.Future[None]:
        """Store a recording (`work`) once a storer is free (see STORERS); the future is
        done once it is. This replica's own writes go `first`: their callers' reads here
        wait for them, not for a GitOps sync's thousands."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if first:
            self._store_queue.appendleft((work, done))
        else:
            self._store_queue.append((work, done))
        if self._storers < self._storers_wanted():
            self._storers += 1
            self._spawn(self._storer())
        return done

    def _storers_wanted(self) -> int:
        waiting = len(self._store_queue)
        return min(STORES_AT_ONCE, STORERS + waiting // BACKLOG_PER_STORER)

    async def _storer(self) -> None:
        try:
            # One beyond those the backlog wants (it shrank) stops: its connection goes back
            # to the pool, to close once idle.
            while self._store_queue and self._storers <= self._storers_wanted():
                work, done = self._store_queue.popleft()
                if done.cancelled():
                    continue  # nobody waits for it any more: closing
                try:
                    await work()
                except Exception:  # a store logs its failures: this is a bug's
                    log.exception("recording a change failed")
                finally:
                    if not done.done():
                        done.set_result(None)
        finally:
            self._storers -= 1

    def _spawn(self, work: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _own(self, uid: str, task: asyncio.Future[None]) -> None:
        """`task` records this replica's own write: a read of the CR here waits for it."""
        if task.done():
            return
        waiting = self._recording.setdefault(uid, set())
        waiting.add(task)

        def done(t: asyncio.Future[None]) -> None:
            waiting.discard(t)
            if not waiting and self._recording.get(uid) is waiting:
                del self._recording[uid]

        task.add_done_callback(done)

    async def _seed(self, uid: str, namespace: str) -> None:
        """After a start: the GitOps owners a marked CR's newest revision that says remembers,
        merged with those observed since (which win), re-checked on the newest state observed
        (the index's copy)."""
        if uid not in self._seeding:
            return
        try:
            try:
                entries = [data_of(r) for r in await self.revisions.listed(namespace, uid)]
            except KubeError as exc:
                log_failure(log, exc, f"reading the history of a CR in {namespace}", ROLE)
                return
            held = self._seeding.get(uid)
            if held is None:
                return  # gone meanwhile
            current: Obj = held.obj() if isinstance(held, Entry) else orjson.loads(held)
            told = [e for e in entries if isinstance(e.get("owners"), dict)]
            newest = max(told, key=order, default=None)
            seeded = owners_of(newest) if newest is not None else {}
            # Those in effect now win: of them, what `current` names is named again below.
            merged = {**seeded, **(self._owners(uid) or {})}
            owners = self._owners_after(merged, None, current)
            self._keep(uid, owners, held)
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
            items = await self.revisions.listed(target.namespace, target.uid)
        except KubeError as exc:
            raise failure(exc, "reading a route's history", ROLE) from None
        entries: dict[str, Obj] = {}
        # Per change, whether it was made across a relist's gap: all its copies were (a
        # replacement's are not).
        across: dict[str, bool] = {}
        for item in items:
            e = data_of(item)
            ident = str(e.get("id"))
            # One entry per change: a replacement (or its spare copy) over a placeholder.
            held = entries.get(ident)
            if e and (held is None or is_placeholder(held)):
                entries[ident] = e
            across[ident] = across.get(ident, True) and across_relist(item)
        if self.legacy.left is not False:
            for e in await self.legacy.entries(target):
                entries.setdefault(str(e.get("id")), e)
        oldest = sorted(entries.values(), key=order)
        repeated = repeats([(e, across.get(str(e.get("id")), False)) for e in oldest])
        out = [e for e, repeat in zip(oldest, repeated, strict=True) if not repeat][::-1]
        out = out[: self.limit] if self.limit else out
        return [{**e, "migrated": e.get("migrated") is True} for e in out]

    # -- carrying over the ConfigMaps of earlier versions ----------------------------------

    async def migrate(self, namespaces: tuple[str, ...] | None = None) -> int:
        """Carry every ConfigMap history an earlier version wrote over into revisions (see
        legacy.py); returns the entries carried."""
        return await self.legacy.migrate(namespaces)

    async def close(self) -> None:
        """Let the recordings under way finish, those waiting out their grace included
        (bounded by the grace and the upstream timeout)."""
        if self._firsts_task is not None:
            self._firsts_task.cancel()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace + self.kube.timeout
        # Again while any is left: one waiting out its grace hands its store to a storer.
        while (pending := list(self._tasks)) and (left := deadline - loop.time()) > 0:
            await asyncio.wait(pending, timeout=left)
        for task in list(self._tasks):
            task.cancel()
        for _, done in self._store_queue:
            done.cancel()
        self._store_queue.clear()


def _interned(owner: Owner) -> Owner:
    """`owner` with its strings interned, not the event's own copies: a handful of managers,
    operations and fields name every owner kept (each second's CRs share one, not all CRs)."""
    by = owner.overridden_by
    return replace(
        owner,
        field=sys.intern(owner.field),
        manager=sys.intern(owner.manager),
        operation=sys.intern(owner.operation),
        overridden_by=None if by is None else sys.intern(by),
    )
