"""Writes: acknowledged writes are stored and touch nothing else; conditional writes are
linearizable per route; GitOps fields change only when forced."""

from __future__ import annotations

from collections import defaultdict

from robustness.model import (
    OWNED,
    WRITES,
    Ground,
    State,
    acknowledged,
    answered_version,
    etag_version,
    is_dry_run,
    is_forced,
    item_owned,
    route_of_path,
    spec_key,
    written_fields,
)
from robustness.recording import KUBE, Recording, Request
from robustness.validators.base import Violation, around, describe_request

ACKNOWLEDGED = (
    "every 2xx write is in the ground truth at the resourceVersion it answered, and changed "
    "no field outside what it sent"
)
CONDITIONAL = "no two 2xx writes from the same ETag on one route; a 412 only after a real change"
GITOPS = "no field a GitOps tool manages is changed by an unforced slo-api write"
GITOPS_MANAGERS = ("argocd-controller", "kustomize-controller", "helm-controller", "helm")


def slo_api_writes(recording: Recording) -> list[Request]:
    """slo-api writes that were acknowledged and stored (not dry runs)."""
    return [
        r
        for r in recording.requests
        if r.replica != KUBE
        and r.method in WRITES
        and r.status is not None
        and 200 <= r.status < 300
        and not is_dry_run(r)
        and route_of_path(r.path) is not None
    ]


def _sent_fields(request: Request, kind: str) -> set[str]:
    """The owned fields a write (through slo-api or around it) names."""
    if request.replica != KUBE:
        return written_fields(kind, request.method, request.request_body)
    body = request.request_body if isinstance(request.request_body, dict) else {}
    spec = body.get("spec")
    return {f for f in OWNED.get(kind, ()) if isinstance(spec, dict) and spec_key(f) in spec}


def made_by(acked: dict[int, list[Request]], request: Request, before: State, state: State) -> bool:
    """Whether `request` made the change to `state`, not only answered it. A write that
    changes nothing sends no patch and answers the version that stood: another writer's. Of
    the acknowledged writes that answered that version, the one that names what changed made
    it; a write conditional on that very version, or sent after the harness saw it, changed
    nothing."""
    if etag_version(request.sent_header("If-Match")) == state.rv or state.time < request.sent:
        return False  # that version stood before the write was sent (the harness saw it)
    changed = {
        f for f in set(before.owned) | set(state.owned) if before.owned.get(f) != state.owned.get(f)
    }
    rivals = [r for r in acked.get(state.rv, []) if r is not request]
    if not rivals:
        return True
    if changed and changed <= _sent_fields(request, state.kind):
        return True
    return not any(changed and changed <= _sent_fields(r, state.kind) for r in rivals)


def _in_gap(ground: Ground, rv: int) -> bool:
    """The harness's watch missed the states around `rv` (it broke and listed again)."""
    return any(
        h[i].after_gap and h[i - 1].rv < rv < h[i].rv
        for h in ground.states.values()
        for i in range(1, len(h))
    )


def acknowledged_writes(recording: Recording, ground: Ground) -> list[Violation]:
    found: list[Violation] = []
    acked = acknowledged(recording)
    for r in slo_api_writes(recording):
        route = route_of_path(r.path)
        rv = answered_version(r)
        if rv is None:
            found.append(
                Violation(
                    "acknowledged_writes",
                    ACKNOWLEDGED,
                    "a 2xx write answered no ETag",
                    route,
                    [describe_request(r)],
                )
            )
            continue
        state = ground.by_rv.get(rv)
        if state is None:
            if not _in_gap(ground, rv):
                found.append(
                    Violation(
                        "acknowledged_writes",
                        ACKNOWLEDGED,
                        f"lost write: the ground truth never had resourceVersion {rv}",
                        route,
                        [describe_request(r)]
                        + [f"claimants: {s.where()}" for s in ground.claimants(route or "")[-3:]],
                    )
                )
            continue
        if state.route != route:
            found.append(
                Violation(
                    "acknowledged_writes",
                    ACKNOWLEDGED,
                    f"the write landed on {state.where()}, which claims route {state.route!r}",
                    route,
                    [describe_request(r), *around(ground, state)],
                )
            )
            continue
        if isinstance(r.response_body, dict) and r.method == "PUT":
            answered = item_owned(state.kind, r.response_body)
            if answered != state.owned:
                found.append(
                    Violation(
                        "acknowledged_writes",
                        ACKNOWLEDGED,
                        f"the answer {answered} is not what is stored at rv {rv}",
                        route,
                        [describe_request(r), *around(ground, state)],
                    )
                )
        before = ground.previous(state)
        if before is None or state.after_gap or not made_by(acked, r, before, state):
            continue
        sent = written_fields(state.kind, r.method, r.request_body)
        changed = {
            f
            for f in set(before.owned) | set(state.owned)
            if before.owned.get(f) != state.owned.get(f)
        }
        outside = sorted(changed - sent)
        owned_keys = {spec_key(f) for f in OWNED[state.kind]}
        other_spec = sorted(
            f"spec.{k}"
            for k in set(before.spec) | set(state.spec)
            if before.spec.get(k) != state.spec.get(k) and k not in owned_keys
        )
        if outside or other_spec or before.labels != state.labels:
            found.append(
                Violation(
                    "acknowledged_writes",
                    ACKNOWLEDGED,
                    f"the write changed fields it did not send: {outside + other_spec}",
                    route,
                    [describe_request(r), *around(ground, state)],
                )
            )
    return found


