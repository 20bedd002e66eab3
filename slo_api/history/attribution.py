"""Who made a change: the caller of this replica's own write (`Writer`, noted as `Mine` by the
resourceVersion its answer carried), else the field manager whose managedFields entry the
change stamped (`changed_by`), else `unknown`.

A change whose manager is slo-api that this replica did not make is another replica's, and so
may be one no manager stamped (a reset through slo-api, nulls for the only fields it held,
leaves no slo-api entry in managedFields): it is left to that replica for a grace, then
stored as a placeholder (`UNKNOWN`) that the writer's own record replaces. Across a relist's
gap (the states between two observed ones unseen) a change is a caller's only if it starts at
the state the caller's write was made on (`Mine.made`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable
from dataclasses import dataclass

from slo_api.history.changes import Change
from slo_api.kinds.base import Obj
from slo_api.managed_fields import Stamps, field_entries, manager_key, spec_keys, stamp_of

# The field manager slo-api's own writes carry (kube.Kube.patch).
SELF = "slo-api"
UNKNOWN = "unknown"

# The caller of the write this request is making: (actor, requestId, clientRequestId).
Writer = tuple[str, str | None, str | None]
writer: contextvars.ContextVar[Writer | None] = contextvars.ContextVar(
    "history_writer", default=None
)


def changed_by(
    before: Stamps | None,
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


@dataclass(frozen=True, slots=True)
class Mine:
    """A write this replica made: its caller, and the digest of the client-owned fields it
    was made on (its precondition's state; None: not known)."""

    writer: Writer
    before: bytes | None

    def made(self, change: Change) -> bool:
        """Whether `change` is this write alone: consecutive states, or a relist's gap that
        starts at the state the write was made on (then its changed fields are the write's)."""
        return change.gap is None or (self.before is not None and self.before == change.gap)


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
