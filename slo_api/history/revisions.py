"""The store of a route's revisions: one immutable `RouteRevision` per change, in the CR's
namespace, owned by the CR (the garbage collector removes them with it), labelled with the
CR's uid, and named from that uid and the resourceVersion the change made (`revision_name`):
the same change always gets the same name, so a second replica's create of it is an
AlreadyExists that changes nothing. Each CR keeps its newest `limit` revisions: whichever
replica stores one of a CR that may hold more by now then lists the CR's revisions and deletes
the oldest beyond them (see `Revisions.prune` and `Revisions.within_bound`). A placeholder (a
change no replica could attribute) and a revision made across a relist's gap give way to the
writer's own record (see `Revisions.create`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

import orjson

from slo_api import versions
from slo_api.history.attribution import SELF, UNKNOWN
from slo_api.history.changes import Change, body_of, capped, generation, owned_fields
from slo_api.index import resource_version, uid_of
from slo_api.kinds.base import Kind, Obj
from slo_api.kube import Kube, KubeError, Resource, log_failure
from slo_api.metrics import Metrics
from slo_api.ownership import Owner
from slo_api.recovery import Backoff

log = logging.getLogger("slo_api.history")

GROUP = "slo-api.modelsphere.dev"
REVISIONS = Resource(GROUP, "v1alpha1", "routerevisions")
UID_LABEL = f"{GROUP}/uid"
KIND_LABEL = f"{GROUP}/kind"
# What to check when the API server refuses slo-api its revisions.
ROLE = (
    "that it may get, list, create and delete routerevisions.slo-api.modelsphere.dev "
    "(ClusterRole slo-api:history) and that the RouteRevision CRD is installed"
)
# Where a revision replacing a placeholder is copied first (see Revisions.replace).
SPARE = ".spare"
# Deletes of a placeholder and creates in its place, while placeholders keep taking the name.
REPLACE_ATTEMPTS = 3
# How long a change is retried while the API server is away or failing before it is given up
# (and counted `failed`).
RECORD_PATIENCE = 300.0
# The longest name of an object (a DNS subdomain).
MAX_NAME = 253
# Marks a revision made across a relist's gap (from the last state observed to the listed
# one): a revision of that version made from consecutive states replaces it, so no change is
# in two revisions.
ACROSS_RELIST = f"{GROUP}/across-relist"


def revision_name(uid: str, rv: str) -> str:
    """One change's revision: the CR's uid (36 characters) and the version the change made.
    A version KEP-5504 lets compare (decimal: the names revisions have had since the first
    version, kept) is written as it is where the name stays within MAX_NAME; any other
    version is named by its digest, so every version makes a valid name (an `x` first: no
    decimal version is ever taken for one)."""
    if versions.comparable(rv) and len(uid) + 1 + len(rv) <= MAX_NAME:
        return f"{uid}.{rv}"
    return f"{uid}.x{hashlib.sha256(rv.encode()).hexdigest()[:40]}"


def order(entry: Obj) -> tuple[int, str, int, str]:
    """Oldest first. Versions that compare (KEP-5504) sort as they compare: the order they
    were made. Any other version sorts after them by when the change was made, then by its
    text. `time` alone cannot order comparable versions: it comes from different clocks (a
    manager's managedFields stamp, or the second a replica saw a change no manager stamped),
    so two changes made within a second of each other could swap."""
    ident = str(entry.get("id", ""))
    key = versions.key(ident)
    if key is not None:
        return 0, "", *key
    return 1, str(entry.get("time") or ""), len(ident), ident


def owners_json(owners: Mapping[str, Owner]) -> Obj:
    return {
        f: {"manager": o.manager, "operation": o.operation, "time": o.time}
        for f, o in sorted(owners.items())
    }


def owners_of(entry: Obj) -> dict[str, Owner]:
    raw = entry.get("owners")
    if not isinstance(raw, dict):
        return {}
    return {
        str(f): Owner(str(f), str(o.get("manager")), str(o.get("operation")), str(o.get("time")))
        for f, o in raw.items()
        if isinstance(o, dict)
    }


def passing(exc: KubeError) -> bool:
    """A failure that passes: the API server unreachable, timing out, busy or failing."""
    return exc.status in (0, 429) or exc.status >= 500


def across_relist(revision: Obj) -> bool:
    annotations = (revision.get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(ACROSS_RELIST) == "true")


def data_of(revision: Obj) -> Obj:
    raw = revision.get("data")
    try:
        value = orjson.loads(raw) if isinstance(raw, str) else None
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def repeats(oldest_first: Sequence[tuple[Obj, bool]]) -> list[bool]:
    """Which of a CR's entries (oldest first, each with whether its revision was made across
    a relist's gap) repeat what the ones before them hold: one made across a gap whose
    `after` is what the entry before it left. Such a revision is named for the version its
    replica's relist showed, which may come after the gap's last change (a status update
    since), while another replica that saw the states one by one recorded each change at its
    own version: the gap's revision folds them again. One left by a change nobody else
    recorded shows fields the entry before it does not."""
    out: list[bool] = []
    last: object = None
    for entry, across in oldest_first:
        after = entry.get("after")
        repeat = across and last is not None and after == last
        out.append(repeat)
        if not repeat:
            last = after
    return out


def is_placeholder(entry: Obj) -> bool:
    """A revision no replica could attribute when it was made (`unknown`, via slo-api or not:
    a reset through slo-api may leave no slo-api manager in managedFields for another replica
    to see), which the writer's own record, or a carried entry naming the caller, replaces."""
    return entry.get("actor") == UNKNOWN and not entry.get("migrated")


def entry_of(
    change: Change,
    actor: str,
    via: str,
    request_id: str | None,
    client_request_id: str | None,
    owners: Mapping[str, Owner] | None,
) -> Obj:
    kind, obj = change.kind, change.obj
    after = owned_fields(kind, obj) if change.fields is None else change.fields
    return {
        "id": change.version or resource_version(obj),
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
        "owners": None if owners is None else owners_json(owners),
    }


def revision_of(kind: Kind, obj: Obj, entry: Obj, *, across: bool = False) -> Obj:
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


class Revisions:
    """A CR's revisions in the API server: stored (retried while the API server is away),
    replaced, listed and pruned to the newest `limit`."""

    def __init__(
        self,
        kube: Kube,
        limit: int,
        metrics: Metrics,
        pause: Callable[[float], Awaitable[object]] | None = None,
        newest_generation: Callable[[Obj], int | None] = generation,
    ) -> None:
        self.kube = kube
        self.limit = limit
        self.metrics = metrics
        # The newest generation observed of the CR a state is of (see within_bound).
        self.newest_generation = newest_generation
        # How a recording waits before it retries: the runtime's wakes when the API server
        # answers again after an outage (True then), so no outage-grown backoff is slept out.
        self.pause: Callable[[float], Awaitable[object]] = pause or asyncio.sleep

    async def store(
        self,
        change: Change,
        actor: str,
        via: str,
        request_id: str | None,
        client_request_id: str | None,
        owners: Mapping[str, Owner] | None,
        *,
        placeholder: bool = False,
    ) -> None:
        entry = entry_of(change, actor, via, request_id, client_request_id, owners)
        obj, across = change.obj, change.gap is not None  # decoded once, not per use
        body = revision_of(change.kind, obj, entry, across=across)
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
                    stored = await self.create(
                        body, replaces=via == SELF and actor != UNKNOWN and not placeholder
                    )
                    self.count("stored" if stored else "already")
                    if not stored:
                        return
                if not self.within_bound(obj, across):
                    await self.prune(namespace, uid_of(obj) or "")
                return
            except KubeError as exc:
                delay = exc.retry_after or backoff.next()
                # The API server away, or busy, or just restarted and not serving revisions
                # yet (404: the CR's namespace exists, it was just observed): the change waits
                # for it (a while), rather than be lost from the history.
                if (passing(exc) or exc.status == 404) and loop.time() + delay < given_up_at:
                    if not retried:  # once, not at every retry
                        log_failure(log, exc, f"{doing} of {namespace}/{name}", ROLE)
                    retried = True
                    if await self.pause(delay):
                        backoff.reset()  # woken as the API server answers again
                    continue
                if not stored:
                    self.count("failed")
                log_failure(log, exc, f"{doing} of {namespace}/{name}", ROLE)
                return
            except Exception:
                if not stored:
                    self.count("failed")
                log.exception("%s of %s failed", doing, namespace)
                return

    async def create(self, body: Obj, *, replaces: bool) -> bool:
        """Create a revision; False when it exists already (another replica's). With
        `replaces` (this replica's own write), a placeholder another replica left for it
        (`unknown`: it could not tell whose it was) gives way to it; and one made across a
        relist's gap gives way to one made from consecutive states."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        across = across_relist(body)
        try:
            await self.kube.create(REVISIONS, namespace, body)
            return True
        except KubeError as exc:
            if exc.status != 409:
                raise
            if not replaces and across:
                return False
        held = await self.kube.get(REVISIONS, namespace, name)
        if not (
            (replaces and is_placeholder(data_of(held))) or (across_relist(held) and not across)
        ):
            return False
        return await self.replace(body, held)

    async def replace(self, body: Obj, held: Obj) -> bool:
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
            if not is_placeholder(data_of(held)):
                break  # another replica's replacement: the copy is not needed
        else:
            return False  # a placeholder holds the name still: the copy is what is read
        with contextlib.suppress(KubeError):
            await self.kube.delete(REVISIONS, namespace, name + SPARE)
        return replaced

    async def listed(self, namespace: str, uid: str) -> list[Obj]:
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

    def within_bound(self, obj: Obj, across: bool) -> bool:
        """Whether the CR that `obj` is a state of cannot hold more than `limit` revisions
        yet, so storing a change to `obj` (`across` a relist's gap or not) needs no prune.
        Its client-owned fields are all in its spec, so each revision is a change of the
        spec, which the API server counts in `metadata.generation` (1 at creation): a CR at
        generation g has had at most g - 1. The newest generation observed of the CR, not
        `obj`'s own: a change stored late (behind a newer one that was pruned meanwhile) is
        pruned too. A revision made across a relist's gap is named for the listed version,
        which may come after its change's (a status update since), while another replica
        names it for the change's own: always pruned."""
        gen = self.newest_generation(obj)
        return gen is not None and gen - 1 <= self.limit and not across

    async def prune(self, namespace: str, uid: str) -> None:
        """Keep the CR's newest `limit` changes, whichever replica recorded each: after a
        revision stored (of a CR that may hold more: see `within_bound`), the CR's
        revisions are listed (as the API server holds them: at most `limit` and the few
        recorded meanwhile) and the oldest beyond the bound deleted, with any that repeat
        the ones before them (see `repeats`). A change's spare copy (see `replace`) counts
        with it and goes with it."""
        changes: dict[str, list[Obj]] = {}
        for item in await self.listed(namespace, uid):
            changes.setdefault(str(data_of(item).get("id")), []).append(item)
        oldest_first = sorted(changes.values(), key=lambda copies: order(data_of(copies[0])))
        # A change's copies: made across a gap only if all are (a replacement's are not).
        repeated = repeats([(data_of(c[0]), all(map(across_relist, c))) for c in oldest_first])
        gone = [c for c, repeat in zip(oldest_first, repeated, strict=True) if repeat]
        kept = [c for c, repeat in zip(oldest_first, repeated, strict=True) if not repeat]
        for copies in gone + kept[: max(0, len(kept) - self.limit)]:
            for item in copies:
                meta = item.get("metadata") or {}
                try:
                    await self.kube.delete(
                        REVISIONS, namespace, str(meta.get("name")), uid=str(meta.get("uid", ""))
                    )
                except KubeError as exc:
                    if exc.status not in (404, 409):
                        raise

    def count(self, outcome: str) -> None:
        self.metrics.history_entries.labels(outcome).inc()
