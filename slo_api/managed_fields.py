"""Reading `metadata.managedFields`: the one place that knows its shape.

Pure functions of an object (no I/O, no state but a small table of shared tuples): which
entries are the object's own (a subresource's, such as status, hold no spec), which entry is
which (manager and operation), when each was stamped, and which fields below `spec` an entry
holds; and the object without them, or an entry of the index's making (what it keeps). The
index (when a CR last changed), the route history (who made a change) and the GitOps
ownership rules (who owns a field) all read managedFields through these.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from slo_api.bounded import Shared

Obj = dict[str, Any]


def field_entries(obj: Obj) -> list[Obj]:
    """An object's own managedFields entries: not those of subresources (status)."""
    meta = obj.get("metadata")
    entries = meta.get("managedFields") if isinstance(meta, dict) else None
    if not isinstance(entries, list):
        return []
    return [e for e in entries if isinstance(e, dict) and not e.get("subresource")]


def spec_keys(entry: Obj) -> list[str]:
    """The fields directly below `spec` that an entry holds (any part of), without `f:`."""
    fields = entry.get("fieldsV1")
    spec = fields.get("f:spec") if isinstance(fields, dict) else None
    if not isinstance(spec, dict):
        return []
    return [k[2:] for k in spec if k.startswith("f:")]


def without_managed_fields(obj: Obj) -> Obj:
    """`obj` without managedFields: a copy where it has them (`obj` is never changed), else
    `obj` itself."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


def entry_of(manager: str, operation: str, time: str, spec_fields: Iterable[str]) -> Obj:
    """A managedFields entry that holds `spec_fields` below `spec` (as `spec_keys` reads
    them back) and nothing else."""
    return {
        "manager": manager,
        "operation": operation,
        "time": time,
        "fieldsV1": {"f:spec": {f"f:{f}": {} for f in spec_fields}},
    }


def stamp_of(time: object) -> int:
    """A managedFields entry's `time` (RFC 3339, seconds) as epoch seconds; 0 when unreadable."""
    if not isinstance(time, str):
        return 0
    try:
        return int(datetime.fromisoformat(time).timestamp())
    except ValueError:
        return 0


def manager_key(entry: Obj) -> str:
    """Which managedFields entry: its manager and operation (interned: they repeat)."""
    return sys.intern(f"{entry.get('manager', '')}\0{entry.get('operation', '')}")


def last_changed(obj: Obj) -> tuple[int, tuple[str, ...]]:
    """The newest `time` among an object's managedFields entries as epoch seconds (0: none),
    and which entries (`manager_key`) carry it."""
    stamped = [(stamp_of(e.get("time")), e) for e in field_entries(obj)]
    newest = max((t for t, _ in stamped), default=0)
    keys = tuple(manager_key(e) for t, e in stamped if t == newest)
    # Few combinations of managers exist: every CR of one shares one tuple (the index holds
    # one per CR).
    return newest, _LATEST.share(keys)


_LATEST: Shared[tuple[str, ...]] = Shared(1024)

# One managedFields entry as `entry_of` makes it: (manager, operation, time, spec fields).
Fact = tuple[str, str, str, tuple[str, ...]]


def facts(entries: list[Obj]) -> tuple[Fact, ...] | None:
    """Entries of `entry_of`'s making as tuples, each shared with every object holding the
    same one (a tool applies many objects within a second): a fraction of their JSON kept
    per object. None when any entry holds more than `entry_of` would give it back."""
    out = []
    for entry in entries:
        manager, operation, time = entry.get("manager"), entry.get("operation"), entry.get("time")
        if not (isinstance(manager, str) and isinstance(operation, str) and isinstance(time, str)):
            return None
        fields = tuple(spec_keys(entry))
        if entry != entry_of(manager, operation, time, fields):
            return None
        out.append(_FACTS.share((manager, operation, time, _FIELDS.share(fields)), _interned))
    # The objects a tool applied in the same second hold the very same entries: one tuple.
    kept = tuple(out)
    return _KEPT.share(kept)


def entries_of(kept: tuple[Fact, ...]) -> list[Obj]:
    """The managedFields entries `facts` was given."""
    return [entry_of(*fact) for fact in kept]


def _interned(fact: Fact) -> Fact:
    """`fact` with its manager and operation interned, not the event's own copies: a few of
    each name every fact."""
    manager, operation, time, fields = fact
    return (sys.intern(manager), sys.intern(operation), time, fields)


_FIELDS: Shared[tuple[str, ...]] = Shared(1024)
_FACTS: Shared[Fact] = Shared(16_384)
_KEPT: Shared[tuple[Fact, ...]] = Shared(16_384)
