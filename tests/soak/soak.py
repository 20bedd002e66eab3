"""Bounded load and soak: slo-api on the real control plane under a GET/PUT mix and CR churn.

`run()` starts slo-api in this process (uvicorn on a free loopback port, so the clients speak real
HTTP and the index, tasks and memory can be inspected), then for `duration` seconds:

- `clients` concurrent clients each own a few LLM routes. They read them (fresh from the API
  server), PUT new bounds on them, read `/config` pages and routes that churn may have deleted.
  Every acknowledged PUT is remembered; a read of an own route must show the last one.
- A churn thread with an admin client of its own relabels the clients' CRs (metadata only, so
  it never touches what the clients write) and changes, deletes and re-creates a separate set of
  CRs: the watch loops see a steady stream of events.
- Relists are forced every few seconds (each kind lists again and replaces its entries), and the
  process's RSS is read after the first round and at the end.

Then it checks what an operator would: no 5xx, no acknowledged write lost, the index equal to a
fresh list (same objects, same resourceVersions), and after stopping no task or aiohttp client
session left behind. Only 127.0.0.1 is ever contacted; every loop ends by its deadline.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import itertools
import logging
import random
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import uvicorn

from controlplane.admin import Admin, AdminError
from controlplane.cluster import Cluster
from controlplane.server import free_port
from slo_api.app import create_app
from slo_api.runtime import Runtime
from slo_api.settings import Settings
from tests.integration import crs

TOKEN = "soak-write-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LLM = (crs.SLO, "LLMSLORequirement")
JOB = (crs.SLO, "JobSLORequirement")
KINDS = {
    "llmslorequirements": LLM,
    "jobslorequirements": JOB,
    "modelpools": (crs.POOL, "ModelPool"),
}
_runs = itertools.count(1)


@dataclass
class Figures:
    duration_s: float
    clients: int
    requests: int
    requests_per_s: float
    statuses: dict[str, int]
    unexpected: int  # 5xx, or a 4xx where none is possible
    puts_acknowledged: int
    writes_lost: int
    stale_reads: int
    churn_operations: int
    watch_events: int
    relists: int
    index_matches_cluster: bool
    index_mismatch: list[str]
    rss_kib_after_first_relists: int
    rss_kib_at_end: int
    tasks_left: list[str]
    sessions_left: int
    latency_ms_p50: float
    latency_ms_p99: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def open_sessions() -> set[int]:
    return {
        id(o) for o in gc.get_objects() if isinstance(o, aiohttp.ClientSession) and not o.closed
    }


@dataclass
class _Tally:
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    latencies: list[float] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    acked: dict[str, int] = field(default_factory=dict)  # route -> last acknowledged max value
    puts: int = 0
    stale: int = 0


async def _client(
    number: int, url: str, own: list[str], churned: list[str], tally: _Tally, ends: float
) -> None:
    rng = random.Random(number)
    values = itertools.count(number * 10_000_000 + 2)
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=30) as client:
        while time.monotonic() < ends:
            roll = rng.random()
            route = rng.choice(own)
            started = time.monotonic()
            if roll < 0.35:
                value = next(values)
                response = await client.put(
                    f"/routes/{route}", json={"maximumDeployment": {"value": value}}
                )
                if response.status_code == 200:
                    tally.puts += 1
                    tally.acked[route] = value
                    if response.json()["maximumDeployment"]["value"] != value:
                        tally.stale += 1
                allowed = {200}
            elif roll < 0.70:
                response = await client.get(f"/routes/{route}")
                if response.status_code == 200 and route in tally.acked:
                    seen = (response.json()["maximumDeployment"] or {}).get("value")
                    tally.stale += seen != tally.acked[route]
                allowed = {200}
            elif roll < 0.85:
                response = await client.get(f"/routes/{rng.choice(churned)}")
                allowed = {200, 404}  # churn deletes and re-creates these
            else:
                response = await client.get("/config", params={"page": rng.randint(1, 3)})
                allowed = {200}
            tally.latencies.append(time.monotonic() - started)
            tally.statuses[response.status_code] += 1
            if response.status_code not in allowed:
                tally.unexpected.append(f"{response.status_code} {response.text[:200]}")


def _churn(
    admin: Admin,
    namespace: str,
    own: list[tuple[str, str]],
    churned: list[str],
    ends: float,
    rate: float,
    stop: threading.Event,
) -> int:
    """Admin changes behind slo-api's back until `ends`; returns how many it made."""
    rng = random.Random(7)
    done = 0
    labels = itertools.count()
    while time.monotonic() < ends and not stop.is_set():
        roll = rng.random()
        try:
            if roll < 0.4:
                name, _ = rng.choice(own)
                admin.merge_patch(
                    *LLM, namespace, name, {"metadata": {"labels": {"churn": str(next(labels))}}}
                )
            elif roll < 0.75:
                name = rng.choice(churned)
                admin.merge_patch(*JOB, namespace, name, {"spec": {"priority": rng.randint(0, 10)}})
            else:
                name = rng.choice(churned)
                admin.delete(*JOB, namespace, name)
                admin.create(crs.job(namespace, name, service_id=f"{name}-{namespace}"))
            done += 1
        except AdminError as exc:
            if exc.status not in (404, 409):  # a CR between delete and create
                raise
        time.sleep(1 / rate)
    return done


