"""The harness's own reading of the API server's objects, in the API's names.

Written apart from slo-api's code on purpose (an oracle that shares the code it checks finds
nothing): docs/api.md is its source. A CR's client-owned fields are flat, as a route's history
names them: `priority`, `minimumDeployment`, ..., `pool.swapBudget`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson

from robustness.recording import GAP, Obj, Recording, Request

RESOURCES = {"llmslorequirements": "llm", "jobslorequirements": "job", "modelpools": "pool"}
REVISIONS = "routerevisions"
LIMITS = "slolimits"
OWNED: dict[str, tuple[str, ...]] = {
    "llm": ("priority", "minimumDeployment", "maximumDeployment", "ttft", "otps"),
    "job": ("priority", "minimumDeployment", "maximumDeployment", "queue"),
    "pool": ("pool.default", "pool.swapPolicy", "pool.swapBudget", "pool.reclaimAfter"),
}
# The owned fields each view of /config (and its change stream) shows.
SUMMARY: dict[str, tuple[str, ...]] = {
    "llm": ("priority", "minimumDeployment", "maximumDeployment"),
    "job": ("priority", "minimumDeployment", "maximumDeployment"),
    "pool": ("pool.swapPolicy", "pool.swapBudget"),
}
WRITES = ("PUT", "DELETE")


def spec_key(api_field: str) -> str:
    """The spec key an owned field is stored under (`pool.swapBudget` -> `swapBudget`)."""
    return api_field.removeprefix("pool.")


def _bound(value: Any) -> Any:
    if not isinstance(value, dict):
        return None
    return {"type": value.get("type", "replica"), "value": value.get("value")}


def owned(kind: str, spec: Obj) -> Obj:
    """A CR's client-owned fields as a GET of its route shows them (unset fields left out)."""
    out: Obj = {}
    if kind in ("llm", "job"):
        out["priority"] = spec.get("priority", 0)
        for name in ("minimumDeployment", "maximumDeployment"):
            bound = _bound(spec.get(name))
            if bound is not None:
                out[name] = bound
        if kind == "llm":
            for name in ("ttft", "otps"):
                if spec.get(name) is not None:
                    out[name] = spec[name]
        else:
            queue = spec.get("queue") or {}
            out["queue"] = {"maxDepth": queue.get("maxDepth", 0)}
            if queue.get("promql") is not None:
                out["queue"]["promql"] = queue["promql"]
    elif kind == "pool":
        for name in OWNED["pool"]:
            value = spec.get(spec_key(name))
            if value not in (None, ""):
                out[name] = value
    return out


def item_owned(kind: str, item: Obj) -> Obj:
    """The client-owned fields a route's body or /config item shows (either view)."""
    out: Obj = {}
    if kind == "pool":
        nested = item.get("pool")
        settings: Obj = nested if isinstance(nested, dict) else item
        for name in OWNED["pool"]:
            value = settings.get(spec_key(name))
            if value is not None:
                out[name] = value
        return out
    for name in OWNED.get(kind, ()):
        if item.get(name) is not None:
            out[name] = item[name]
    return out


def shown(kind: str, fields: Obj, view: str) -> Obj:
    """`fields` restricted to what a view shows."""
    names = SUMMARY[kind] if view == "summary" else OWNED[kind]
    return {k: v for k, v in fields.items() if k in names}


def written_fields(kind: str, method: str, body: Any) -> set[str]:
    """The owned fields a write may change: what its body names, or all (DELETE resets)."""
    if method == "DELETE":
        return set(OWNED.get(kind, ()))
    if not isinstance(body, dict):
        return set()
    names: set[str] = set()
    for key, value in body.items():
        if key in ("highPriority", "priority"):
            names.add("priority")
        elif key == "pool" and kind == "pool" and isinstance(value, dict):
            names |= {f"pool.{k}" for k in value}
        elif key in OWNED.get(kind, ()):
            names.add(key)
    return names


def etag_version(value: str | None) -> int | None:
    """The resourceVersion a strong ETag names (None for `*`, weak or absent ETags)."""
    if not value or value.startswith("W/"):
        return None
    text = value.strip('"')
    return int(text) if text.isdigit() else None


def query(path: str) -> dict[str, str]:
    if "?" not in path:
        return {}
    pairs = (p.partition("=") for p in path.split("?", 1)[1].split("&") if p)
    return {k: v for k, _, v in pairs}


def route_of_path(path: str) -> str | None:
    """The route a /routes/{route} or /config/{route} path names (not history/attainment)."""
    bare = path.split("?", 1)[0]
    for prefix in ("/routes/", "/config/"):
        if bare.startswith(prefix):
            rest = bare[len(prefix) :]
            if rest.endswith(("/history", "/attainment")) or not rest:
                return None
            return rest
    return None


def is_dry_run(request: Request) -> bool:
    return query(request.path).get("dryRun") in ("true", "All")


def is_forced(request: Request) -> bool:
    return query(request.path).get("force") == "true"


def answered_version(request: Request) -> int | None:
    """The resourceVersion a successful write answered: its ETag (slo-api) or the returned
    object's (a write around slo-api)."""
    version = etag_version(request.header("ETag"))
    if version is not None:
        return version
    body = request.response_body
    if isinstance(body, dict):
        rv = str((body.get("metadata") or {}).get("resourceVersion", ""))
        if rv.isdigit():
            return int(rv)
    return None


