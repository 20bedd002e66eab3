"""One in-memory fake of the seam, `slo_api.kube.Kube`, for every unit test that needs an API
server.

It answers `Kube`'s public methods (never its internals) from plain dicts: CRs by (plural,
namespace, name), ConfigMaps, TokenReviews for one known token, SubjectAccessReviews from a set
of grants, Events recorded. Watches stay open and quiet unless a test pushes an event, so the
index changes only when a test says so.

Faults come from one hook, as safir's Kubernetes mock has it: `error_callback(method, *args)`
is called at the start of every method with the method's name and positional arguments.
Raising from it is the API server failing that call; an async callback holds the call until
it returns (a slow answer, a call in flight).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from typing import Any

from slo_api.kube import KubeError, Resource

Obj = dict[str, Any]
ErrorCallback = Callable[..., Awaitable[None] | None]
# (verb, API group, plural, namespace): what a SubjectAccessReview allows.
Grant = tuple[str, str, str, str]

TOKEN = "kube-identity-token"  # the bearer token the fake's TokenReviews authenticate
USER = "system:serviceaccount:team:editor"
SLO_GROUP = "inference.modelsphere.dev"
POOL_GROUP = "inference.llmkube.dev"
PLURALS = {"llmslorequirements", "jobslorequirements", "modelpools"}


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386's MergePatch, written as the RFC's pseudo-code reads, on copies.

    An oracle for the code under test, which has its own implementation: keep this one
    literal rather than shared. tests/unit/test_fakes.py checks it against the RFC's examples,
    tests/integration/test_echoes.py against the API server.
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}  # "Ignore the contents and set it to an empty Object"
    target = dict(target)
    for name, value in patch.items():
        if value is None:
            if name in target:
                del target[name]
        else:
            target[name] = merge(target.get(name), value)
    return target


def fail(error: BaseException, *methods: str, times: int | None = 1) -> ErrorCallback:
    """An `error_callback` that raises `error` from the next `times` calls of `methods` (of
    any method when none is named), then lets every call through; `times=None`: every call."""
    left = [times]

    def callback(method: str, *args: Any) -> None:
        if methods and method not in methods:
            return
        if left[0] is None:
            raise error
        if left[0] > 0:
            left[0] -= 1
            raise error

    return callback


def _selects(selector: str, obj: Obj) -> bool:
    """Whether a label selector of `key=value` terms (comma-separated) selects `obj`."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    terms = [t.split("=", 1) for t in selector.split(",") if "=" in t]
    return all(labels.get(k) == v for k, v in terms)


def not_found() -> KubeError:
    return KubeError(404, "NotFound", "not found", is_status=True)


