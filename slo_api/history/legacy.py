"""History kept by earlier versions in one ConfigMap per CR (label `LEGACY_LABEL`), carried
over into revisions once (`Legacy.migrate`, by any replica, idempotently) and each ConfigMap
deleted once carried; until then reads show its entries too (`Legacy.entries`).

Nothing in a ConfigMap proves who wrote it (the built-in `edit` role may write one), but its
age does: only a ConfigMap older than the RouteRevision CRD, named and owned as the earlier
version did for a CR, is carried (see `_refusal`), and of it only entries as that version
wrote them (see `_legacy_entry`); each carried revision says `migrated`.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime
from typing import Any

import orjson

from slo_api.history.attribution import SELF, UNKNOWN
from slo_api.history.changes import OWNED, VALUE_CAP, capped
from slo_api.history.revisions import (
    GROUP,
    REVISIONS,
    ROLE,
    Revisions,
    data_of,
    is_placeholder,
    passing,
    revision_of,
)
from slo_api.index import resource_version, uid_of
from slo_api.kinds.base import Kind, Obj
from slo_api.kube import Kube, KubeError, log_failure
from slo_api.service import Target
from slo_api.upstream import failure

log = logging.getLogger("slo_api.history")

# Where earlier versions kept a CR's history (one ConfigMap per CR): carried over, then gone.
LEGACY_LABEL = f"{GROUP}/history-of"
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


class Legacy:
    """The ConfigMaps of earlier versions: read beside revisions until carried over."""

    def __init__(self, kube: Kube, kinds: dict[str, Kind], revisions: Revisions) -> None:
        self.kube = kube
        self.kinds = kinds
        self.revisions = revisions
        # ConfigMaps of earlier versions not carried over yet (None: not looked for yet).
        self.left: bool | None = None
        # When the RouteRevision CRD was made (None: not known, so nothing is carried); read once.
        self._revisions_since: datetime | None = None
        self._crd_read = False
        # ConfigMaps and entries of earlier versions left alone, each logged once.
        self._noted: set[tuple[str, ...]] = set()

    async def entries(self, target: Target) -> list[Obj]:
        """The entries an earlier version kept for this CR in its ConfigMap, if still there
        and one it wrote (see `_refusal`)."""
        since = await self._crd_created()
        wanted = legacy_name(target.kind.name, target.name)
        for cm in await self._maps(target.namespace):
            if (cm.get("metadata") or {}).get("name") != wanted:
                continue
            why = _refusal(cm, target.kind, target.obj, since)
            if why is not None:
                self._left_alone(cm, why)
                return []
            return self._carried_entries(cm, target.kind, target.obj)
        return []

    async def _page(self, namespace: str | None, continue_: str | None = None) -> Obj:
        try:
            return await self.kube.list_config_maps(namespace, LEGACY_LABEL, continue_=continue_)
        except KubeError as exc:
            if exc.status in (403, 404):
                if exc.status == 403 and self.left is None:
                    log.warning(
                        "may not list ConfigMaps: history kept by an earlier version, if any "
                        "is left, is not carried over (docs/upgrade.md: "
                        "slo-api:history-migration)"
                    )
                    self.left = False
                return {}  # the grant dropped once carried: nothing to carry
            raise failure(
                exc, "reading the history of an earlier version", MIGRATION_ROLE
            ) from None

    async def _maps(self, namespace: str | None) -> list[Obj]:
        page = await self._page(namespace)
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
                page = await self._page(namespace, continue_)
                for cm in page.get("items") or []:
                    if isinstance(cm, dict):
                        carried += await self._carry(cm, since)
                continue_ = (page.get("metadata") or {}).get("continue") or None
                if not continue_:
                    break
        self.left = False
        if carried:
            log.info("carried %d history entries over from ConfigMaps into revisions", carried)
        return carried

    async def _carry(self, cm: Obj, since: datetime) -> int:
        meta = cm.get("metadata") or {}
        namespace = str(meta.get("namespace", ""))
        kind, cr = await self._owner(cm)
        why = _refusal(cm, kind, cr, since)
        if why is not None or kind is None or cr is None:
            self._left_alone(cm, why or "")
            return 0
        entries = self._carried_entries(cm, kind, cr)
        left = len(_legacy_raw(cm)) - len(entries)
        carried = 0
        for entry in entries:
            body = revision_of(kind, cr, entry)
            try:
                await self._carry_one(body, entry)
                carried += 1
            except KubeError as exc:
                if passing(exc):
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
        seen = data_of(held)
        if not is_placeholder(seen):
            return
        named = {
            **seen,
            "actor": entry["actor"],
            "requestId": entry["requestId"],
            "clientRequestId": None,
            "via": SELF,
            "migrated": True,
        }
        await self.revisions.replace({**body, "data": orjson.dumps(named).decode()}, held)

    async def _owner(self, cm: Obj) -> tuple[Kind | None, Obj | None]:
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