@dataclass(slots=True)
class State:
    """One state of one CR in the ground truth (`deleted`: the DELETED event's)."""

    time: float
    rv: int
    kind: str
    namespace: str
    name: str
    uid: str
    route: str
    spec: Obj
    owned: Obj
    managers: list[Obj]
    labels: Obj
    annotations: Obj
    deleted: bool = False
    # The harness's watch broke just before: the states between this and the one before it
    # are unknown (a change across it cannot be attributed or split).
    after_gap: bool = False

    def where(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name} uid {self.uid[:8]} rv {self.rv}"


@dataclass(slots=True)
class Revision:
    uid: str
    id: int
    data: Obj
    time: float
    namespace: str
    deleted: float | None = None
    # The objects holding it: a revision replacing a placeholder is first copied aside under
    # a name of its own (slo_api/history/revisions.py), so it is gone only once every copy is.
    names: set[str] = field(default_factory=set)


@dataclass(slots=True)
class Ground:
    """The ground truth, indexed: each CR's states by uid, revisions, limits, gaps."""

    states: dict[str, list[State]] = field(default_factory=lambda: defaultdict(list))
    by_rv: dict[int, State] = field(default_factory=dict)
    revisions: dict[tuple[str, int], Revision] = field(default_factory=dict)
    # namespace -> [(rv, time, caps or None when deleted)]
    limits: dict[str, list[tuple[int, float, Obj | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    gaps: list[float] = field(default_factory=list)

    def previous(self, state: State) -> State | None:
        history = self.states[state.uid]
        at = history.index(state)
        return history[at - 1] if at > 0 else None

    def last_states(self) -> list[State]:
        """Each CR's last state, deleted ones left out."""
        return [h[-1] for h in self.states.values() if h and not h[-1].deleted]

    def claimants(self, route: str, kind: str | None = None) -> list[State]:
        """Every state (any time) of a CR that claimed the route."""
        return [
            s
            for h in self.states.values()
            for s in h
            if s.route == route and (kind is None or s.kind == kind)
        ]


def _managers(obj: Obj) -> list[Obj]:
    found = obj.get("managers")
    return [m for m in found if isinstance(m, dict)] if isinstance(found, list) else []


def _placeholder(entry: Obj) -> bool:
    return entry.get("actor") == "unknown" and not entry.get("migrated")


def build(recording: Recording) -> Ground:
    resources = {**RESOURCES, **recording.settings.get("resources", {})}
    truth = Ground()
    gap_pending: set[str] = set()
    for record in recording.truth:
        obj = record.object
        meta = obj.get("metadata") or {}
        if record.event == GAP:
            truth.gaps.append(record.time)
            gap_pending = set(truth.states)
            continue
        rv_text = str(meta.get("resourceVersion", ""))
        rv = int(rv_text) if rv_text.isdigit() else 0
        namespace = str(meta.get("namespace", ""))
        if record.resource == REVISIONS:
            data = obj.get("data")
            entry = orjson.loads(data) if isinstance(data, str) else data
            labels = meta.get("labels") or {}
            uid = str(labels.get("slo-api.modelsphere.dev/uid", ""))
            ident = str((entry or {}).get("id", ""))
            if not ident.isdigit():
                continue
            key = (uid, int(ident))
            name = str(meta.get("name", ""))
            held = truth.revisions.get(key)
            if record.event == "DELETED":
                if held is not None and held.deleted is None:
                    held.names.discard(name)
                    if not held.names:
                        held.deleted = record.time
            elif held is None or held.deleted is not None:
                # A placeholder replaced by its writer is deleted and created again.
                truth.revisions[key] = Revision(
                    uid, int(ident), entry or {}, record.time, namespace, names={name}
                )
            else:
                held.names.add(name)
                if _placeholder(held.data) and not _placeholder(entry or {}):
                    held.data = entry or {}  # as slo-api reads it: the writer's over `unknown`
            continue
        if record.resource == LIMITS:
            if meta.get("name") == "default":
                caps = None if record.event == "DELETED" else dict(obj.get("spec") or {})
                truth.limits[namespace].append((rv, record.time, caps))
            continue
        kind = resources.get(record.resource)
        if kind is None:
            continue
        spec = obj.get("spec") or {}
        uid = str(meta.get("uid", ""))
        route = str(meta.get("name", "")) if kind == "pool" else str(spec.get("serviceId", ""))
        history = truth.states[uid]
        if history and history[-1].rv == rv and record.event != "DELETED":
            continue  # the same state listed again after a gap
        state = State(
            time=record.time,
            rv=rv,
            kind=kind,
            namespace=namespace,
            name=str(meta.get("name", "")),
            uid=uid,
            route=route,
            spec=spec,
            owned=owned(kind, spec),
            managers=_managers(obj),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            deleted=record.event == "DELETED",
            after_gap=uid in gap_pending,
        )
        gap_pending.discard(uid)
        history.append(state)
        if not state.deleted:
            truth.by_rv.setdefault(rv, state)
    return truth


def fault_windows(recording: Recording, grace: float | None = None) -> list[tuple[float, float]]:
    """When faults were under way, each widened by the grace after it (a replica's watches
    need a moment to catch up once a fault ends)."""
    after = float(recording.settings.get("fault_grace_seconds", 15.0) if grace is None else grace)
    end_of_run = max((r.answered or r.sent for r in recording.requests), default=0.0)
    return [
        (f.start, (f.end if f.end is not None else end_of_run) + after) for f in recording.faults
    ]


def during_fault(windows: list[tuple[float, float]], start: float, end: float) -> bool:
    return any(s <= end and start <= e for s, e in windows)