def _index_vs_cluster(runtime: Runtime, admin: Admin) -> list[str]:
    differences = []
    for plural, (api_version, kind) in KINDS.items():
        fresh = {
            (o["metadata"]["namespace"], o["metadata"]["name"]): o["metadata"]["resourceVersion"]
            for o in admin.list(api_version, kind)
        }
        held = {
            (o["metadata"]["namespace"], o["metadata"]["name"]): o["metadata"]["resourceVersion"]
            for o in runtime.index.objects(plural)
        }
        if fresh != held:
            differences += [
                f"{plural}: cluster has {k}@{v}, index {held.get(k)}"
                for k, v in fresh.items()
                if held.get(k) != v
            ]
            differences += [f"{plural}: index has {k}, cluster not" for k in held.keys() - fresh]
    return differences


async def _force_relists(runtime: Runtime) -> None:
    """Every informer starts over (list, then watch), as after a 410.

    Restarted, not listed beside its running watch: a list replaces what the index holds, and
    one taken while the watch goes on can put back versions the watch had already moved past,
    which no informer ever does.
    """
    for watch in runtime.informers:
        for key, task in list(watch._tasks.items()):
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            watch._start(*key)


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000, 1)


async def run(
    duration: float,
    clients: int = 16,
    *,
    cluster: Cluster,
    routes_per_client: int = 2,
    churned_routes: int = 12,
    churn_rate: float = 60.0,
    relist_every: float = 5.0,
) -> Figures:
    """Soak slo-api for `duration` seconds on `cluster` (started, with CRDs and RBAC)."""
    assert cluster.admin is not None
    assert cluster.credentials is not None
    admin = cluster.admin
    namespace = f"soak-{next(_runs)}-{int(time.time()) % 100000}"
    admin.ensure_namespace(namespace)
    own = [
        [(f"c{i}-r{j}", f"c{i}-r{j}-{namespace}") for j in range(routes_per_client)]
        for i in range(clients)
    ]
    for name, route in itertools.chain.from_iterable(own):
        admin.create(crs.llm(namespace, name, service_id=route, maximumDeployment={"value": 1}))
    churned = [f"churn{k}" for k in range(churned_routes)]
    for name in churned:
        admin.create(crs.job(namespace, name, service_id=f"{name}-{namespace}"))

    tasks_before = set(asyncio.all_tasks())
    sessions_before = open_sessions()
    settings = Settings(
        slo_api_token=TOKEN,
        kubeconfig=str(cluster.credentials.slo_api_kubeconfig),
        log_level="warning",
        upstream_timeout_seconds=10,
    )
    app = create_app(settings)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=10,
        )
    )
    serving = asyncio.create_task(server.serve(), name="soak-uvicorn")
    url = f"http://127.0.0.1:{port}"
    tally = _Tally()
    churn_admin = Admin(
        cluster.plane.url,
        cluster.plane.pki.ca_cert,
        cert=(cluster.plane.pki.admin_cert, cluster.plane.pki.admin_key),
    )
    stop_churn = threading.Event()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=5) as probe:
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await probe.get("/readyz")).status_code == 200:
                        break
                if time.monotonic() > deadline or serving.done():
                    raise RuntimeError("slo-api did not become ready")
                await asyncio.sleep(0.05)
        runtime: Runtime = app.state.runtime
        all_routes = [r for _, r in itertools.chain.from_iterable(own)]
        while not all(runtime.index.claims(r) for r in all_routes):
            await asyncio.sleep(0.05)

        started = time.monotonic()
        ends = started + duration
        await _force_relists(runtime)
        gc.collect()
        rss_first = rss_kib()
        churn = asyncio.create_task(
            asyncio.to_thread(
                _churn,
                churn_admin,
                namespace,
                list(itertools.chain.from_iterable(own)),
                churned,
                ends,
                churn_rate,
                stop_churn,
            )
        )
        workers = [
            asyncio.create_task(
                _client(
                    i,
                    url,
                    [r for _, r in own[i]],
                    [f"{c}-{namespace}" for c in churned],
                    tally,
                    ends,
                )
            )
            for i in range(clients)
        ]
        relists = 1
        while time.monotonic() < ends - relist_every / 2:
            await asyncio.sleep(min(relist_every, max(0.0, ends - time.monotonic())))
            await _force_relists(runtime)
            relists += 1
        await asyncio.gather(*workers)
        churn_operations = await churn
        elapsed = time.monotonic() - started

        # Quiet now: the index must settle on exactly what a fresh list says.
        settle = time.monotonic() + 30
        while mismatch := await asyncio.to_thread(_index_vs_cluster, runtime, admin):
            if time.monotonic() > settle:
                break
            await asyncio.sleep(0.2)
        await _force_relists(runtime)
        gc.collect()
        rss_end = rss_kib()
        events = sum(
            s.value
            for metric in runtime.metrics.watch_events.collect()
            for s in metric.samples
            if s.name.endswith("_total")
        )
        lost = 0
        for name, route in itertools.chain.from_iterable(own):
            if route in tally.acked:
                stored = admin.get(*LLM, namespace, name)["spec"]["maximumDeployment"]["value"]
                lost += stored != tally.acked[route]
    finally:
        stop_churn.set()
        server.should_exit = True
        await serving
        churn_admin.close()

    gc.collect()
    await asyncio.sleep(0)
    left = [t.get_name() for t in asyncio.all_tasks() - tasks_before if not t.done()]
    left = [n for n in left if n != asyncio.current_task().get_name()]  # type: ignore[union-attr]
    sessions_left = len(open_sessions() - sessions_before)
    requests = sum(tally.statuses.values())
    return Figures(
        duration_s=round(elapsed, 1),
        clients=clients,
        requests=requests,
        requests_per_s=round(requests / elapsed, 1),
        statuses={str(k): v for k, v in sorted(tally.statuses.items())},
        unexpected=len(tally.unexpected),
        puts_acknowledged=tally.puts,
        writes_lost=lost,
        stale_reads=tally.stale,
        churn_operations=churn_operations,
        watch_events=int(events),
        relists=relists + 1,
        index_matches_cluster=not mismatch,
        index_mismatch=mismatch[:10],
        rss_kib_after_first_relists=rss_first,
        rss_kib_at_end=rss_end,
        tasks_left=left,
        sessions_left=sessions_left,
        latency_ms_p50=_percentile(tally.latencies, 0.5),
        latency_ms_p99=_percentile(tally.latencies, 0.99),
    )


def quiet_logs() -> None:
    logging.getLogger("slo_api").setLevel(logging.WARNING)