def conditional_writes(recording: Recording, ground: Ground) -> list[Violation]:
    found: list[Violation] = []
    winners: dict[tuple[str, int], list[Request]] = defaultdict(list)
    for r in recording.requests:
        if r.replica == KUBE or r.method not in WRITES or is_dry_run(r):
            continue
        route = route_of_path(r.path)
        expected = etag_version(r.sent_header("If-Match"))
        if route is None or expected is None or r.status is None:
            continue
        if 200 <= r.status < 300 and answered_version(r) not in (None, expected):
            winners[(route, expected)].append(r)
        elif r.status == 412:
            claimed = [s for s in ground.claimants(route) if s.rv == expected]
            newer = [
                s
                for s in ground.claimants(route)
                if s.rv > expected and s.time <= (r.answered or r.sent) + _lag(recording)
            ]
            if claimed and not newer:
                found.append(
                    Violation(
                        "conditional_writes",
                        CONDITIONAL,
                        f"412 for ETag {expected}, still the route's current version",
                        route,
                        [describe_request(r), *around(ground, claimed[0])],
                    )
                )
    for (route, expected), requests in winners.items():
        if len(requests) > 1:
            found.append(
                Violation(
                    "conditional_writes",
                    CONDITIONAL,
                    f"{len(requests)} writes conditional on ETag {expected} all succeeded",
                    route,
                    [describe_request(r) for r in requests],
                )
            )
    return found


def _lag(recording: Recording) -> float:
    """How far the harness's watch may trail the API server (its events' times are late)."""
    return float(recording.settings.get("truth_lag_seconds", 5.0))


def gitops_owner(state: State, field: str) -> str | None:
    """The GitOps tool that manages an owned field of a CR, by its markers and managedFields."""
    if _released(state):
        return None
    key = spec_key(field)
    for entry in state.managers:
        manager = str(entry.get("manager"))
        if (
            manager in GITOPS_MANAGERS
            and key in (entry.get("fields") or [])
            and _marked(state, manager)
        ):
            return manager
    return None


def _released(state: State) -> bool:
    marks = {**state.labels, **state.annotations}
    return (
        state.annotations.get("slo-api.modelsphere.dev/co-owned") == "true"
        or marks.get("kustomize.toolkit.fluxcd.io/ssa") in ("IfNotPresent", "Ignore")
        or marks.get("kustomize.toolkit.fluxcd.io/reconcile") == "disabled"
    )


def _marked(state: State, manager: str) -> bool:
    if manager == "argocd-controller":
        return "argocd.argoproj.io/tracking-id" in state.annotations
    if manager == "kustomize-controller":
        return "kustomize.toolkit.fluxcd.io/name" in state.labels
    if manager == "helm-controller":
        return "helm.toolkit.fluxcd.io/name" in state.labels
    return (
        "meta.helm.sh/release-name" in state.annotations
        and state.labels.get("app.kubernetes.io/managed-by") == "Helm"
    )


def gitops(recording: Recording, ground: Ground) -> list[Violation]:
    found: list[Violation] = []
    acked = acknowledged(recording)
    for r in slo_api_writes(recording):
        if is_forced(r):
            continue
        rv = answered_version(r)
        state = ground.by_rv.get(rv) if rv is not None else None
        before = ground.previous(state) if state is not None else None
        if state is None or before is None or state.after_gap:
            continue
        if not made_by(acked, r, before, state):
            continue
        for name in sorted(set(before.owned) | set(state.owned)):
            if before.owned.get(name) == state.owned.get(name):
                continue
            tool = gitops_owner(before, name)
            if tool is not None:
                found.append(
                    Violation(
                        "gitops",
                        GITOPS,
                        f"an unforced write changed {name}, managed by {tool}",
                        state.route,
                        [describe_request(r), *around(ground, state)],
                    )
                )
    return found
