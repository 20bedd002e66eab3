"""One robustness run: the real control plane, slo-api replicas as processes (two, and a third
joining mid-run), the harness's own watch (the ground truth), seeded random traffic and faults,
everything recorded, then the validators.

docs/development.md ("The robustness harness") says what the traffic and the faults are; the
faults and their schedule are in robustness/faults.py, the network ones' proxy in
robustness/toxiproxy.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shlex
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from controlplane.admin import AdminError, load_yaml_dir
from controlplane.cluster import CONFIG, Cluster
from controlplane.demo import start_service
from controlplane.server import free_port
from robustness.faults import FAULTS, NETWORK, Schedule
from robustness.recording import (
    GAP,
    KUBE,
    Fault,
    Meta,
    Obj,
    Recorder,
    Request,
    Stream,
    Truth,
    load,
)
from robustness.toxiproxy import Toxiproxy
from robustness.validators import Violation, report, validate
from robustness.validators.state import READY, STARTING

TOKEN = "robustness-write-token-0123456789"  # noqa: S105 - the local run's own
SLO = "inference.modelsphere.dev/v1alpha1"
POOL = "inference.llmkube.dev/v1alpha1"
NAMESPACES = ("team-a", "team-b")
CAPS = {"maxPriority": 8, "maxReplicas": 6}

WATCHED = {
    "llmslorequirements": f"/apis/{SLO}",
    "jobslorequirements": f"/apis/{SLO}",
    "modelpools": f"/apis/{POOL}",
    "routerevisions": "/apis/slo-api.modelsphere.dev/v1alpha1",
    "slolimits": f"/apis/{SLO}",
}
KINDS = {
    "llm": ("LLMSLORequirement", "llmslorequirements"),
    "job": ("JobSLORequirement", "jobslorequirements"),
}
HISTORY_ENTRIES = 20
# The Kubernetes identities beside the static write token: ServiceAccounts in PEOPLE, each
# bound to one of config/user-roles' ClusterRoles in one namespace (the replicas review their
# tokens: SLO_API_KUBERNETES_AUTH).
PEOPLE = "people"
ACCOUNTS = {"editor-a": ("slo-api-edit", "team-a"), "viewer-b": ("slo-api-view", "team-b")}
IDENTITIES: dict[str, Obj] = {
    "writer": {"actor": "token:write"},
    **{
        name: {"actor": f"system:serviceaccount:{PEOPLE}:{name}", "namespaces": [namespace]}
        for name, (_, namespace) in ACCOUNTS.items()
    },
}
# Flux's kustomize-controller marks what it applies with these labels.
FLUX = {
    "kustomize.toolkit.fluxcd.io/name": "inference",
    "kustomize.toolkit.fluxcd.io/namespace": "flux-system",
}
# What the harness's own status writer (a controller) calls itself.
CONTROLLER = "slo-controller"
SETTLE_SECONDS = 15.0
ARGO = {"argocd.argoproj.io/tracking-id": "inference:inference.modelsphere.dev/x"}


@dataclass
class Options:
    seed: int
    duration: float
    faults: tuple[str, ...]
    results: Path
    routes: int = 3  # of each kind per namespace
    workers: int = 3
    watchers: int = 3


@dataclass(frozen=True)
class Watcher:
    """Who a change-stream watcher is and what it asks for."""

    identity: str
    view: str = "summary"
    sse: bool = False


# In order: watcher i is WATCHERS[i % 3]. The viewer may see only team-b: its stream must show
# nothing of team-a.
WATCHERS = (
    Watcher("writer"),
    Watcher("viewer-b", sse=True),
    Watcher("editor-a", view="full"),
)


@dataclass
class Outcome:
    """What a finished run found: the faults that ran, the violations, the report."""

    faults: list[Fault]
    violations: list[Violation]
    report: str


@dataclass
class Replica:
    name: str
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    kubeconfig: Path | None = None  # its own, through its proxy, when there are network faults

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class World:
    """What the traffic knows of the cluster: the CRs it created and the ETags it saw."""

    crs: dict[str, Obj] = field(default_factory=dict)  # route -> the CR as created
    etags: dict[str, list[str]] = field(default_factory=dict)  # route -> ETags read, oldest first


def trim(obj: Obj) -> Obj:
    """An object as the recording keeps it (recording.Truth)."""
    meta = obj.get("metadata") or {}
    managers = []
    for entry in meta.get("managedFields") or []:
        if entry.get("subresource"):
            continue
        spec = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        managers.append(
            {
                "manager": entry.get("manager"),
                "operation": entry.get("operation"),
                "time": entry.get("time"),
                "fields": sorted(k[2:] for k in spec if k.startswith("f:")),
            }
        )
    out: Obj = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {
            k: meta.get(k)
            for k in ("name", "namespace", "uid", "resourceVersion", "labels", "annotations")
            if meta.get(k) is not None
        },
        "managers": managers,
    }
    for key in ("spec", "data"):
        if key in obj:
            out[key] = obj[key]
    return out


class Run:
    def __init__(self, options: Options, command: list[str]) -> None:
        self.options = options
        self.random = random.Random(options.seed)
        self.folder = (
            options.results.resolve() / f"seed-{options.seed}-{time.strftime('%Y%m%dT%H%M%S')}"
        )
        self.folder.mkdir(parents=True, exist_ok=True)
        self.recorder = Recorder(self.folder / "recording.jsonl")
        self.command = command
        self.cluster = Cluster(self.folder / "cluster")
        self.replicas = [
            Replica(name, free_port(), self.folder / f"slo-api-{name}.log") for name in ("a", "b")
        ]
        self.world = World()
        self.stopping = asyncio.Event()
        self.done = asyncio.Event()
        self.all_faults = asyncio.Event()
        self.outcome = Outcome([], [], "")
        self.ids = 0
        self.tokens = {"writer": TOKEN}
        self.joining: Replica | None = None
        self.toxiproxy: Toxiproxy | None = None
        if set(NETWORK) & set(options.faults):
            self.toxiproxy = Toxiproxy(self.folder, options.seed)
        self.kube: httpx.AsyncClient | None = None
        self.http = httpx.AsyncClient(timeout=15)

    # -- recording -----------------------------------------------------------------------------

    def next_id(self, prefix: str) -> str:
        self.ids += 1
        return f"{prefix}-{self.options.seed}-{self.ids}"

    async def slo(
        self,
        replica: Replica,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        phase: str = "traffic",
        identity: str = "writer",
    ) -> Request:
        sent_headers = {"X-Request-Id": self.next_id("r"), **(headers or {})}
        record = Request(
            id=sent_headers["X-Request-Id"],
            replica=replica.name,
            identity=identity,
            method=method,
            path=path,
            sent=time.time(),
            request_headers=sent_headers,
            request_body=body,
            phase=phase,
        )
        try:
            response = await self.http.request(
                method,
                replica.url + path,
                json=body,
                headers={"Authorization": f"Bearer {self.tokens[identity]}", **sent_headers},
            )
            record.status = response.status_code
            record.response_headers = {
                k: v
                for k, v in response.headers.items()
                if k.lower() in ("etag", "x-request-id", "warning", "retry-after")
            }
            with contextlib.suppress(ValueError):
                record.response_body = response.json() if response.content else None
        except httpx.HTTPError as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        record.answered = time.time()
        self.recorder.write(record)
        return record

    async def around(
        self,
        manager: str,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "",
        force: bool = True,
    ) -> Request:
        """A write straight to the API server, recorded as replica `kube`."""
        assert self.kube is not None
        record = Request(
            id=self.next_id("k"),
            replica=KUBE,
            identity=manager,
            method=method,
            path=path,
            sent=time.time(),
            request_body=body,
        )
        params = {"fieldManager": manager}
        if content_type == "application/apply-patch+yaml" and force:
            params["force"] = "true"
        try:
            response = await self.kube.request(
                method,
                path,
                params=params if method != "DELETE" else None,
                content=None if body is None else json.dumps(body).encode(),
                headers={"Content-Type": content_type or "application/json"},
            )
            record.status = response.status_code
            with contextlib.suppress(ValueError):
                payload = response.json()
                rv = (payload.get("metadata") or {}).get("resourceVersion")
                # A write's answer: only the version it made (the truth has the object). A
                # delete answers a Status without one.
                record.response_body = (
                    {"metadata": {"resourceVersion": rv}}
                    if response.status_code < 300 and rv and method != "DELETE"
                    else payload
                )
        except httpx.HTTPError as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        record.answered = time.time()
        self.recorder.write(record)
        return record

    # -- set-up --------------------------------------------------------------------------------

    def setup(self) -> None:
        if self.toxiproxy is not None:
            self.toxiproxy.start()  # first: a cold build of it takes a minute
        self.cluster.start()
        admin = self.cluster.admin
        assert admin is not None
        objs = load_yaml_dir(CONFIG / "guardrails")
        crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
        admin.apply_all(crds)
        admin.wait_crds(crds)
        # The policy names SLOLimits as its parameter kind, which the API server may not
        # serve yet this soon after its CRD: applied again until it takes.
        _until(lambda: bool(admin.apply_all(o for o in objs if o not in crds)), "the policy")
        for namespace in (*NAMESPACES, PEOPLE):
            admin.ensure_namespace(namespace)
        for name, (role, namespace) in ACCOUNTS.items():
            admin.create(
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": name, "namespace": PEOPLE},
                }
            )
            admin.create(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": name, "namespace": namespace},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": role,
                    },
                    "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": PEOPLE}],
                }
            )
            self.tokens[name] = admin.service_account_token(PEOPLE, name)
        admin.apply(
            {
                "apiVersion": SLO,
                "kind": "SLOLimits",
                "metadata": {"name": "default", "namespace": NAMESPACES[0]},
                "spec": CAPS,
            }
        )
        _until(self._capped, "the guardrails in force")
        plane = self.cluster.plane
        context = ssl.create_default_context(cafile=str(plane.pki.ca_cert))
        context.load_cert_chain(str(plane.pki.admin_cert), str(plane.pki.admin_key))
        self.kube = httpx.AsyncClient(base_url=plane.url, verify=context, timeout=30)

    def _capped(self) -> bool:
        """Whether the policy refuses a CR beyond team-a's caps (a dry run): the traffic must
        not start before, or its writes would be judged by caps not yet in force."""
        admin = self.cluster.admin
        assert admin is not None
        probe = self._spec_obj(NAMESPACES[0], "llm", "probe")
        probe["spec"]["priority"] = CAPS["maxPriority"] + 1
        try:
            admin.request(
                "POST",
                admin.path(SLO, probe["kind"], NAMESPACES[0]),
                probe,
                params={"dryRun": "All"},
            )
        except AdminError as exc:
            return exc.status == 422 and "slo-limits" in str(exc)
        return False

    def create_crs(self) -> None:
        admin = self.cluster.admin
        assert admin is not None
        for namespace in NAMESPACES:
            for kind in ("llm", "job"):
                for i in range(self.options.routes):
                    route = f"{kind}-{namespace}-{i}"
                    marker = "argo" if kind == "llm" and i == 0 else ""
                    marker = "flux" if kind == "job" and i == 0 else marker
                    self.world.crs[route] = self._create(admin, namespace, kind, route, marker)
        members = [r for r, o in self.world.crs.items() if o["metadata"]["namespace"] == "team-a"]
        pool = {
            "apiVersion": POOL,
            "kind": "ModelPool",
            "metadata": {"name": "pool-team-a", "namespace": "team-a"},
            "spec": {
                "members": [{"inferenceServiceRef": {"name": m}} for m in members[:2]],
                "swapPolicy": "sticky",
                "swapBudget": "300s",
            },
        }
        admin.create(pool, field_manager="deployer")
        self.world.crs["pool-team-a"] = pool

    @staticmethod
    def _spec_obj(namespace: str, kind: str, route: str) -> Obj:
        spec: Obj = {"serviceId": route, "priority": 1, "minimumDeployment": {"value": 1}}
        if kind == "job":
            spec["queue"] = {"maxDepth": 10, "promql": "sum(q)"}
        return {
            "apiVersion": SLO,
            "kind": KINDS[kind][0],
            "metadata": {"name": route, "namespace": namespace},
            "spec": spec,
        }

    @classmethod
    def _create(cls, admin: Any, namespace: str, kind: str, route: str, marker: str) -> Obj:
        obj = cls._spec_obj(namespace, kind, route)
        if marker == "argo":
            obj["metadata"]["annotations"] = ARGO
            admin.apply(obj, field_manager="argocd-controller")
        elif marker == "flux":
            obj["metadata"]["labels"] = FLUX
            admin.apply(obj, field_manager="kustomize-controller")
        else:
            admin.create(obj, field_manager="deployer")
        return obj

    def proxied(self, replica: Replica) -> None:
        """The replica's own kubeconfig, onto the API server through its own proxy."""
        creds = self.cluster.credentials
        assert creds is not None
        assert self.toxiproxy is not None
        port = self.toxiproxy.proxy(replica.name, f"127.0.0.1:{self.cluster.plane.port}")
        config = yaml.safe_load(creds.slo_api_kubeconfig.read_text())
        for entry in config["clusters"]:
            entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
        replica.kubeconfig = self.folder / f"kubeconfig-{replica.name}"
        replica.kubeconfig.write_text(yaml.safe_dump(config))

    def start_replica(self, replica: Replica) -> None:
        creds = self.cluster.credentials
        assert creds is not None
        if self.toxiproxy is not None and replica.kubeconfig is None:
            self.proxied(replica)
        with replica.log.open("ab") as out:
            replica.proc = start_service(
                replica.kubeconfig or creds.slo_api_kubeconfig,
                replica.port,
                TOKEN,
                log_format="json",
                stdout=out,
                extra_env={
                    "ROUTE_HISTORY_ENTRIES": str(HISTORY_ENTRIES),
                    "SLO_API_KUBERNETES_AUTH": "true",
                },
            )

    async def wait_replica(self, replica: Replica, seconds: float = 120) -> None:
        """Poll its /readyz until 200 (phase `starting`), then read the view it serves at once
        (phase `ready`): the readiness validator holds that view to the truth."""
        proc = replica.proc
        assert proc is not None
        deadline = time.monotonic() + seconds
        while (await self.slo(replica, "GET", "/readyz", phase=STARTING)).status != 200:
            if proc.poll() is not None:
                raise RuntimeError(f"replica {replica.name} exited {proc.returncode} starting")
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica {replica.name} not ready within {seconds:.0f} s")
            await asyncio.sleep(0.25)
        await self.view(replica, READY)

    # -- the ground truth ----------------------------------------------------------------------

    async def truth(self, plural: str) -> None:
        assert self.kube is not None
        base = f"{WATCHED[plural]}/{plural}"
        known: dict[str, Obj] = {}
        first = True
        while True:
            try:
                listed = (await self.kube.get(base)).raise_for_status().json()
                rv = listed["metadata"]["resourceVersion"]
                now = time.time()
                if not first:
                    self.recorder.write(Truth(now, plural, GAP))
                seen = set()
                for item in listed.get("items") or []:
                    uid = item["metadata"]["uid"]
                    seen.add(uid)
                    event = "ADDED" if uid not in known else "MODIFIED"
                    known[uid] = trim(item)
                    self.recorder.write(Truth(now, plural, event, known[uid]))
                for uid in set(known) - seen:
                    self.recorder.write(Truth(now, plural, "DELETED", known.pop(uid)))
                first = False
                params = {
                    "watch": "true",
                    "resourceVersion": rv,
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": "60",
                }
                while True:
                    async with self.kube.stream("GET", base, params=params, timeout=90) as resp:
                        resp.raise_for_status()
                        async for line in resp.aiter_lines():
                            if not line.strip():
                                continue
                            event = json.loads(line)
                            obj = event.get("object") or {}
                            if event["type"] == "ERROR":
                                raise LookupError(obj.get("message"))
                            params["resourceVersion"] = obj["metadata"]["resourceVersion"]
                            if event["type"] == "BOOKMARK":
                                continue
                            trimmed = trim(obj)
                            uid = obj["metadata"]["uid"]
                            if event["type"] == "DELETED":
                                known.pop(uid, None)
                            else:
                                known[uid] = trimmed
                            self.recorder.write(Truth(time.time(), plural, event["type"], trimmed))
            except asyncio.CancelledError:
                raise
            except Exception:  # any break of the watch: list again, as informers do
                await asyncio.sleep(0.5)

    # -- traffic -------------------------------------------------------------------------------

    def _body(self, route: str) -> Obj:
        cr = self.world.crs[route]
        r = self.random
        if cr["kind"] == "ModelPool":
            return {"pool": {"swapBudget": f"{r.randint(30, 600)}s"}}
        choice = r.random()
        if choice < 0.4:
            return {"priority": r.randint(0, 10)}
        if choice < 0.6:
            return {"highPriority": r.random() < 0.5}
        if choice < 0.8:
            return {
                "minimumDeployment": {"value": r.randint(0, 2)},
                "maximumDeployment": {"type": "replica", "value": r.randint(2, 9)},
            }
        if cr["kind"] == "JobSLORequirement":
            return {"queue": {"maxDepth": r.randint(1, 50)}}
        return {
            "ttft": {"default": {"metrics": [{"type": "p90", "threshold": r.randint(1, 9) / 10}]}}
        }

    async def worker(self) -> None:
        r = self.random
        while not self.stopping.is_set():
            route = r.choice(sorted(self.world.crs))
            replica = r.choice(self.replicas)
            action = r.random()
            try:
                await self._act(action, replica, route)
            except Exception as exc:  # a harness bug: said, and the traffic goes on
                print(f"harness error in {action=:.2f} on {route}: {exc!r}", file=sys.stderr)
            await asyncio.sleep(r.uniform(0.05, 0.3))

    def _identity(self) -> str:
        """Who writes through slo-api: mostly the static token, else a ServiceAccount (which
        RBAC refuses outside its namespace, or everywhere for the viewer)."""
        if self.random.random() < 0.75:
            return "writer"
        return self.random.choice(sorted(ACCOUNTS))

    async def _act(self, action: float, replica: Replica, route: str) -> None:
        if action < 0.42:
            await self._put(replica, route, self._identity())
        elif action < 0.47:
            await self.slo(replica, "DELETE", f"/routes/{route}", identity=self._identity())
        elif action < 0.57:
            await self._patch_around(route)
        elif action < 0.6:
            await self._argo(route)
        elif action < 0.63:
            await self._flux(route)
        elif action < 0.66:
            await self._status(route)
        elif action < 0.67:
            await self._limits()
        elif action < 0.68:
            await self._recreate(route)
        elif action < 0.8:
            read = await self.slo(replica, "GET", f"/routes/{route}", identity=self._identity())
            if read.status == 200 and read.header("ETag"):
                self.world.etags.setdefault(route, []).append(str(read.header("ETag")))
        elif action < 0.88:
            identity = self._identity()
            await self.slo(replica, "GET", f"/routes/{route}/history", identity=identity)
        else:
            view = self.random.choice(["summary", "full"])
            page = self.random.randint(1, 2)
            path = f"/config?view={view}&page={page}&pageSize={self.options.routes * 2}"
            await self.slo(replica, "GET", path, identity=self._identity())

    async def _put(self, replica: Replica, route: str, identity: str) -> None:
        r = self.random
        headers: dict[str, str] = {}
        query = []
        mode = r.random()
        if mode < 0.3:
            read = await self.slo(replica, "GET", f"/routes/{route}", identity=identity)
            if read.header("ETag"):
                headers["If-Match"] = str(read.header("ETag"))
        elif mode < 0.4 and self.world.etags.get(route):
            headers["If-Match"] = r.choice(self.world.etags[route])
        if r.random() < 0.1:
            query.append("dryRun=true")
        if r.random() < 0.1:
            query.append("force=true")
        path = f"/routes/{route}" + ("?" + "&".join(query) if query else "")
        await self.slo(replica, "PUT", path, self._body(route), headers, identity=identity)

    def _path(self, route: str) -> str:
        cr = self.world.crs[route]
        meta = cr["metadata"]
        plural = (
            "modelpools"
            if cr["kind"] == "ModelPool"
            else KINDS["llm" if cr["kind"] == "LLMSLORequirement" else "job"][1]
        )
        version = POOL if cr["kind"] == "ModelPool" else SLO
        return f"/apis/{version}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"

    async def _patch_around(self, route: str) -> None:
        cr = self.world.crs[route]
        if cr["kind"] == "ModelPool":
            patch: Obj = {"spec": {"swapBudget": f"{self.random.randint(30, 600)}s"}}
        else:
            patch = {"spec": {"priority": self.random.randint(0, 10)}}
        await self.around(
            "kubectl-edit", "PATCH", self._path(route), patch, "application/merge-patch+json"
        )

    async def _argo(self, route: str) -> None:
        cr = self.world.crs[route]
        if not (cr["metadata"].get("annotations") or {}).get("argocd.argoproj.io/tracking-id"):
            return
        applied = {
            "apiVersion": cr["apiVersion"],
            "kind": cr["kind"],
            "metadata": {
                "name": cr["metadata"]["name"],
                "namespace": cr["metadata"]["namespace"],
                "annotations": ARGO,
            },
            "spec": {**cr["spec"], "priority": self.random.randint(0, 8)},
        }
        await self.around(
            "argocd-controller", "PATCH", self._path(route), applied, "application/apply-patch+yaml"
        )

    async def _flux(self, route: str) -> None:
        """A server-side apply by Flux's kustomize-controller, forced or not (unforced, it is
        refused with 409 where another manager holds the field)."""
        cr = self.world.crs[route]
        if not (cr["metadata"].get("labels") or {}).get("kustomize.toolkit.fluxcd.io/name"):
            return
        applied = {
            "apiVersion": cr["apiVersion"],
            "kind": cr["kind"],
            "metadata": {
                "name": cr["metadata"]["name"],
                "namespace": cr["metadata"]["namespace"],
                "labels": FLUX,
            },
            "spec": {**cr["spec"], "priority": self.random.randint(0, 8)},
        }
        await self.around(
            "kustomize-controller",
            "PATCH",
            self._path(route),
            applied,
            "application/apply-patch+yaml",
            force=self.random.random() < 0.5,
        )

    async def _status(self, route: str) -> None:
        """A controller's status update (the status subresource: no spec change, no revision)."""
        if self.world.crs[route]["kind"] == "ModelPool":
            return
        status = {"phase": self.random.choice(["Pending", "Ready", "Degraded"])}
        await self.around(
            CONTROLLER,
            "PATCH",
            self._path(route) + "/status",
            {"status": {**status, "replicas": self.random.randint(0, 6)}},
            "application/merge-patch+json",
        )

    async def _limits(self) -> None:
        """The platform admin moves team-a's caps (the ratchet keeps what is stored beyond)."""
        caps = {
            "maxPriority": self.random.choice([6, 8, 10]),
            "maxReplicas": self.random.choice([4, 6, 9]),
        }
        await self.around(
            "platform-admin",
            "PATCH",
            f"/apis/{SLO}/namespaces/{NAMESPACES[0]}/slolimits/default",
            {"spec": caps},
            "application/merge-patch+json",
        )

    async def _recreate(self, route: str) -> None:
        cr = self.world.crs[route]
        meta = cr["metadata"]
        if cr["kind"] == "ModelPool" or meta.get("annotations") or meta.get("labels"):
            return
        await self.around("deployer", "DELETE", self._path(route))
        collection = self._path(route).rsplit("/", 1)[0]
        for _ in range(20):
            created = await self.around("deployer", "POST", collection, cr)
            if created.status != 409:
                return
            await asyncio.sleep(0.2)

    # -- watchers ------------------------------------------------------------------------------

    async def watcher(self, name: str, start: int) -> None:
        """A watcher of its own identity, view and format (Watcher), resuming each session on
        the next replica from the last revision it had."""
        r = self.random
        watcher = WATCHERS[start % len(WATCHERS)]
        session = 0
        since: str | None = None
        at = start
        while True:
            replica = self.replicas[at % len(self.replicas)]
            at += 1
            session += 1
            final = self.stopping.is_set()
            lasting = None if final else r.uniform(3, 15)
            since = await self._session(name, watcher, session, replica, since, lasting)
            if final:
                return

    async def _session(
        self,
        name: str,
        watcher: Watcher,
        session: int,
        replica: Replica,
        since: str | None,
        lasting: float | None,
    ) -> str | None:
        """One connection; returns where to resume (None: start over). An SSE watcher resumes
        with `Last-Event-ID`, an NDJSON one with `since`."""
        path = f"/config?watch=true&view={watcher.view}"
        headers = {"Authorization": f"Bearer {self.tokens[watcher.identity]}"}
        if watcher.sse:
            headers["Accept"] = "text/event-stream"
            if since:
                headers["Last-Event-ID"] = since
        elif since:
            path += f"&since={since}"

        def record(what: str, **fields: Any) -> None:
            self.recorder.write(
                Stream(
                    time.time(),
                    name,
                    session,
                    replica.name,
                    watcher.identity,
                    what,
                    view=watcher.view,
                    **fields,
                )
            )

        last = since
        reason = "drop"
        opened = False
        try:
            async with self.http.stream(
                "GET", replica.url + path, headers=headers, timeout=httpx.Timeout(10, read=None)
            ) as response:
                record("open", since=since, status=response.status_code)
                opened = True
                if response.status_code != 200:
                    await response.aread()
                    record("close", reason="error")
                    await asyncio.sleep(0.5)
                    return None if response.status_code == 410 else since
                async with _deadline(lasting, self.stopping, self.done) as expired:
                    lines = response.aiter_lines()
                    async for parsed in sse_events(lines) if watcher.sse else ndjson(lines):
                        record("line", line=parsed)
                        if parsed.get("revision"):
                            last = parsed["revision"]
                        if parsed.get("type") == "ERROR":
                            code = (parsed.get("error") or {}).get("code")
                            reason = "server"
                            if code in ("expired", "too_slow"):
                                last = None
                            break
                        if expired():
                            break
                    else:
                        reason = "server"
                if lasting is None:
                    reason = "end"
        except httpx.HTTPError as exc:
            if not opened:
                record("open", since=since, status=None, reason=f"{type(exc).__name__}")
            reason = "error"
            await asyncio.sleep(0.5)
        record("close", reason=reason)
        return last

    # -- faults --------------------------------------------------------------------------------

    async def faults(self) -> None:
        """Faults on the seeded schedule until the traffic stops; `all_faults` is set once each
        enabled kind has run (the traffic lasts until then, however short `--duration`)."""
        schedule = Schedule(self.random, self.options.faults)
        end = time.time() + self.options.duration
        try:
            while not self.stopping.is_set() and self.options.faults:
                await asyncio.sleep(schedule.gap(end - time.time()))
                if self.stopping.is_set():
                    return
                await self.inject(schedule.next())
                if schedule.complete:
                    self.all_faults.set()
        finally:
            self.all_faults.set()  # no faults, or a harness error: the traffic must still end

    async def inject(self, name: str) -> None:
        r = self.random
        start = time.time()
        target = "apiserver"
        detail = ""
        if name in ("kill", "term"):
            replica = r.choice(self.replicas)
            target = replica.name
            assert replica.proc is not None
            replica.proc.send_signal(signal.SIGKILL if name == "kill" else signal.SIGTERM)
            try:
                code = await asyncio.to_thread(replica.proc.wait, 60)
            except subprocess.TimeoutExpired:
                replica.proc.kill()  # a SIGTERM that does not end it within a minute
                code = await asyncio.to_thread(replica.proc.wait)
                detail = "did not exit within 60 s of SIGTERM; killed"
            if name == "term" and not detail:
                detail = f"exited {code}"
            await asyncio.sleep(r.uniform(1, 4))
            self.start_replica(replica)
            await self.wait_replica(replica)
        elif name == "pause":
            seconds = r.uniform(2, 6)
            detail = f"{seconds:.1f} s"
            self.cluster.plane.signal_apiserver(signal.SIGSTOP)
            await asyncio.sleep(seconds)
            self.cluster.plane.signal_apiserver(signal.SIGCONT)
        elif name in NETWORK:
            assert self.toxiproxy is not None
            replica = r.choice(self.replicas)
            target = replica.name
            seconds = r.uniform(*{"latency": (5.0, 12.0), "stall": (3.0, 8.0)}.get(name, (1, 3)))
            attributes = {"timeout": 0}
            if name == "latency":
                attributes = {"latency": r.randint(200, 1500), "jitter": 100}
            detail = f"{seconds:.1f} s {attributes}"
            await asyncio.to_thread(self.toxiproxy.add, replica.name, name, attributes)
            await asyncio.sleep(seconds)
            await asyncio.to_thread(self.toxiproxy.remove, replica.name, name)
        elif name == "compaction":
            detail = f"revision {await asyncio.to_thread(self.cluster.plane.compact_etcd)}"
        elif name == "restart":
            await asyncio.to_thread(self.cluster.plane.restart_apiserver)
        self.recorder.write(Fault(name, target, start, time.time(), detail))

    # -- the run -------------------------------------------------------------------------------

    async def join(self) -> None:
        """A third replica joins mid-run: once ready, the traffic, the watchers and the faults
        use it like the first two, and its final view is validated like theirs."""
        await asyncio.sleep(self.random.uniform(0.2, 0.6) * self.options.duration)
        replica = Replica("c", free_port(), self.folder / "slo-api-c.log")
        self.joining = replica
        self.start_replica(replica)
        await self.wait_replica(replica)
        self.replicas.append(replica)

    async def view(self, replica: Replica, phase: str) -> None:
        """Every page of the replica's `/config?view=full`."""
        page = 1
        while True:
            read = await self.slo(
                replica, "GET", f"/config?view=full&page={page}&pageSize=200", phase=phase
            )
            body = read.response_body if isinstance(read.response_body, dict) else {}
            if page * 200 >= int(body.get("total", 0)):
                break
            page += 1

    async def final_views(self) -> None:
        for replica in self.replicas:
            await self.view(replica, "final")
            # Each route's ETag: the resourceVersion the replica's index holds.
            for route in sorted(self.world.crs):
                await self.slo(replica, "GET", f"/routes/{route}", phase="final")

    async def traffic(self) -> None:
        truth = [asyncio.create_task(self.truth(p)) for p in WATCHED]
        await asyncio.sleep(2)  # the truth's first lists before anything changes
        watchers = [
            asyncio.create_task(self.watcher(f"w{i}", i)) for i in range(self.options.watchers)
        ]
        workers = [asyncio.create_task(self.worker()) for _ in range(self.options.workers)]
        faults = asyncio.create_task(self.faults())
        joins = asyncio.create_task(self.join())
        await asyncio.sleep(self.options.duration)
        await self.all_faults.wait()
        self.stopping.set()
        await asyncio.gather(*workers, faults, joins)
        # Settle: the watchers' last sessions, opened after the traffic, stay open through it.
        await asyncio.sleep(SETTLE_SECONDS)
        await self.final_views()
        self.done.set()
        await asyncio.wait_for(asyncio.gather(*watchers), 60)
        for task in truth:
            task.cancel()
        await asyncio.gather(*truth, return_exceptions=True)

    async def main(self) -> int:
        self.recorder.write(
            Meta(
                seed=self.options.seed,
                command=self.command,
                started=time.time(),
                settings={
                    "identities": IDENTITIES,
                    "history_entries": HISTORY_ENTRIES,
                    "settle_seconds": SETTLE_SECONDS,
                    "faults": list(self.options.faults),
                },
            )
        )
        try:
            await asyncio.to_thread(self.setup)
            await asyncio.to_thread(self.create_crs)
            for replica in self.replicas:
                self.start_replica(replica)
            for replica in self.replicas:
                await self.wait_replica(replica)
            await self.traffic()
        finally:
            self.recorder.close()
            joining = [self.joining] if self.joining and self.joining not in self.replicas else []
            for replica in [*self.replicas, *joining]:
                if replica.proc is not None and replica.proc.poll() is None:
                    replica.proc.terminate()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        replica.proc.wait(20)
            await self.http.aclose()
            if self.kube is not None:
                await self.kube.aclose()
            self.cluster.stop()
            if self.toxiproxy is not None:
                self.toxiproxy.stop()
        recording = load(self.folder / "recording.jsonl")
        violations = validate(recording)
        text = report(recording, violations)
        self.outcome = Outcome(recording.faults, violations, text)
        (self.folder / "report.txt").write_text(text)
        sys.stdout.write(text)
        print(f"recording and report: {self.folder}")
        if violations:
            print("replay: " + shlex.join(self.command))
        return 1 if violations else 0


