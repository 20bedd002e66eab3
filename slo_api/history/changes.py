"""What a change of a route is: its client-owned fields in the API's names (a pool's under
`pool.`), the difference between two states of them, and values capped as a revision holds
them (`VALUE_CAP`)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from slo_api.kinds.base import Kind, Obj

# A value (a field before or after, in the API's JSON) above this many bytes is kept as its
# digest: 5 fields x 3 values stay far below what one object may hold.
VALUE_CAP = 8 * 1024

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


def generation(obj: Obj) -> int | None:
    """`metadata.generation`: the API server counts every change of the spec in it, so of two
    states of one CR the one with the lower generation is the older (resourceVersions are
    opaque and not compared)."""
    value = (obj.get("metadata") or {}).get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class Change:
    kind: Kind
    # The state after it, as much as a revision is made of (see `obj`), encoded: a recording
    # may wait for a storer behind a GitOps sync's thousands, and its JSON holds a third of
    # what the decoded objects do.
    made_of: bytes
    changes: list[Obj]
    when: str
    # Across a relist's gap: the digest of the state before it (see state_digest); None for
    # two consecutive states.
    gap: bytes | None = None
    # A change that ends at a state the informers did not show (the one a write was made on,
    # inside a relist's gap): its version and client-owned fields, not `obj`'s.
    version: str | None = None
    fields: Mapping[str, Any] | None = None

    @property
    def obj(self) -> Obj:
        """The state after it: apiVersion, kind, metadata (without managedFields) and spec."""
        decoded: Obj = orjson.loads(self.made_of)
        return decoded


def state_digest(fields: Mapping[str, Any]) -> bytes:
    return hashlib.blake2b(
        orjson.dumps(fields, option=orjson.OPT_SORT_KEYS), digest_size=16
    ).digest()
