"""The measurements: each returns plain dicts for results.json; the report is built from them."""

from __future__ import annotations

import gc
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import load, populate
from bench.load import Series, Target
from controlplane import fleet
from controlplane.server import free_port

TOKEN = "bench-write-token"  # noqa: S105 - a throwaway token for a loopback process
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LLM_PATH = f"{populate.SLO_PATH}/namespaces/{fleet.NAMESPACE}/llmslorequirements"
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Settings:
    reps: int = 5
    seconds: float = 3.0
    warmup: float = 1.0
    config_connections: int = 8
    write_connections: int = 16


# -- the service process -------------------------------------------------------------------


class ServiceProcess:
    """`python -m bench.launcher` (slo-api plus the baseline route) on a loopback port."""

    def __init__(
        self, kubeconfig: Path, workdir: Path, extra_env: dict[str, str] | None = None
    ) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.extra_env = extra_env or {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s = 0.0  # spawn -> first /healthz 200 (imports, app, uvicorn up)
        self.ready_s = 0.0  # spawn -> first /readyz 200 (every kind listed and indexed)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 600) -> ServiceProcess:
        log = (self.workdir / "slo-api.log").open("ab")
        env = {
            **os.environ,
            "SLO_API_TOKEN": TOKEN,
            "KUBECONFIG": str(self.kubeconfig),
            "PORT": str(self.port),
            "HOST": "127.0.0.1",
            "LOG_LEVEL": "warning",
            "LOG_FORMAT": "json",
            "SHUTDOWN_GRACE_SECONDS": "0",
            # A long list of 50,000 CRs pages through the API server: give each call room.
            "UPSTREAM_TIMEOUT_SECONDS": "30",
            # At least the upstream timeout, as the settings require.
            "SHUTDOWN_DRAIN_SECONDS": "30",
            **self.extra_env,
        }
        spawned = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.launcher"],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = spawned + timeout
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while not self.ready_s:
                if self.proc.poll() is not None:
                    # The work directory goes when the bench stops: say why here.
                    tail = (self.workdir / "slo-api.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"slo-api exited; the end of its log:\n{tail}")
                if time.perf_counter() > deadline:
                    raise RuntimeError("slo-api not ready in time")
                try:
                    if not self.started_s and client.get("/healthz").status_code == 200:
                        self.started_s = time.perf_counter() - spawned
                    if self.started_s and client.get("/readyz").status_code == 200:
                        self.ready_s = time.perf_counter() - spawned
                except httpx.TransportError:
                    pass
                time.sleep(0.01)
        return self

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = httpx.get(f"{self.url}/bench/info").json()
        maps = Path(f"/proc/{self.pid}/maps").read_text()
        info["uvloop_loaded"] = "uvloop" in maps
        info["httptools_loaded"] = "httptools" in maps
        return info

    def rss_kib(self) -> int:
        return load.rss_kib(self.pid)

    def peak_kib(self) -> int:
        return load.rss_kib(self.pid, "VmHWM")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


# -- 1. GET /config against the precomputed baseline ---------------------------------------


def pages_for(routes: int, page_size: int = 200) -> dict[str, int]:
    last = max(1, -(-routes // page_size))
    return {"first": 1, "middle": max(1, last // 2), "last": last}


def config_pages(svc: ServiceProcess, routes: int, s: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, page in pages_for(routes).items():
        path = f"/config?page={page}&pageSize=200"
        real = httpx.get(f"{svc.url}{path}", headers=AUTH)
        real.raise_for_status()
        assert len(real.json()["items"]) > 0
        key = f"{routes}-{label}"
        httpx.put(f"{svc.url}/bench/baseline/{key}", content=real.content).raise_for_status()
        copy = httpx.get(f"{svc.url}/bench/baseline/{key}")
        assert copy.content == real.content
        assert copy.headers["etag"] == real.headers["etag"]
        service = Target(svc.url, [path], headers=AUTH)
        baseline = Target(svc.url, [f"/bench/baseline/{key}"], headers=AUTH)
        out[label] = {
            "page": page,
            "bytes": len(real.content),
            **side_by_side(service, baseline, s, s.config_connections, svc.pid),
        }
    return out


def side_by_side(
    subject: Target, baseline: Target, s: Settings, connections: int, pid: int | None
) -> dict[str, Any]:
    """Warm both up, then alternate them rep by rep so drift on a noisy machine hits both."""
    load.run(subject, s.warmup, connections, pid)
    load.run(baseline, s.warmup, connections, pid)
    a, b = Series(), Series()
    for _ in range(s.reps):
        a.runs.append(load.run(subject, s.seconds, connections, pid))
        b.runs.append(load.run(baseline, s.seconds, connections, pid))
    return {"subject": a.summary(), "baseline": b.summary()}


# -- 2 and 3. GET and PUT one route against the API server directly --------------------------


def direct_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def get_route(
    svc: ServiceProcess, api_url: str, sa_token: str, routes: int, s: Settings
) -> dict[str, Any]:
    """One client, one request at a time: latency. Both through wrk, keep-alive; TLS direct."""
    names = [fleet.route_name(i) for i in range(0, routes, max(1, routes // 64))]
    service = Target(svc.url, [f"/routes/{n}" for n in names], headers=AUTH)
    direct = Target(api_url, [f"{LLM_PATH}/{n}" for n in names], headers=direct_headers(sa_token))
    return side_by_side(service, direct, s, 1, svc.pid)


def get_route_many(
    svc: ServiceProcess, api_url: str, sa_token: str, routes: int, s: Settings
) -> dict[str, Any]:
    """The same reads with 16 clients: throughput, slo-api and the API server on the same
    two cores."""
    names = [fleet.route_name(i) for i in range(0, routes, max(1, routes // 64))]
    service = Target(svc.url, [f"/routes/{n}" for n in names], headers=AUTH)
    direct = Target(api_url, [f"{LLM_PATH}/{n}" for n in names], headers=direct_headers(sa_token))
    return side_by_side(service, direct, s, s.write_connections, svc.pid)


def aiohttp_direct(
    api_url: str, sa_token: str, ca_cert: Path, routes: int, s: Settings, requests: int = 500
) -> dict[str, Any]:
    """A direct GET, one at a time, with aiohttp on uvloop: the client library and loop that
    slo-api itself uses to reach the API server. What a Python caller pays without slo-api."""
    import ssl

    import aiohttp
    import uvloop

    names = [fleet.route_name(i) for i in range(0, routes, max(1, routes // 64))]
    urls = [f"{api_url}{LLM_PATH}/{n}" for n in names]

    async def one_run() -> list[float]:
        context = ssl.create_default_context(cafile=str(ca_cert))
        headers = direct_headers(sa_token)
        latencies: list[float] = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
            for n in range(requests + 50):
                sent = time.perf_counter()
                async with session.get(urls[n % len(urls)], headers=headers) as response:
                    await response.read()
                if n >= 50:  # the first 50 warm the connection up
                    latencies.append((time.perf_counter() - sent) * 1000)
        return sorted(latencies)

    p50s, p99s = [], []
    for _ in range(s.reps):
        latencies = uvloop.run(one_run())
        p50s.append(latencies[len(latencies) // 2])
        p99s.append(latencies[int(len(latencies) * 0.99)])
    return {
        "p50_ms": {"median": statistics.median(p50s), "min": min(p50s), "max": max(p50s)},
        "p99_ms": {"median": statistics.median(p99s), "min": min(p99s), "max": max(p99s)},
        "requests": requests,
    }


def put_route(
    svc: ServiceProcess, api_url: str, sa_token: str, routes: int, s: Settings
) -> dict[str, Any]:
    """16 clients writing priority (a new value each time) to 64 routes, both ways."""
    names = [fleet.route_name(i) for i in range(1, routes, max(1, routes // 64))]
    service = Target(
        svc.url,
        [f"/routes/{n}" for n in names],
        method="PUT",
        headers={**AUTH, "Content-Type": "application/json"},
        body='{"priority": {n}}',
    )
    direct = Target(
        api_url,
        [f"{LLM_PATH}/{n}" for n in names],
        method="PATCH",
        headers={**direct_headers(sa_token), "Content-Type": "application/merge-patch+json"},
        body='{"spec": {"priority": {n}}}',
    )
    return side_by_side(service, direct, s, s.write_connections, svc.pid)


# -- 4. A Kubernetes identity against a static token ------------------------------------------

OTHER_NAMESPACE = "bench-other"
OTHER_ROUTES = 50


def kubernetes_identity_setup(admin: Any) -> str:
    """A ServiceAccount that may edit the bench namespace only (slo-api-edit bound there), and a
    few CRs in a namespace it may not see, so /config filters rather than passing all through.
    Returns the ServiceAccount's token."""
    admin.ensure_namespace(OTHER_NAMESPACE)
    for i in range(OTHER_ROUTES):
        obj = fleet.llm(10_000_000 + i)
        obj["metadata"]["namespace"] = OTHER_NAMESPACE
        admin.apply(obj)
    name = "bench-editor"
    admin.apply(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": fleet.NAMESPACE},
        }
    )
    admin.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": fleet.NAMESPACE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "slo-api-edit",
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": fleet.NAMESPACE}],
        }
    )
    token: str = admin.service_account_token(fleet.NAMESPACE, name)
    return token


def kubernetes_identity_teardown(admin: Any) -> None:
    """Remove what the setup made, so the scenarios after it count the routes they created
    (the initial sync checks a plain list of every namespace against the size it made)."""
    admin.request("DELETE", f"{populate.SLO_PATH}/namespaces/{OTHER_NAMESPACE}/llmslorequirements")
    for api_version, kind in (
        ("rbac.authorization.k8s.io/v1", "RoleBinding"),
        ("v1", "ServiceAccount"),
    ):
        admin.delete(api_version, kind, fleet.NAMESPACE, "bench-editor")


def kubernetes_identity(
    svc: ServiceProcess, user_token: str, routes: int, s: Settings
) -> dict[str, Any]:
    """GET /config (middle page) and PUT with a ServiceAccount token against the static token,
    on the same process (SLO_API_KUBERNETES_AUTH=true). The identity's answers are served from
    the review caches; what is measured is what each request costs once they are warm."""
    user = {"Authorization": f"Bearer {user_token}"}
    page = pages_for(routes)["middle"]
    path = f"/config?page={page}&pageSize=200"
    seen = httpx.get(f"{svc.url}{path}", headers=user)
    seen.raise_for_status()
    everything = httpx.get(f"{svc.url}{path}", headers=AUTH).json()
    assert seen.json()["total"] == everything["total"] - OTHER_ROUTES, "not filtered"
    config = side_by_side(
        Target(svc.url, [path], headers=user),
        Target(svc.url, [path], headers=AUTH),
        s,
        s.config_connections,
        svc.pid,
    )
    names = [fleet.route_name(i) for i in range(1, routes, max(1, routes // 64))]

    def put(headers: dict[str, str]) -> Target:
        return Target(
            svc.url,
            [f"/routes/{n}" for n in names],
            method="PUT",
            headers={**headers, "Content-Type": "application/json"},
            body='{"priority": {n}}',
        )

    writes = side_by_side(put(user), put(AUTH), s, s.write_connections, svc.pid)
    return {"page": page, "config": config, "put": writes, "ran_at": time.strftime("%Y-%m-%d")}


# -- 4b. What tracing costs ---------------------------------------------------------------

# The processes compared: the tracing extra hidden from the interpreter (as if not installed),
# installed but not configured (off), and on at ratio 1.0, sending every span to Jaeger.
TRACING_PAIRS = {"off_vs_absent": ("off", "absent"), "on_vs_off": ("on", "off")}


def tracing_costs(
    kubeconfig: Path, workdir: Path, otlp_endpoint: str, routes: int, s: Settings
) -> dict[str, Any]:
    """GET /routes/{route} (1 client) and PUT (16 clients) on each pair of processes,
    alternating rep by rep as `side_by_side` does, so drift hits both."""
    envs = {
        "absent": {"SLO_API_BENCH_HIDE_TRACING": "1"},
        "off": {},
        "on": {
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_endpoint,
            "OTEL_TRACES_SAMPLER_ARG": "1.0",
            "OTEL_SERVICE_NAME": "slo-api-bench",
        },
    }
    procs: dict[str, ServiceProcess] = {}
    try:
        for label, env in envs.items():
            procs[label] = ServiceProcess(kubeconfig, workdir, env).start()
        get_names = [fleet.route_name(i) for i in range(0, routes, max(1, routes // 64))]
        put_names = [fleet.route_name(i) for i in range(1, routes, max(1, routes // 64))]

        def get(svc: ServiceProcess) -> Target:
            return Target(svc.url, [f"/routes/{n}" for n in get_names], headers=AUTH)

        def put(svc: ServiceProcess) -> Target:
            return Target(
                svc.url,
                [f"/routes/{n}" for n in put_names],
                method="PUT",
                headers={**AUTH, "Content-Type": "application/json"},
                body='{"priority": {n}}',
            )

        out: dict[str, Any] = {}
        for pair, (a, b) in TRACING_PAIRS.items():
            out[pair] = {
                "get": _alternated(get(procs[a]), procs[a].pid, get(procs[b]), procs[b].pid, s, 1),
                "put": _alternated(
                    put(procs[a]), procs[a].pid, put(procs[b]), procs[b].pid, s, s.write_connections
                ),
            }
        return out
    finally:
        for svc in procs.values():
            svc.stop()


def _alternated(
    subject: Target, subject_pid: int, baseline: Target, baseline_pid: int, s: Settings, conns: int
) -> dict[str, Any]:
    """`side_by_side` for two processes: each run's CPU is its own process's."""
    load.run(subject, s.warmup, conns, subject_pid)
    load.run(baseline, s.warmup, conns, baseline_pid)
    a, b = Series(), Series()
    for _ in range(s.reps):
        a.runs.append(load.run(subject, s.seconds, conns, subject_pid))
        b.runs.append(load.run(baseline, s.seconds, conns, baseline_pid))
    return {"subject": a.summary(), "baseline": b.summary()}


# -- 5. The index: initial sync, watch events, memory ------------------------------------


def _plain_list_seconds(client: httpx.Client) -> tuple[float, int]:
    started = time.perf_counter()
    count = populate.plain_list(client, f"{populate.SLO_PATH}/llmslorequirements")
    return time.perf_counter() - started, count


def initial_sync(
    kubeconfig: Path, workdir: Path, api: httpx.Client, routes: int, reps: int
) -> dict[str, Any]:
    """Fresh processes to /readyz 200 against a plain paged list of the same CRs."""
    lists: list[float] = []
    for _ in range(reps):
        seconds, count = _plain_list_seconds(api)
        assert count == routes, (count, routes)
        lists.append(seconds)
    syncs: list[float] = []
    startups: list[float] = []
    rss: list[int] = []
    peaks: list[int] = []
    for _ in range(reps):
        svc = ServiceProcess(kubeconfig, workdir).start()
        try:
            syncs.append(svc.ready_s - svc.started_s)
            startups.append(svc.started_s)
            time.sleep(0.5)
            rss.append(svc.rss_kib())
            peaks.append(svc.peak_kib())
        finally:
            svc.stop()
    return {
        "routes": routes,
        "plain_list_s": lists,
        "sync_s": syncs,
        "process_start_s": startups,
        "rss_kib": rss,
        "plain_list_median_s": statistics.median(lists),
        "sync_median_s": statistics.median(syncs),
        "rss_median_kib": statistics.median(rss),
        "peak_kib": peaks,
        "peak_median_kib": statistics.median(peaks),
    }


# What the empty process costs, library by library: each line adds one import to the ones
# before it in a fresh interpreter, so the difference is that library's own share.
LIBRARIES = (
    ("python", ""),
    ("orjson", "orjson"),
    ("pydantic, pydantic-settings", "pydantic_settings"),
    ("prometheus-client", "prometheus_client"),
    ("aiohttp", "aiohttp"),
    ("kubernetes_asyncio", "kubernetes_asyncio.client, kubernetes_asyncio.config"),
    ("fastapi, starlette", "fastapi"),
    ("uvicorn, uvloop, httptools", "uvicorn, uvloop, httptools"),
    ("slo-api itself (app, runtime, kinds)", "slo_api.app, slo_api.__main__"),
)


def library_costs() -> list[dict[str, Any]]:
    """Resident memory after importing each library on top of the ones listed before it."""
    out: list[dict[str, Any]] = []
    imports: list[str] = []
    previous = 0
    for label, modules in LIBRARIES:
        if modules:
            imports.append(modules)
        code = "".join(f"import {m}\n" for m in imports) + (
            "import sys\n"
            "rss = next(l for l in open('/proc/self/status') if l.startswith('VmRSS'))\n"
            "print(int(rss.split()[1]), len(sys.modules))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
        )
        rss, modules_loaded = (int(x) for x in done.stdout.split())
        out.append(
            {
                "library": label,
                "rss_kib": rss,
                "adds_kib": rss - previous if previous else rss,
                "modules": modules_loaded,
            }
        )
        previous = rss
    return out


def watch_apply(events: int = 200_000, population: int = 50_000) -> dict[str, Any]:
    """Watch events applied per second through `Informer._apply`, no network.

    The index first holds `population` CRs; the stream then modifies random ones (new
    resourceVersions), with a few deletes and re-adds, as a busy cluster's watch would.
    """
    from slo_api.kinds import build_kinds
    from slo_api.metrics import Metrics
    from slo_api.service import Service
    from slo_api.settings import Settings as AppSettings
    from slo_api.watching import Informer, Loops

    kinds = build_kinds(AppSettings(slo_api_token="unused-unused-unused"))  # noqa: S106
    index = Service.index_for(kinds)
    # No kube: never used (no list, no watch).
    informer = Informer(Loops(None, index, Metrics()), kinds[0])  # type: ignore[arg-type]

    def obj(i: int, rv: int) -> dict[str, Any]:
        o = fleet.llm(i)
        o["metadata"] |= {"uid": f"uid-{i}", "resourceVersion": str(rv)}
        o["metadata"]["managedFields"] = [{"manager": "deployer", "operation": "Update"}]
        return o

    rng = random.Random(7)
    rv = 1
    for i in range(population):
        rv += 1
        informer._apply({"type": "ADDED", "object": obj(i, rv)})
    stream = []
    for n in range(events):
        rv += 1
        i = rng.randrange(population)
        kind = "DELETED" if n % 100 == 99 else ("ADDED" if n % 100 == 0 else "MODIFIED")
        o = obj(i, rv)
        o["spec"]["priority"] = n % 11
        stream.append({"type": kind, "object": o})
    gc.collect()
    started = time.perf_counter()
    for event in stream:
        informer._apply(event)
    seconds = time.perf_counter() - started
    return {
        "events": events,
        "population": population,
        "seconds": seconds,
        "events_per_s": events / seconds,
    }


# -- 5. The write path with a route's history recorded, against it off ------------------------

HISTORY_ROUTES = 64


def history_writes(kubeconfig: Path, workdir: Path, routes: int, s: Settings) -> dict[str, Any]:
    """PUT /routes/{route} (16 clients, 64 routes, every write a change) on a process recording
    each change in the route's history, against one with ROUTE_HISTORY_ENTRIES=0, alternately.
    Both watch the same CRs: each records only its own writes (the other's are slo-api's)."""
    names = [fleet.route_name(i) for i in range(1, routes, max(1, routes // HISTORY_ROUTES))]
    # A drain at least as long as the 30 s upstream timeout ServiceProcess sets (start-up
    # refuses a shorter one).
    drain = {"SHUTDOWN_DRAIN_SECONDS": "30"}
    on = ServiceProcess(kubeconfig, workdir, {**drain, "ROUTE_HISTORY_ENTRIES": "20"}).start()
    try:
        off = ServiceProcess(kubeconfig, workdir, {**drain, "ROUTE_HISTORY_ENTRIES": "0"}).start()
        try:

            def put(svc: ServiceProcess) -> Target:
                return Target(
                    svc.url,
                    [f"/routes/{n}" for n in names],
                    method="PUT",
                    headers={**AUTH, "Content-Type": "application/json"},
                    body='{"priority": {n}}',
                )

            writes = side_by_side(put(on), put(off), s, s.write_connections, on.pid)
        finally:
            off.stop()
    finally:
        on.stop()
    return {"put": writes, "routes": routes, "ran_at": time.strftime("%Y-%m-%d")}


# -- /config?view=attainment against the precomputed baseline --------------------------------

TTFT_BOUNDS = ("0.1", "0.25", "0.5", "0.75", "1", "2.5", "5", "+Inf")
TPOT_BOUNDS = ("0.025", "0.05", "0.1", "0.2", "0.5", "+Inf")


def vllm_openmetrics(models: int, hours: int = 30) -> str:
    """A day of vLLM-shaped histograms for `model-0`...: one sample an hour, each model with
    its own share of slow requests, so every route has figures and budgets differ."""
    now = int(time.time()) // 3600 * 3600
    lines = []
    for name, bounds in (
        ("vllm:time_to_first_token_seconds", TTFT_BOUNDS),
        ("vllm:request_time_per_output_token_seconds", TPOT_BOUNDS),
    ):
        lines.append(f"# TYPE {name} histogram\n")
        for m in range(models):
            for i, le in enumerate(bounds):
                for h in range(hours + 1):
                    # Per hour: 100 requests, (m % 20) of them past the fourth bound.
                    within = 100 - m % 20 if i >= 3 else 25 * (i + 1)
                    within = 100 if le == "+Inf" else within
                    lines.append(
                        f'{name}_bucket{{model_name="model-{m}",le="{le}"}} '
                        f"{1000 + h * min(within, 100)} {now - (hours - h) * 3600}\n"
                    )
            for h in range(hours + 1):
                t = now - (hours - h) * 3600
                lines.append(f'{name}_count{{model_name="model-{m}"}} {1000 + h * 100} {t}\n')
                lines.append(f'{name}_sum{{model_name="model-{m}"}} {100 + h * 40} {t}\n')
    return "".join(lines) + "# EOF\n"


def attainment_pages(
    kubeconfig: Path, workdir: Path, prometheus_url: str, routes: int, s: Settings
) -> dict[str, Any]:
    """GET /config?view=attainment&sort=budget (the middle page) against the same bytes
    served precomputed, and how much the process grew (RSS) rendering every route's
    attainment, per route: an upper bound of what it holds (freed memory stays in RSS)."""
    # A page of attainment is a few hundred KB: the baseline's copy is PUT in one body.
    env = {"PROMETHEUS_URL": prometheus_url, "MAX_BODY_BYTES": str(4 * 1024 * 1024)}
    svc = ServiceProcess(kubeconfig, workdir, env).start()
    try:
        first = f"/routes/{fleet.route_name(1)}/attainment"
        deadline = time.monotonic() + 120
        while httpx.get(svc.url + first, headers=AUTH).json()["source"]["status"] != "ok":
            if time.monotonic() > deadline:
                raise RuntimeError("attainment never became ok")
            time.sleep(0.5)
        gc_rss = svc.rss_kib()
        pages = pages_for(routes)
        for page in range(1, pages["last"] + 1):
            httpx.get(
                f"{svc.url}/config?view=attainment&page={page}&pageSize=200", headers=AUTH
            ).raise_for_status()
        page = pages["middle"]
        path = f"/config?view=attainment&sort=budget&page={page}&pageSize=200"
        real = httpx.get(f"{svc.url}{path}", headers=AUTH)
        real.raise_for_status()
        held_kib = svc.rss_kib() - gc_rss
        items = real.json()["items"]
        assert items
        assert items[0]["source"]["status"] == "ok"
        key = f"{routes}-attainment"
        httpx.put(f"{svc.url}/bench/baseline/{key}", content=real.content).raise_for_status()
        copy = httpx.get(f"{svc.url}/bench/baseline/{key}")
        assert copy.content == real.content
        service = Target(svc.url, [path], headers=AUTH)
        baseline = Target(svc.url, [f"/bench/baseline/{key}"], headers=AUTH)
        return {
            "page": page,
            "bytes": len(real.content),
            "routes": routes,
            "bytes_per_route": round(held_kib * 1024 / routes),
            "ran_at": time.strftime("%Y-%m-%d"),
            **side_by_side(service, baseline, s, s.config_connections, svc.pid),
        }
    finally:
        svc.stop()
