"""One robustness run: the real control plane, two slo-api replicas as processes, the
harness's own watch (the ground truth), seeded random traffic and faults, everything recorded,
then the validators.

What exists in this first version (docs/development.md says the same):
- traffic: slo-api PUT (priority, bounds, sections, queue, pool settings) and DELETE on both
  replicas as the static write token, with If-Match right and stale, dryRun and force; route
  and history reads; merge patches around slo-api (field manager `kubectl-edit`); server-side
  applies by `argocd-controller` on CRs marked as Argo CD's; CR deletes and re-creates under
  the same name; change-stream watchers (NDJSON, summary view) that drop at random points and
  resume with `since` on the other replica;
- faults (each on by default, `--no-NAME` turns one off): `kill` (kill -9 of a replica and its
  restart on the same port), `pause` (SIGSTOP/SIGCONT of the API server), `compaction` (etcd's
  history compacted: watches get 410 and relist), `restart` (the API server restarted, etcd
  keeps its data).
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
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from controlplane.admin import load_yaml_dir
from controlplane.cluster import CONFIG, Cluster
from controlplane.demo import start_service, wait_ready
from controlplane.server import free_port
from robustness.faults import FAULTS, Schedule
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
from robustness.validators import Violation, report, validate

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
    watchers: int = 2


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
    ) -> Request:
        sent_headers = {"X-Request-Id": self.next_id("r"), **(headers or {})}
        record = Request(
            id=sent_headers["X-Request-Id"],
            replica=replica.name,
            identity="writer",
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
                headers={"Authorization": f"Bearer {TOKEN}", **sent_headers},
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
        self, manager: str, method: str, path: str, body: Any = None, content_type: str = ""
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
        if content_type == "application/apply-patch+yaml":
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
        self.cluster.start()
        admin = self.cluster.admin
        assert admin is not None
        objs = load_yaml_dir(CONFIG / "guardrails")
        crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
        admin.apply_all(crds)
        admin.wait_crds(crds)
        admin.apply_all(o for o in objs if o not in crds)
        for namespace in NAMESPACES:
            admin.ensure_namespace(namespace)
        admin.apply(
            {
                "apiVersion": SLO,
                "kind": "SLOLimits",
                "metadata": {"name": "default", "namespace": NAMESPACES[0]},
                "spec": CAPS,
            }
        )
        plane = self.cluster.plane
        context = ssl.create_default_context(cafile=str(plane.pki.ca_cert))
        context.load_cert_chain(str(plane.pki.admin_cert), str(plane.pki.admin_key))
        self.kube = httpx.AsyncClient(base_url=plane.url, verify=context, timeout=30)

    def create_crs(self) -> None:
        admin = self.cluster.admin
        assert admin is not None
        for namespace in NAMESPACES:
            for kind in ("llm", "job"):
                for i in range(self.options.routes):
                    route = f"{kind}-{namespace}-{i}"
                    argo = kind == "llm" and i == 0
                    self.world.crs[route] = self._create(admin, namespace, kind, route, argo)
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
    def _create(admin: Any, namespace: str, kind: str, route: str, argo: bool) -> Obj:
        spec: Obj = {"serviceId": route, "priority": 1, "minimumDeployment": {"value": 1}}
        if kind == "job":
            spec["queue"] = {"maxDepth": 10, "promql": "sum(q)"}
        obj: Obj = {
            "apiVersion": SLO,
            "kind": KINDS[kind][0],
            "metadata": {"name": route, "namespace": namespace},
            "spec": spec,
        }
        if argo:
            obj["metadata"]["annotations"] = ARGO
            admin.apply(obj, field_manager="argocd-controller")
        else:
            admin.create(obj, field_manager="deployer")
        return obj

    def start_replica(self, replica: Replica) -> None:
        creds = self.cluster.credentials
        assert creds is not None
        with replica.log.open("ab") as out:
            replica.proc = start_service(
                creds.slo_api_kubeconfig,
                replica.port,
                TOKEN,
                log_format="json",
                stdout=out,
                extra_env={"ROUTE_HISTORY_ENTRIES": str(HISTORY_ENTRIES)},
            )

    def wait_replica(self, replica: Replica) -> None:
        assert replica.proc is not None
        wait_ready(replica.url, replica.proc, 120)

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

    async def _act(self, action: float, replica: Replica, route: str) -> None:
        if action < 0.45:
            await self._put(replica, route)
        elif action < 0.5:
            await self.slo(replica, "DELETE", f"/routes/{route}")
        elif action < 0.62:
            await self._patch_around(route)
        elif action < 0.66:
            await self._argo(route)
        elif action < 0.68:
            await self._recreate(route)
        elif action < 0.84:
            read = await self.slo(replica, "GET", f"/routes/{route}")
            if read.status == 200 and read.header("ETag"):
                self.world.etags.setdefault(route, []).append(str(read.header("ETag")))
        else:
            await self.slo(replica, "GET", f"/routes/{route}/history")

    async def _put(self, replica: Replica, route: str) -> None:
        r = self.random
        headers: dict[str, str] = {}
        query = []
        mode = r.random()
        if mode < 0.3:
            read = await self.slo(replica, "GET", f"/routes/{route}")
            if read.header("ETag"):
                headers["If-Match"] = str(read.header("ETag"))
        elif mode < 0.4 and self.world.etags.get(route):
            headers["If-Match"] = r.choice(self.world.etags[route])
        if r.random() < 0.1:
            query.append("dryRun=true")
        if r.random() < 0.1:
            query.append("force=true")
        path = f"/routes/{route}" + ("?" + "&".join(query) if query else "")
        await self.slo(replica, "PUT", path, self._body(route), headers)

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

    async def _recreate(self, route: str) -> None:
        cr = self.world.crs[route]
        if cr["kind"] == "ModelPool" or cr["metadata"].get("annotations"):
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
        r = self.random
        session = 0
        since: str | None = None
        at = start
        while True:
            replica = self.replicas[at % len(self.replicas)]
            at += 1
            session += 1
            final = self.stopping.is_set()
            lasting = None if final else r.uniform(3, 15)
            since = await self._session(name, session, replica, since, lasting)
            if final:
                return

    async def _session(
        self, name: str, session: int, replica: Replica, since: str | None, lasting: float | None
    ) -> str | None:
        """One connection; returns where to resume (None: start over)."""
        path = "/config?watch=true" + (f"&since={since}" if since else "")

        def record(what: str, **fields: Any) -> None:
            self.recorder.write(
                Stream(time.time(), name, session, replica.name, "writer", what, **fields)
            )

        last = since
        reason = "drop"
        opened = False
        try:
            async with self.http.stream(
                "GET",
                replica.url + path,
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=httpx.Timeout(10, read=None),
            ) as response:
                record("open", since=since, status=response.status_code)
                opened = True
                if response.status_code != 200:
                    await response.aread()
                    record("close", reason="error")
                    await asyncio.sleep(0.5)
                    return None if response.status_code == 410 else since
                async with _deadline(lasting, self.stopping, self.done) as expired:
                    async for line in response.aiter_lines():
                        if not line.strip():
                            continue
                        parsed = json.loads(line)
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
        if name == "kill":
            replica = r.choice(self.replicas)
            target = replica.name
            assert replica.proc is not None
            replica.proc.send_signal(signal.SIGKILL)
            await asyncio.to_thread(replica.proc.wait)
            await asyncio.sleep(r.uniform(1, 4))
            self.start_replica(replica)
            await asyncio.to_thread(self.wait_replica, replica)
        elif name == "pause":
            seconds = r.uniform(2, 6)
            detail = f"{seconds:.1f} s"
            self.cluster.plane.signal_apiserver(signal.SIGSTOP)
            await asyncio.sleep(seconds)
            self.cluster.plane.signal_apiserver(signal.SIGCONT)
        elif name == "compaction":
            detail = f"revision {await asyncio.to_thread(self.cluster.plane.compact_etcd)}"
        elif name == "restart":
            await asyncio.to_thread(self.cluster.plane.restart_apiserver)
        self.recorder.write(Fault(name, target, start, time.time(), detail))

    # -- the run -------------------------------------------------------------------------------

    async def final_views(self) -> None:
        for replica in self.replicas:
            page = 1
            while True:
                read = await self.slo(
                    replica,
                    "GET",
                    f"/config?view=full&page={page}&pageSize=200",
                    phase="final",
                )
                body = read.response_body if isinstance(read.response_body, dict) else {}
                if page * 200 >= int(body.get("total", 0)):
                    break
                page += 1

    async def traffic(self) -> None:
        truth = [asyncio.create_task(self.truth(p)) for p in WATCHED]
        await asyncio.sleep(2)  # the truth's first lists before anything changes
        watchers = [
            asyncio.create_task(self.watcher(f"w{i}", i)) for i in range(self.options.watchers)
        ]
        workers = [asyncio.create_task(self.worker()) for _ in range(self.options.workers)]
        faults = asyncio.create_task(self.faults())
        await asyncio.sleep(self.options.duration)
        await self.all_faults.wait()
        self.stopping.set()
        await asyncio.gather(*workers, faults)
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
                    "identities": {"writer": {"actor": "token:write"}},
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
                await asyncio.to_thread(self.wait_replica, replica)
            await self.traffic()
        finally:
            self.recorder.close()
            for replica in self.replicas:
                if replica.proc is not None and replica.proc.poll() is None:
                    replica.proc.terminate()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        replica.proc.wait(20)
            await self.http.aclose()
            if self.kube is not None:
                await self.kube.aclose()
            self.cluster.stop()
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