def _until(done: Callable[[], bool], what: str, seconds: float = 60) -> None:
    """Wait for `done` (an API-server error meanwhile counts as not yet)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if done():
                return
        except AdminError as exc:
            if time.monotonic() > deadline:
                raise
            print(f"waiting for {what}: {exc}", file=sys.stderr)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {seconds:.0f} s")
        time.sleep(0.5)


async def ndjson(lines: AsyncIterator[str]) -> AsyncIterator[Obj]:
    async for line in lines:
        if line.strip():
            yield json.loads(line)


async def sse_events(lines: AsyncIterator[str]) -> AsyncIterator[Obj]:
    """Each Server-Sent Event's `data` (the NDJSON line's JSON), with its `id` as the revision
    when the data carries none (the id is what `Last-Event-ID` resumes from)."""
    data: list[str] = []
    event_id: str | None = None
    async for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line.startswith("id:"):
            event_id = line[3:].strip() or None
        elif not line and data:
            parsed = json.loads("\n".join(data))
            if event_id and not parsed.get("revision"):
                parsed["revision"] = event_id
            yield parsed
            data, event_id = [], None


@contextlib.asynccontextmanager
async def _deadline(
    seconds: float | None, stopping: asyncio.Event, done: asyncio.Event
) -> AsyncIterator[Any]:
    """A check that says when a session should drop: after `seconds` or when the traffic
    stops; the last session (no `seconds`) once the run is done."""
    until = None if seconds is None else time.monotonic() + seconds

    def expired() -> bool:
        if until is None:
            return done.is_set()
        return time.monotonic() > until or stopping.is_set()

    yield expired


def run(options: Options, command: list[str]) -> int:
    return asyncio.run(Run(options, command).main())


__all__ = ["FAULTS", "Options", "run"]
