"""A route's history: who changed its client-owned fields, when, from what, and the body after.

Where it lives: one ConfigMap per CR whose fields ever changed, in the CR's namespace, owned by
the CR (an ownerReference, so the garbage collector removes it with the CR). Its `entries` key
holds the last `ROUTE_HISTORY_ENTRIES` changes as a JSON list, oldest first. A CR that never
changed has no ConfigMap, and nothing is held in memory: a read is one GET.

Who records what, so that every change is kept once:
- a write through slo-api is recorded by the replica that made it, which alone knows the
  caller and the request id (`record_write`);
- every replica's informer sees every change (`observe`), and records only those whose field
  manager (from `managedFields`) is not slo-api: changes made around it.
Both replicas that see a change around slo-api record the same entry (its id is the CR's
resourceVersion, and the ConfigMap is owned by the CR's uid): the store is a read followed by a
create or a conditional update (resourceVersion), and an entry already there is a no-op, so the
second writer changes nothing.

Recording happens off the request path, by one task per ConfigMap that stores whatever is
pending for it at once (so a replica's own entries never race each other, and a route changed
many times a second costs a read and a write per round trip); a read on that replica waits for
that task first, so a caller reads its own change.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import orjson

from slo_api.bounded import BoundedDict
from slo_api.index import resource_version, rv_number, uid_of
from slo_api.kinds.base import Kind, Obj, spec
from slo_api.kube import Kube, KubeError, log_failure
from slo_api.metrics import Metrics
from slo_api.service import Target
from slo_api.upstream import failure

log = logging.getLogger("slo_api.history")

# The field manager slo-api's own writes carry (kube.Kube.patch).
SELF = "slo-api"
STORE_ATTEMPTS = 5
# What to check when the API server refuses slo-api the history's ConfigMaps.
ROLE = "that it may get, create and update configmaps (ClusterRole slo-api:history)"
LABEL = "slo-api.modelsphere.dev/history-of"
MAX_NAME = 253
# Who made the most recent changes seen by the informers, by resourceVersion: what the change
# stream says (`by`) of a change made around slo-api, or through another replica.
BY_KEPT = 4096

# The caller and request id of the write this request is making: a change the index stores
# while it is set (the write's own result) came from this replica's caller.
writer: contextvars.ContextVar[tuple[str, str | None] | None] = contextvars.ContextVar(
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


def owned_body(kind: Kind, obj: Obj) -> Obj:
    """The route's body restricted to what a client may change: what a revert PUTs back."""
    fields = owned_fields(kind, obj)
    body: Obj = {"route": kind.route_of(obj), "kind": kind.name}
    for name, value in fields.items():
        if name.startswith("pool."):
            body.setdefault("pool", {})[name[len("pool.") :]] = value
        else:
            body[name] = value
    return body


def changes_between(kind: Kind, before: Obj, after: Obj) -> list[Obj]:
    """Each client-owned field that differs, with its value before and after (None: unset)."""
    old, new = owned_fields(kind, before), owned_fields(kind, after)
    return [
        {"field": name, "from": old.get(name), "to": new.get(name)}
        for name in OWNED.get(kind.name, ())
        if old.get(name) != new.get(name)
    ]


def _spec_key(field: str) -> str:
    return field.removeprefix("pool.")


def changed_by(obj: Obj, fields: list[str]) -> tuple[str, str | None]:
    """The field manager that made the latest change to `fields`, and when.

    An Update moves the ownership of the fields it changes to its manager, so the manager that
    now owns a changed field is the one that changed it. A field removed is owned by nobody:
    then the manager whose entry was touched last (entries carry the time of their last change).
    """
    entries = [
        e
        for e in (obj.get("metadata") or {}).get("managedFields") or []
        if isinstance(e, dict) and not e.get("subresource")
    ]
    keys = {"f:" + _spec_key(f) for f in fields}
    owners = [
        e for e in entries if keys & set(((e.get("fieldsV1") or {}).get("f:spec") or {}).keys())
    ]
    chosen = max(owners or entries, key=lambda e: str(e.get("time") or ""), default=None)
    if chosen is None:
        return "unknown", None
    time = chosen.get("time")
    return str(chosen.get("manager") or "unknown"), str(time) if time else None


def history_name(kind: Kind, name: str) -> str:
    """The ConfigMap holding a CR's history: readable, and within a name's 253 characters."""
    full = f"slo-history.{kind.name}.{name}"
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.blake2b(name.encode(), digest_size=8).hexdigest()
    return f"{full[: MAX_NAME - len(digest) - 1].rstrip('.-')}.{digest}"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _order(entry: Obj) -> int:
    ident = str(entry.get("id", ""))
    return int(ident) if ident.isdigit() else -1


