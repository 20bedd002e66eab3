"""Builds robustness recordings for the validators' tests: a small world of CRs that changes
through slo-api or around it, with the revisions, stream lines and final views a correct
slo-api would leave; a test then plants one violation in it."""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any

from robustness.model import OWNED, SUMMARY, owned, spec_key
from robustness.recording import KUBE, Fault, Meta, Obj, Recording, Request, Stream, Truth

PLURALS = {"llm": "llmslorequirements", "job": "jobslorequirements", "pool": "modelpools"}
IDENTITIES: dict[str, dict[str, Any]] = {
    "writer": {"actor": "token:write"},
    "team-a": {"actor": "system:serviceaccount:a:editor", "namespaces": ["a"]},
}


@dataclass
class Session:
    watcher: str
    number: int
    replica: str
    identity: str
    view: str
    live: bool = True
    last_revision: str | None = None


@dataclass
class Builder:
    recording: Recording = field(
        default_factory=lambda: Recording(
            Meta(
                seed=7,
                command=["python", "-m", "robustness", "run", "--seed", "7"],
                settings={"identities": copy.deepcopy(IDENTITIES), "history_entries": 20},
            )
        )
    )
    now: float = 1000.0
    rv: int = 100
    crs: dict[str, Obj] = field(default_factory=dict)  # by name
    sessions: list[Session] = field(default_factory=list)
    caps: dict[str, Obj] = field(default_factory=dict)  # each namespace's SLOLimits `default`
    # Whether changes get their revisions and stream lines as a correct slo-api gives them.
    auto: bool = True
    finished: bool = False
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # -- the world --------------------------------------------------------------------------

    def tick(self, seconds: float = 0.5) -> float:
        self.now += seconds
        return self.now

    def _next_rv(self) -> int:
        self.rv += 7
        return self.rv

    def _truth(self, resource: str, event: str, obj: Obj) -> None:
        self.recording.add(Truth(self.tick(), resource, event, copy.deepcopy(obj)))

    def create(
        self,
        name: str,
        kind: str = "llm",
        namespace: str = "a",
        spec: Obj | None = None,
        managers: list[Obj] | None = None,
        labels: Obj | None = None,
        annotations: Obj | None = None,
    ) -> Obj:
        base: Obj = {"serviceId": name, "priority": 0, "minimumDeployment": {"value": 1}}
        if kind == "job":
            base["queue"] = {"maxDepth": 5, "promql": "sum(q)"}
        if kind == "pool":
            base = {"members": ["chat"], "swapPolicy": "sticky", "swapBudget": "300s"}
        obj: Obj = {
            "apiVersion": "inference.modelsphere.dev/v1alpha1",
            "kind": kind,
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{name}-{next(self._ids):04d}-0000-0000-000000000000",
                "resourceVersion": str(self._next_rv()),
                "labels": labels or {},
                "annotations": annotations or {},
            },
            "spec": {**base, **(spec or {})},
            "managers": managers or [{"manager": "deployer", "operation": "Update", "fields": []}],
        }
        self.crs[name] = obj
        self._truth(PLURALS[kind], "ADDED", obj)
        self._tell("ADDED", obj, None)
        return obj

    def _store(self, name: str, spec: Obj, manager: str) -> tuple[Obj, Obj]:
        before = copy.deepcopy(self.crs[name])
        obj = self.crs[name]
        for key, value in spec.items():
            if value is None:
                obj["spec"].pop(key, None)
            else:
                obj["spec"][key] = value
        obj["metadata"]["resourceVersion"] = str(self._next_rv())
        entry = next((m for m in obj["managers"] if m["manager"] == manager), None)
        if entry is None:
            entry = {"manager": manager, "operation": "Update", "fields": []}
            obj["managers"].append(entry)
        for other in obj["managers"]:
            if other is not entry:
                other["fields"] = [f for f in other["fields"] if f not in spec]
        entry["fields"] = sorted(
            set(entry["fields"]) | {k for k, v in spec.items() if v is not None}
        )
        self._truth(PLURALS[obj["kind"]], "MODIFIED", obj)
        return before, obj

    def change(self, name: str, spec: Obj, manager: str = "kubectl-edit") -> Request:
        """A merge patch around slo-api, recorded as the harness's own request."""
        before, obj = self._store(name, spec, manager)
        sent = self.tick(0.01)
        request = Request(
            id=f"k{next(self._ids)}",
            replica=KUBE,
            identity=manager,
            method="PATCH",
            path=f"/apis/.../{name}",
            sent=sent - 0.01,
            answered=sent,
            status=200,
            request_body={"spec": spec},
            response_body={"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}},
        )
        self.recording.add(request)
        self._changed(before, obj, {"actor": manager, "via": manager})
        return request

    def put(
        self,
        route: str,
        body: Obj,
        *,
        replica: str = "a",
        identity: str = "writer",
        if_match: str | None = None,
        query: str = "",
        status: int = 200,
        spec: Obj | None = None,
        noop: bool = False,
    ) -> Request:
        """A PUT through slo-api; `spec` overrides what it stores (to plant a bad write);
        `noop`: it changed nothing (it answers the version that stood)."""
        obj = self.crs[route]
        headers = {"X-Request-Id": f"req-{next(self._ids)}"}
        if if_match is not None:
            headers["If-Match"] = if_match
        sent = self.tick(0.01)
        request = Request(
            id=headers["X-Request-Id"],
            replica=replica,
            identity=identity,
            method="PUT",
            path=f"/routes/{route}{query}",
            sent=sent,
            request_headers=headers,
            request_body=body,
        )
        if 200 <= status < 300 and "dryRun=true" not in query and not noop:
            before, obj = self._store(
                route, spec if spec is not None else _spec_of(body), "slo-api"
            )
            actor = IDENTITIES.get(identity, {}).get("actor", identity)
            self._changed(
                before,
                obj,
                {"actor": actor, "via": "slo-api", "clientRequestId": headers["X-Request-Id"]},
            )
        request.answered = self.tick(0.01)
        request.status = status
        if 200 <= status < 300:
            request.response_headers = {"ETag": f'"{obj["metadata"]["resourceVersion"]}"'}
            request.response_body = item(obj, "full")
        self.recording.add(request)
        return request

    def delete_cr(self, name: str) -> None:
        obj = self.crs.pop(name)
        self._truth(PLURALS[obj["kind"]], "DELETED", obj)
        self._tell("DELETED", obj, obj)

    def limits(self, namespace: str, caps: Obj) -> None:
        self.caps[namespace] = caps
        obj = {
            "metadata": {
                "name": "default",
                "namespace": namespace,
                "resourceVersion": str(self._next_rv()),
            },
            "spec": caps,
        }
        self._truth("slolimits", "ADDED", obj)

    def fault(self, name: str, target: str, seconds: float = 2.0) -> Fault:
        start = self.tick(0.01)
        fault = Fault(name, target, start, start + seconds)
        self.recording.add(fault)
        return fault

    def request(self, status: int | None, *, replica: str = "a", error: str | None = None) -> None:
        sent = self.tick(0.01)
        self.recording.add(
            Request(
                id=f"g{next(self._ids)}",
                replica=replica,
                identity="writer",
                method="GET",
                path="/routes/chat",
                sent=sent,
                answered=None if status is None else sent + 0.01,
                status=status,
                error=error,
            )
        )

    def started(
        self, replica: str, missing: tuple[str, ...] = (), without_limits: bool = False
    ) -> None:
        """A replica (re)started: its /readyz polled (refused, 503, then 200) and its full
        view read, as a correct slo-api serves it, less the `missing` routes' items (and, with
        `without_limits`, every item's limits)."""
        for status in (None, 503, 200):
            sent = self.tick(0.25)
            self.recording.add(
                Request(
                    id=f"s{next(self._ids)}",
                    replica=replica,
                    identity="writer",
                    method="GET",
                    path="/readyz",
                    sent=sent,
                    answered=None if status is None else sent + 0.01,
                    status=status,
                    error="connection refused" if status is None else None,
                    phase="starting",
                )
            )
        items = []
        for obj in self.crs.values():
            if _route(obj) in missing:
                continue
            shown = item(obj, "full")
            caps = self.caps.get(obj["metadata"]["namespace"])
            if caps and obj["kind"] != "pool" and not without_limits:
                shown["limits"] = caps
            items.append(shown)
        sent = self.tick(0.01)
        self.recording.add(
            Request(
                id=f"s{next(self._ids)}",
                replica=replica,
                identity="writer",
                method="GET",
                path="/config?view=full&page=1&pageSize=200",
                sent=sent,
                answered=sent + 0.01,
                status=200,
                response_body={"items": items},
                phase="ready",
            )
        )

    # -- what a correct slo-api leaves --------------------------------------------------------

    def _changed(self, before: Obj, after: Obj, who: Obj) -> None:
        kind = after["kind"]
        old, new = owned(kind, before["spec"]), owned(kind, after["spec"])
        changes = [
            {"field": f, "from": old.get(f), "to": new.get(f)}
            for f in OWNED[kind]
            if old.get(f) != new.get(f)
        ]
        if changes and self.auto:
            self.revision(after, changes, who)
        self._tell("MODIFIED", after, before)

    def revision(self, obj: Obj, changes: list[Obj], who: Obj, rv: str | None = None) -> Obj:
        meta = obj["metadata"]
        entry = {
            "id": rv or meta["resourceVersion"],
            "actor": who["actor"],
            "via": who["via"],
            "requestId": None,
            "clientRequestId": who.get("clientRequestId"),
            "changes": changes,
            "after": item(obj, "full"),
        }
        revision = {
            "metadata": {
                "name": f"{meta['uid']}.{entry['id']}",
                "namespace": meta["namespace"],
                "labels": {"slo-api.modelsphere.dev/uid": meta["uid"]},
                "resourceVersion": str(self._next_rv()),
            },
            "data": entry,
        }
        self._truth("routerevisions", "ADDED", revision)
        return revision

    def watch(
        self, watcher: str, *, replica: str = "a", identity: str = "writer", since: bool = False
    ) -> Session:
        """Open a stream; without `since`, it gets the initial state of what it may see."""
        previous = [s for s in self.sessions if s.watcher == watcher]
        session = Session(watcher, len(previous) + 1, replica, identity, "summary")
        resume = previous[-1].last_revision if since and previous else None
        self._stream(session, "open", since=resume, status=200)
        self.sessions.append(session)
        if not since:
            for obj in self.crs.values():
                if self._may_see(session, obj):
                    self.line(session, {"type": "ADDED", "route": _route(obj), "object": item(obj)})
            self.line(session, {"type": "BOOKMARK", "initial": True, "revision": f"r{self.rv}"})
        return session

    def close(self, session: Session, reason: str = "end") -> None:
        session.live = False
        self._stream(session, "close", reason=reason)

    def line(self, session: Session, line: Obj) -> None:
        if line.get("revision"):
            session.last_revision = line["revision"]
        self._stream(session, "line", line=line)

    def _stream(self, session: Session, what: str, **fields: Any) -> None:
        self.recording.add(
            Stream(
                time=self.tick(0.01),
                watcher=session.watcher,
                session=session.number,
                replica=session.replica,
                identity=session.identity,
                what=what,
                view=session.view,
                **fields,
            )
        )

    def _may_see(self, session: Session, obj: Obj) -> bool:
        spaces = IDENTITIES.get(session.identity, {}).get("namespaces")
        return spaces is None or obj["metadata"]["namespace"] in spaces

    def _tell(self, event: str, obj: Obj, before: Obj | None) -> None:
        if not self.auto:
            return
        for session in self.sessions:
            if not session.live or not self._may_see(session, obj):
                continue
            view = SUMMARY[obj["kind"]]
            if (
                before is not None
                and event == "MODIFIED"
                and {k: v for k, v in owned(obj["kind"], before["spec"]).items() if k in view}
                == {k: v for k, v in owned(obj["kind"], obj["spec"]).items() if k in view}
            ):
                continue  # nothing the summary view shows changed
            self.line(
                session,
                {
                    "type": event,
                    "route": _route(obj),
                    "object": item(obj),
                    "revision": f"r{obj['metadata']['resourceVersion']}x{self.now}",
                },
            )

    def finish(self) -> Recording:
        """End the run: close the streams still open and read each replica's final view."""
        if not self.finished:
            self.finished = True
            for session in self.sessions:
                if session.live:
                    self.close(session)
            self.final_views("a", "b")
        return self.recording

    def final_views(self, *replicas: str) -> None:
        for replica in replicas:
            sent = self.tick(0.01)
            self.recording.add(
                Request(
                    id=f"f{next(self._ids)}",
                    replica=replica,
                    identity="writer",
                    method="GET",
                    path="/config?view=full&page=1&pageSize=200",
                    sent=sent,
                    answered=sent + 0.01,
                    status=200,
                    response_body={"items": [item(o, "full") for o in self.crs.values()]},
                    phase="final",
                )
            )
            for obj in self.crs.values():
                sent = self.tick(0.01)
                self.recording.add(
                    Request(
                        id=f"f{next(self._ids)}",
                        replica=replica,
                        identity="writer",
                        method="GET",
                        path=f"/routes/{_route(obj)}",
                        sent=sent,
                        answered=sent + 0.01,
                        status=200,
                        response_headers={"ETag": f'"{obj["metadata"]["resourceVersion"]}"'},
                        response_body=item(obj, "full"),
                        phase="final",
                    )
                )


def _route(obj: Obj) -> str:
    return str(obj["metadata"]["name"] if obj["kind"] == "pool" else obj["spec"]["serviceId"])


def _spec_of(body: Obj) -> Obj:
    spec: Obj = {}
    for key, value in body.items():
        if key == "highPriority":
            spec["priority"] = 10 if value else 0
        elif key == "pool":
            spec.update(value)
        else:
            spec[key] = value
    return spec


def item(obj: Obj, view: str = "summary") -> Obj:
    """A route's /config item (or GET body) as slo-api shows it."""
    kind = obj["kind"]
    fields = owned(kind, obj["spec"])
    if view == "summary":
        fields = {k: v for k, v in fields.items() if k in SUMMARY[kind]}
    body: Obj = {"route": _route(obj), "kind": kind}
    for name, value in fields.items():
        if name.startswith("pool."):
            body.setdefault("pool", {})[spec_key(name)] = value
        else:
            body[name] = value
    if kind in ("llm", "job"):
        body["highPriority"] = fields.get("priority") == 10
    return body
