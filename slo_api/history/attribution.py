"""Who made a change: the caller of this replica's own write (`Writer`, noted as `Mine` by the
resourceVersion its answer carried), else the field manager whose managedFields entry the
change stamped (`changed_by`), else `unknown`.

A change whose manager is slo-api that this replica did not make is another replica's, and so
may be one no manager stamped (a reset through slo-api, nulls for the only fields it held,
leaves no slo-api entry in managedFields): it is left to that replica for a grace, then
stored as a placeholder (`UNKNOWN`) that the writer's own record replaces. Across a relist's
gap (the states between two observed ones unseen) only the part of a change from the state the
caller's write was made on is the caller's (`Mine.split`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from slo_api.history.changes import Change, diff, owned_fields, state_digest
from slo_api.kinds.base import Obj
from slo_api.managed_fields import field_entries, manager_key, spec_keys, stamp_of

# The field manager slo-api's own writes carry (kube.Kube.patch).
SELF = "slo-api"
UNKNOWN = "unknown"

# The caller of the write this request is making: (actor, requestId, clientRequestId).
Writer = tuple[str, str | None, str | None]
writer: contextvars.ContextVar[Writer | None] = contextvars.ContextVar(
    "history_writer", default=None
)


def changed_by(
    last: tuple[float, tuple[str, ...]],
    obj: Obj,
    fields: Iterable[str] = (),
) -> tuple[str, str | None]:
    """The field manager that made a change, and when: the one whose managedFields entry the
    change stamped, newer than the state before it (`last`: its newest stamp and the entries
    that carried it). The API server stamps an entry with the time of the write, so a manager
    that changed the CR since is stamped later, or in the same second and not among those.
    None stamped (a field removed by a manager that then owns nothing keeps no entry):
    `unknown`."""
    newest, latest = last

    def stamped(e: Obj) -> bool:
        time = stamp_of(e.get("time"))
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
        managers = {str(e.get("manager") or UNKNOWN) for e in touched}
        if len(managers) > 1:
            # Several were stamped in that second: which changed it is not known. Where
            # slo-api is one, its writer names its own change (others wait for it); else
            # nobody is named rather than a guess.
            time = touched[0].get("time")
            return (SELF if SELF in managers else UNKNOWN), str(time) if time else None
    chosen = max(touched, key=lambda e: stamp_of(e.get("time")), default=None)
    if chosen is None:
        return UNKNOWN, None
    time = chosen.get("time")
    return str(chosen.get("manager") or UNKNOWN), str(time) if time else None


# A change as this replica's write splits it: (what came before the write, the write's own).
Parts = tuple[Change | None, Change | None]


@dataclass(frozen=True, slots=True)
class Mine:
    """A write this replica made: its caller, and the state it was made on (its precondition:
    that state's version and client-owned fields, encoded; None: not known)."""

    writer: Writer
    made_on: tuple[str, bytes] | None = None

    def split(self, change: Change) -> Parts | None:
        """`change` as (what came before this write, this write's own change); None when the
        write's part of it cannot be told.

        Consecutive states, or a relist's gap that starts at the state the write was made on:
        all of it is the write's. A gap that starts earlier holds other writers' changes too:
        the write's own is the difference from the state it was made on (consecutive states:
        the write was conditional on it), and the rest ends at that state's version, still
        across the gap."""
        if change.gap is None:
            return None, change
        if self.made_on is None:
            return None
        version, encoded = self.made_on
        made_on: dict[str, Any] = orjson.loads(encoded)
        if state_digest(made_on) == change.gap:
            return None, change
        kind, after = change.kind, owned_fields(change.kind, change.obj)
        start = {**after, **{str(c["field"]): c["from"] for c in change.changes}}
        start = {f: v for f, v in start.items() if v is not None}
        rest, own = diff(kind, start, made_on), diff(kind, made_on, after)
        return (
            replace(change, changes=rest, version=version, fields=made_on) if rest else None,
            replace(change, changes=own, gap=None) if own else None,
        )


# Who made a change, as `who` tells it: (actor, via, requestId, clientRequestId). Kept as a
# tuple for each of the recent changes (see History.by), told as an object.
Who = tuple[str, str, str | None, str | None]


def who(actor: str, via: str, request_id: str | None, client_request_id: str | None) -> Obj:
    return {
        "actor": actor,
        "via": via,
        "requestId": request_id,
        "clientRequestId": client_request_id,
    }