def _owner(obj: Obj, api_version: str) -> Obj:
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": api_version,
        "kind": str(obj.get("kind", "")),
        "name": str(meta.get("name", "")),
        "uid": uid_of(obj) or "",
    }


def _entries(cm: Obj) -> list[Obj]:
    raw = (cm.get("data") or {}).get("entries")
    try:
        value = orjson.loads(raw) if raw else []
    except orjson.JSONDecodeError:
        meta = cm.get("metadata") or {}
        log.warning(
            "history ConfigMap %s/%s holds unreadable entries: starting it again",
            meta.get("namespace"),
            meta.get("name"),
        )
        return []
    return [e for e in value if isinstance(e, dict)] if isinstance(value, list) else []


def _owned_by(cm: Obj, uid: str) -> bool:
    refs = (cm.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(r, dict) and r.get("uid") == uid for r in refs)


class History:
    def __init__(
        self, kube: Kube, kinds: list[Kind], limit: int, metrics: Metrics | None = None
    ) -> None:
        self.kube = kube
        self.metrics = metrics or Metrics()
        self.kinds = {k.resource.plural: k for k in kinds}
        self.limit = limit
        # Per ConfigMap: entries waiting to be stored, and the one task storing them.
        self._pending: dict[tuple[str, str], list[tuple[Obj, Kind, Obj]]] = {}
        self._workers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._by: BoundedDict[int, Obj] = BoundedDict(BY_KEPT)
        # Writes under way through this replica, by CR: their informer event may be stored
        # before their result, outside the request (then who made it is known from here).
        self._writing: dict[tuple[str, str, str], tuple[str, str | None]] = {}

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def by(self, rv: int) -> Obj | None:
        """Who made the change the index is storing now (at resourceVersion `rv`), as the
        history records it: the caller and request id for a write through this replica, the
        field manager for a change seen by the informers (through another replica: only
        `slo-api`); None when unknown or when it is no recorded change."""
        if not self.enabled:
            return None
        mine = writer.get()
        if mine is not None:
            return {"actor": mine[0], "via": SELF, "requestId": mine[1]}
        return self._by.get(rv)

    @contextlib.contextmanager
    def writing(self, target: Target, actor: str, request_id: str | None) -> Iterator[None]:
        """Around a write through this replica: whom a change of its CR is attributed to."""
        key = (target.kind.resource.plural, target.namespace, target.name)
        self._writing[key] = (actor, request_id)
        try:
            yield
        finally:
            self._writing.pop(key, None)

    def _seen(self, plural: str, obj: Obj, manager: str) -> None:
        meta = obj.get("metadata") or {}
        rv = rv_number(obj)
        if rv is None:
            return
        actor, request_id = None if manager == SELF else manager, None
        if manager == SELF:
            mine = self._writing.get((plural, str(meta.get("namespace")), str(meta.get("name"))))
            if mine is not None:
                actor, request_id = mine
        self._by[rv] = {"actor": actor, "via": manager, "requestId": request_id}

    # -- recording -------------------------------------------------------------------------

    def record_write(
        self, target: Target, before: Obj, after: Obj, actor: str, request_id: str | None
    ) -> None:
        """A change made through slo-api, attributed to its caller (recorded in the background)."""
        if not self.enabled:
            return
        changes = changes_between(target.kind, before, after)
        if not changes:
            return
        entry = self._entry(target.kind, after, actor, SELF, request_id, changes, _now())
        self._enqueue(target.kind, after, target.api_version, entry)

    def observe(self, plural: str, old: Callable[[], Obj], new: Obj) -> None:
        """The index's update observer: record a change made around slo-api."""
        kind = self.kinds.get(plural)
        if kind is None or not self.enabled:
            return
        before = old()
        if spec(before) == spec(new):  # status, labels, ...: not the client's fields
            return
        changes = changes_between(kind, before, new)
        if not changes:
            return
        manager, when = changed_by(new, [c["field"] for c in changes])
        self._seen(plural, new, manager)
        if manager == SELF:  # the replica that wrote it records it, with the caller
            return
        entry = self._entry(kind, new, manager, manager, None, changes, when or _now())
        self._enqueue(kind, new, str(new.get("apiVersion", "")), entry)

    @staticmethod
    def _entry(
        kind: Kind,
        after: Obj,
        actor: str,
        via: str,
        request_id: str | None,
        changes: list[Obj],
        when: str,
    ) -> Obj:
        return {
            "id": resource_version(after),
            "time": when,
            "actor": actor,
            "via": via,
            "requestId": request_id,
            "changes": changes,
            "after": owned_body(kind, after),
        }

    def _enqueue(self, kind: Kind, obj: Obj, api_version: str, entry: Obj) -> None:
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace", ""))
        key = (namespace, history_name(kind, str(meta.get("name", ""))))
        self._pending.setdefault(key, []).append((_owner(obj, api_version), kind, entry))
        if key not in self._workers:
            self._workers[key] = asyncio.create_task(self._drain(key), name=f"history-{key[1]}")

    async def _drain(self, key: tuple[str, str]) -> None:
        """Store what is pending for one ConfigMap, all of it at once, until nothing is.

        Entries that arrive while a store is under way wait for the next one: a route written
        many times a second costs one read and one write of its history per round trip, not
        per change.
        """
        try:
            while batch := self._pending.pop(key, None):
                # One store per CR (uid): a batch rarely spans a delete and re-create.
                start = 0
                for end in range(1, len(batch) + 1):
                    if end == len(batch) or batch[end][0]["uid"] != batch[start][0]["uid"]:
                        owner, kind, _ = batch[start]
                        entries = [entry for _, _, entry in batch[start:end]]
                        try:
                            await self._store(key, owner, kind, entries)
                        except KubeError as exc:
                            self._count("failed", len(entries))
                            log_failure(
                                log, exc, "storing history entries in {}/{}".format(*key), ROLE
                            )
                        except Exception:
                            self._count("failed", len(entries))
                            log.exception("history entries could not be stored in %s/%s", *key)
                        start = end
        finally:
            del self._workers[key]

    async def _store(self, key: tuple[str, str], owner: Obj, kind: Kind, new: list[Obj]) -> None:
        namespace, name = key
        for _ in range(STORE_ATTEMPTS):
            try:
                cm: Obj | None = await self.kube.get_config_map(namespace, name)
            except KubeError as exc:
                if exc.status != 404:
                    raise
                cm = None
            # A ConfigMap left by an earlier CR of the same name (not collected yet) is reused.
            held = _entries(cm) if cm is not None and _owned_by(cm, owner["uid"]) else []
            ids = {e.get("id") for e in held}
            # Already there: recorded by the other replica, or by an earlier attempt.
            fresh = [e for e in new if e["id"] not in ids]
            if not fresh:
                self._count("already", len(new))
                return
            entries = sorted([*held, *fresh], key=_order)[-self.limit :]
            if not any(e in entries for e in fresh):
                return  # older than everything kept
            body = self._config_map(namespace, name, owner, kind, entries)
            try:
                if cm is None:
                    await self.kube.create_config_map(namespace, body)
                else:
                    version = (cm.get("metadata") or {}).get("resourceVersion")
                    body["metadata"]["resourceVersion"] = version
                    await self.kube.replace_config_map(namespace, name, body)
                self._count("stored", len(fresh))
                self._count("already", len(new) - len(fresh))
                return
            except KubeError as exc:
                # Created or changed meanwhile (by the other replica): read it again.
                if exc.status == 409:
                    continue
                raise
        self._count("failed", len(new))
        log.warning("history %s/%s kept changing: %d entries not stored", namespace, name, len(new))

    def _count(self, outcome: str, n: int) -> None:
        if n:
            self.metrics.history_entries.labels(outcome).inc(n)

    @staticmethod
    def _config_map(namespace: str, name: str, owner: Obj, kind: Kind, entries: list[Obj]) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "slo-api", LABEL: kind.name},
                "ownerReferences": [owner],
            },
            "data": {"entries": orjson.dumps(entries).decode()},
        }

    # -- reading ---------------------------------------------------------------------------

    async def read(self, target: Target) -> list[Obj]:
        """The route's history, newest first (this replica's pending entries included)."""
        key = (target.namespace, history_name(target.kind, target.name))
        pending = self._workers.get(key)
        if pending is not None:
            await asyncio.wait([pending], timeout=self.kube.timeout)
        try:
            cm = await self.kube.get_config_map(*key)
        except KubeError as exc:
            if exc.status == 404:
                return []
            raise failure(exc, "reading a route's history", ROLE) from None
        if not _owned_by(cm, target.uid):
            return []
        return sorted(_entries(cm), key=_order, reverse=True)

    async def close(self) -> None:
        """Let the entries still being stored finish (bounded by the upstream timeout)."""
        pending = list(self._workers.values())
        if pending:
            await asyncio.wait(pending, timeout=self.kube.timeout)