class FakeKube:
    """Stands where `Kube` does (the runtime's `kube_factory`, or a `Kube` argument)."""

    # When the RouteRevision CRD was created (what an earlier version's ConfigMaps predate).
    CRD_CREATED = "2026-06-01T00:00:00Z"

    def __init__(
        self,
        objects: dict[str, list[Obj]] | None = None,
        *,
        grants: Iterable[Grant] = (),
        error_callback: ErrorCallback | None = None,
    ) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.rv = 100
        self.missing: set[str] = set()  # plurals whose CRD is not installed
        # API groups discovery says serve every plural that is not missing.
        self.groups = {SLO_GROUP, POOL_GROUP}
        self.error_callback = error_callback
        self.patches: list[tuple[str, Obj, bool]] = []  # (plural, patch, dry run)
        self.closed = False
        self.timeout = 5.0
        self.config_maps: dict[tuple[str, str], Obj] = {}
        # CRDs by name (only what the code under test reads of them).
        self.crds: dict[str, Obj] = {
            "routerevisions.slo-api.modelsphere.dev": {
                "metadata": {
                    "name": "routerevisions.slo-api.modelsphere.dev",
                    "creationTimestamp": self.CRD_CREATED,
                }
            }
        }
        # Whether a patch is sent to the open watches, as the API server does (off: a test
        # that delivers the events itself, in the order it wants).
        self.watch_writes = True
        self.grants: set[Grant] = set(grants)
        # When set, every TokenReview (SubjectAccessReview) gets this status, whatever the
        # token (the grants).
        self.token_answer: Obj | None = None
        self.access_answer: Obj | None = None
        self.token_reviews: list[Obj] = []  # {"token", "audiences"} per TokenReview
        self.access_reviews: list[Obj] = []  # the spec of each SubjectAccessReview
        self.events: list[Obj] = []  # Events created, in order
        self._watch_events: dict[str, list[asyncio.Queue[Obj]]] = {}
        for plural, items in (objects or {}).items():
            for obj in items:
                self.add(plural, obj)

    # -- the test's side ---------------------------------------------------------------------

    def add(self, plural: str, obj: Obj) -> Obj:
        """Store a CR as the API server would (a namespace, a uid, a new resourceVersion)."""
        self.rv += 1
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "ns")
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta["resourceVersion"] = str(self.rv)
        self.objects[(plural, meta["namespace"], meta["name"])] = obj
        return obj

    def push(self, plural: str, event: Obj) -> None:
        """Send a watch event to every open watch of `plural`."""
        for queue in self._watch_events.get(plural, []):
            queue.put_nowait(copy.deepcopy(event))

    async def _called(self, method: str, *args: Any) -> None:
        if self.error_callback is None:
            return
        result = self.error_callback(method, *args)
        if inspect.isawaitable(result):
            await result

    # -- Kube's methods ------------------------------------------------------------------------

    async def list(
        self,
        res: Resource,
        *,
        limit: int = 500,
        continue_: str | None = None,
        resource_version: str | None = None,
        namespace: str | None = None,
        label_selector: str = "",
    ) -> Obj:
        await self._called("list", res)
        if res.plural in self.missing:
            raise KubeError(404, message="404 page not found")  # a missing CRD: no Status
        items = [
            copy.deepcopy(o)
            for (plural, ns, _), o in self.objects.items()
            if plural == res.plural
            and namespace in (None, ns)
            and self._under(o, res.group)
            and _selects(label_selector, o)
        ]
        return {"items": items, "metadata": {"resourceVersion": str(self.rv)}}

    def _under(self, obj: Obj, group: str) -> bool:
        """Whether `obj` is listed under `group`: its own, when that group is served (so a
        migration holds each CR under the group it was created in); else under any."""
        own = str(obj.get("apiVersion", "")).partition("/")[0]
        return own == group or own not in self.groups

    async def ready(self) -> bool:
        try:
            await self._called("ready")
        except KubeError:
            return False
        return True

    async def served(self, group: str, version: str) -> set[str]:
        await self._called("served", group, version)
        if group not in self.groups:
            return set()
        return PLURALS - self.missing

    async def get(self, res: Resource, namespace: str, name: str) -> Obj:
        await self._called("get", res, namespace, name)
        obj = self.objects.get((res.plural, namespace, name))
        if obj is None:
            raise not_found()
        return copy.deepcopy(obj)

    async def patch(
        self, res: Resource, namespace: str, name: str, patch: Obj, *, dry_run: bool = False
    ) -> Obj:
        await self._called("patch", res, namespace, name, patch)
        key = (res.plural, namespace, name)
        if key not in self.objects:
            raise not_found()
        self.patches.append((res.plural, copy.deepcopy(patch), dry_run))
        wanted = patch.get("metadata") or {}
        stored = self.objects[key]["metadata"]
        for precondition in ("resourceVersion", "uid"):
            if wanted.get(precondition) and wanted[precondition] != stored[precondition]:
                raise KubeError(409, "Conflict", "the object has been modified", is_status=True)
        merged: Obj = merge(self.objects[key], {k: v for k, v in patch.items() if k != "metadata"})
        if dry_run:
            return merged
        self.rv += 1
        merged["metadata"]["resourceVersion"] = str(self.rv)
        # As the API server does: the fields written become the field manager's.
        merged["metadata"]["managedFields"] = [
            {
                "manager": "slo-api",
                "operation": "Update",
                "time": "2026-01-01T00:00:00Z",
                "fieldsV1": {"f:spec": {f"f:{k}": {} for k in patch.get("spec") or {}}},
            }
        ]
        self.objects[key] = merged
        if self.watch_writes:
            # As the API server does: every open watch of the kind hears of the change.
            self.push(res.plural, {"type": "MODIFIED", "object": merged})
        return copy.deepcopy(merged)

    async def review_token(self, token: str, audiences: Sequence[str]) -> Obj:
        await self._called("review_token", token, audiences)
        self.token_reviews.append({"token": token, "audiences": list(audiences)})
        if self.token_answer is not None:
            return self.token_answer
        if token != TOKEN:
            return {"authenticated": False, "error": "invalid bearer token"}
        return {
            "authenticated": True,
            "user": {"username": USER, "uid": "u-1", "groups": ["system:authenticated"]},
            "audiences": list(audiences) or ["https://kubernetes.default.svc"],
        }

    async def review_access(self, spec: Obj) -> Obj:
        await self._called("review_access", spec)
        self.access_reviews.append(spec)
        if self.access_answer is not None:
            return self.access_answer
        a = spec["resourceAttributes"]
        return {"allowed": (a["verb"], a["group"], a["resource"], a["namespace"]) in self.grants}

    async def create_event(self, namespace: str, event: Obj) -> Obj:
        await self._called("create_event", namespace, event)
        self.events.append(event)
        return event

    async def create(self, res: Resource, namespace: str, body: Obj) -> Obj:
        await self._called("create", res, namespace, body)
        name = body["metadata"]["name"]
        key = (res.plural, namespace, name)
        if key in self.objects:
            raise KubeError(409, "AlreadyExists", f"{name} already exists", is_status=True)
        obj = copy.deepcopy(body)
        obj["metadata"]["namespace"] = namespace
        obj["metadata"]["uid"] = f"uid-{res.plural}-{name}"
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[key] = obj
        return copy.deepcopy(obj)

    async def delete(self, res: Resource, namespace: str, name: str, *, uid: str = "") -> Obj:
        await self._called("delete", res, namespace, name)
        held = self.objects.get((res.plural, namespace, name))
        if held is None:
            raise not_found()
        if uid and held["metadata"]["uid"] != uid:
            raise KubeError(409, "Conflict", "the object has been modified", is_status=True)
        del self.objects[(res.plural, namespace, name)]
        return {"status": "Success"}

    async def get_crd(self, name: str) -> Obj:
        await self._called("get_crd", name)
        crd = self.crds.get(name)
        if crd is None:
            raise not_found()
        return copy.deepcopy(crd)

    async def list_config_maps(
        self, namespace: str | None, label_selector: str, *, continue_: str | None = None
    ) -> Obj:
        await self._called("list_config_maps", namespace, label_selector)
        return {
            "items": [
                copy.deepcopy(cm)
                for (ns, _), cm in self.config_maps.items()
                if namespace in (None, ns) and _selects(label_selector, cm)
            ]
        }

    async def delete_config_map(self, namespace: str, name: str, *, resource_version: str) -> Obj:
        await self._called("delete_config_map", namespace, name)
        held = self.config_maps.get((namespace, name))
        if held is None:
            raise not_found()
        if held["metadata"].get("resourceVersion") != resource_version:
            raise KubeError(409, "Conflict", "the object has been modified", is_status=True)
        del self.config_maps[(namespace, name)]
        return {"status": "Success"}

    async def watch(
        self,
        res: Resource,
        *,
        resource_version: str,
        timeout_seconds: int,
        read_timeout: float,
        initial_events: bool = False,
        namespace: str | None = None,
        label_selector: str = "",
        on_open: Callable[[], None] | None = None,
    ) -> AsyncGenerator[Obj, None]:
        await self._called("watch", res)
        if on_open is not None:
            on_open()
        if initial_events:
            # A list streamed as a watch's initial events, as a current API server sends it.
            page = await self.list(res, namespace=namespace)
            for obj in page["items"]:
                yield {"type": "ADDED", "object": obj}
            yield {
                "type": "BOOKMARK",
                "object": {
                    "metadata": {
                        "resourceVersion": page["metadata"]["resourceVersion"],
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    }
                },
            }
        queue: asyncio.Queue[Obj] = asyncio.Queue()
        self._watch_events.setdefault(res.plural, []).append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._watch_events[res.plural].remove(queue)

    async def close(self) -> None:
        self.closed = True
