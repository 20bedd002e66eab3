"""`python -m bench` (`make bench`): start a control plane, fill it, measure slo-api, report.

Writes BENCHMARKS.md and bench/results.json. Not part of `make test`: nothing here asserts a
time; the goals are reported as met or not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import os
import platform
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench import cores, fanout, fleet_samples, flush_ratio, load, memory, populate, scenarios
from bench.report import fanout_runs, render
from controlplane import fleet
from controlplane.cluster import Cluster
from controlplane.jaeger import Jaeger
from controlplane.prometheus import Prometheus

REPO = Path(__file__).resolve().parent.parent
PACKAGES = (
    "fastapi",
    "starlette",
    "uvicorn",
    "uvloop",
    "httptools",
    "orjson",
    "pydantic",
    "kubernetes_asyncio",
    "aiohttp",
    "httpx",
)


def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((x.split(":", 1)[1].strip() for x in cpuinfo if x.startswith("model name")), "?")
    mem_kib = next(
        int(x.split()[1]) for x in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in x
    )
    wrk = shutil.which("wrk")
    wrk_version = ""
    if wrk:
        probe = subprocess.run([wrk, "-v"], capture_output=True, text=True, check=False)
        text = probe.stdout or probe.stderr
        wrk_version = text.splitlines()[0] if text else ""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "packages": versions,
        "load_generator": wrk_version or "httpx (in-process fallback)",
        "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3],
    }


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


async def _create(cluster: Cluster, start: int, stop: int, concurrency: int) -> populate.Created:
    pki = cluster.plane.pki
    async with populate.admin_client(
        cluster.plane.url, pki.ca_cert, pki.admin_cert, pki.admin_key, concurrency
    ) as client:
        return await populate.create_llms(client, start, stop, concurrency)


def _fanout(
    cluster: Cluster,
    kubeconfig: Path,
    workdir: Path,
    settings: scenarios.Settings,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One fan-out run per watcher count, each against a fresh slo-api (the SIGTERM measure
    ends it), by count."""
    pki = cluster.plane.pki
    client_args = (cluster.plane.url, pki.ca_cert, pki.admin_cert, pki.admin_key)
    runs: dict[str, Any] = {}
    for watchers in _counts(args.watchers):
        # Room for the streams the SIGTERM measure adds.
        env = {"MAX_WATCHERS": str(watchers + fanout.STALLED + 10)}
        svc = scenarios.ServiceProcess(kubeconfig, workdir, extra_env=env).start()
        try:
            log(f"fan-out: {watchers} change streams, 100 changes/s through the API server")
            with cores.apart(svc.pid) as pinned:
                result = fanout.fanout(
                    svc,
                    client_args,
                    workdir,
                    args.fanout_routes,
                    settings,
                    watchers=watchers,
                    rate=args.fanout_rate,
                )
            result["cores"] = pinned
        except fanout.NotOpened as exc:
            # One count out of reach of the machine must not lose the rest of the run.
            log(f"fan-out with {watchers} streams not measured: {exc}")
            result = {"watchers": watchers, "not_measured": str(exc)}
        finally:
            svc.stop()
        result["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
        result["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        runs[str(watchers)] = result
    return runs


def _counts(watchers: str) -> list[int]:
    return [int(x) for x in watchers.split(",") if x.strip() and int(x)]


def _merge_fanout(args: argparse.Namespace, fresh: dict[str, Any], began: float) -> int:
    """Put a fan-out-only run's figures into the existing results and report (the watcher
    counts not run this time stay as they were)."""
    if args.json.exists():
        results = json.loads(args.json.read_text())
    else:
        log(f"{args.json} does not exist: run the whole bench first for the other rows")
        return 1
    results["fanout"] = fanout_runs(results.get("fanout")) | fresh["fanout"]
    args.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    args.report.write_text(render(results))
    log(f"fan-out done in {(time.perf_counter() - began) / 60:.1f} min: {args.report}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--routes", default="10000,50000,100000", help="index sizes, comma-separated"
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one timed run")
    parser.add_argument("--sync-reps", type=int, default=3)
    parser.add_argument("--create-concurrency", type=int, default=16)
    parser.add_argument(
        "--only",
        choices=("fanout", "kubernetes", "history", "attainment", "flush", "fleet", "memory"),
        help="run only this scenario (kubernetes, history, attainment: at the smallest size; "
        "flush: the in-process flush through ASGI against its floor, no control plane; fleet: "
        "samples an attainment refresh loads with and without the recording rules, no "
        "control plane; memory: RSS with the history on, CRs with three managers, "
        "--memory-crs of them) and "
        "merge its figures into the existing results; the other figures stay as they were",
    )
    parser.add_argument(
        "--watchers",
        default="1000,5000",
        help="change streams in fan-out, comma-separated: one run each (0: no fan-out)",
    )
    parser.add_argument("--fanout-routes", type=int, default=1000, help="routes during fan-out")
    parser.add_argument("--fanout-rate", type=float, default=100.0, help="changes/s in fan-out")
    parser.add_argument(
        "--fleet",
        default="100x3x3600,1000x3x1800",
        help="fleet sizes for --only fleet: routes x pods per model x seconds of samples",
    )
    parser.add_argument("--memory-crs", type=int, default=10_000, help="CRs for --only memory")
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="--only memory: trace the replicas' heap and keep its breakdown (not RSS rows)",
    )
    parser.add_argument("--report", type=Path, default=REPO / "BENCHMARKS.md")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results.json")
    args = parser.parse_args()
    sizes = sorted(int(x) for x in args.routes.split(","))
    settings = scenarios.Settings(reps=args.reps, seconds=args.seconds)
    if args.only == "kubernetes":
        return run_only(args, sizes[0], settings)
    if args.only == "history":
        return run_history(args, sizes[0], settings)
    if args.only == "attainment":
        return run_attainment(args, sizes[0], settings)
    if args.only == "flush":
        return run_flush(args)
    if args.only == "fleet":
        return run_fleet(args)
    if args.only == "memory":
        return run_memory(args)

    began = time.perf_counter()
    if not load.ensure_wrk():
        log("wrk not available: using the in-process httpx generator (its CPU is reported)")
    results: dict[str, Any] = {"machine": machine(), "settings": vars(args) | {"sizes": sizes}}
    results["settings"]["report"] = str(args.report.name)
    results["settings"]["json"] = str(args.json.name)
    workdir = Path(tempfile.mkdtemp(prefix="slo-api-bench-"))
    cluster = Cluster(workdir / "cluster")
    log("starting the control plane")
    cluster.start(kubeconfig_dir=workdir / "kubeconfigs")
    try:
        assert cluster.admin is not None
        assert cluster.credentials is not None
        kubeconfig = cluster.credentials.slo_api_kubeconfig
        sa_token = cluster.credentials.slo_api_token
        cluster.admin.ensure_namespace(fleet.NAMESPACE)
        context = ssl.create_default_context(cafile=str(cluster.plane.pki.ca_cert))
        api = httpx.Client(
            base_url=cluster.plane.url,
            verify=context,
            headers={"Authorization": f"Bearer {sa_token}"},
            timeout=120,
        )
        created = 0
        if args.only != "fanout":
            log("empty index: process start and memory, and what each library costs")
            results["empty"] = scenarios.initial_sync(kubeconfig, workdir, api, 0, args.sync_reps)
            results["libraries"] = scenarios.library_costs()
        if _counts(args.watchers):
            log(f"creating LLM CRs 0..{args.fanout_routes - 1} for the fan-out")
            asyncio.run(_create(cluster, 0, args.fanout_routes, args.create_concurrency))
            created = args.fanout_routes
            results["fanout"] = _fanout(cluster, kubeconfig, workdir, settings, args)
        if args.only == "fanout":
            return _merge_fanout(args, results, began)
        results["sizes"] = {}
        for size in sizes:
            log(f"creating LLM CRs {created}..{size - 1}")
            made = asyncio.run(_create(cluster, created, size, args.create_concurrency))
            created = size
            log(f"created {made.count} in {made.seconds:.1f}s ({made.per_second:.0f}/s)")
            entry: dict[str, Any] = {"created": vars(made) | {"per_s": made.per_second}}
            log(f"{size} routes: initial sync against a plain list")
            entry["sync"] = scenarios.initial_sync(kubeconfig, workdir, api, size, args.sync_reps)
            if size == sizes[0]:
                log(f"{size} routes: a Kubernetes identity against the static token")
                entry["kubernetes"] = _kubernetes(cluster, kubeconfig, workdir, size, settings)
                log(f"{size} routes: tracing absent, off, and on at ratio 1.0 (to Jaeger)")
                entry["tracing"] = _tracing(kubeconfig, workdir, size, settings)
                log(f"{size} routes: PUT with the history recorded against it off")
                results["history"] = scenarios.history_writes(kubeconfig, workdir, size, settings)
            svc = scenarios.ServiceProcess(kubeconfig, workdir).start()
            try:
                entry["info"] = svc.info()
                log(f"{size} routes: GET /config against the baseline ({entry['info']})")
                entry["config"] = scenarios.config_pages(svc, size, settings)
                if size == sizes[-1]:
                    log(f"{size} routes: GET /routes/{{route}} against a direct GET")
                    entry["get_route"] = scenarios.get_route(
                        svc, cluster.plane.url, sa_token, size, settings
                    )
                    entry["get_route_many"] = scenarios.get_route_many(
                        svc, cluster.plane.url, sa_token, size, settings
                    )
                    entry["get_route_aiohttp"] = scenarios.aiohttp_direct(
                        cluster.plane.url, sa_token, cluster.plane.pki.ca_cert, size, settings
                    )
                    log(f"{size} routes: PUT /routes/{{route}} against direct merge patches")
                    entry["put_route"] = scenarios.put_route(
                        svc, cluster.plane.url, sa_token, size, settings
                    )
                entry["rss_after_load_kib"] = svc.rss_kib()
            finally:
                svc.stop()
            results["sizes"][str(size)] = entry
        api.close()
        log("watch events applied per second (no network)")
        results["watch_apply"] = scenarios.watch_apply(population=sizes[-1])
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    results["flush"] = _flush(args)
    results["total_seconds"] = time.perf_counter() - began
    _carry_over(args.json, results)
    args.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    args.report.write_text(render(results))
    log(f"done in {results['total_seconds'] / 60:.1f} min: {args.report} and {args.json}")
    return 0


# Figures measured by their own command, not by the full run (the fan-out: when run with
# --watchers 0): kept from the last results, each with the time it was measured.
MEASURED_ALONE = {
    "stream_costs": "python -m bench.stream_costs",
    "fanout": "python -m bench --only fanout",
    "attainment": "python -m bench --only attainment",
    "fleet": "python -m bench --only fleet",
    "memory": "python -m bench --only memory",
}


def _carry_over(path: Path, results: dict[str, Any]) -> None:
    """Keep what another command measured (each entry says when), so the report keeps it."""
    if not path.exists():
        return
    previous = json.loads(path.read_text())
    for key, command in MEASURED_ALONE.items():
        if key in previous and key not in results:
            log(f"{key}: kept from {path.name} (measured alone by `{command}`)")
            results[key] = previous[key]


def _kubernetes(
    cluster: Cluster, kubeconfig: Path, workdir: Path, size: int, settings: scenarios.Settings
) -> dict[str, Any]:
    assert cluster.admin is not None
    user_token = scenarios.kubernetes_identity_setup(cluster.admin)
    try:
        svc = scenarios.ServiceProcess(
            kubeconfig, workdir, {"SLO_API_KUBERNETES_AUTH": "true"}
        ).start()
        try:
            return scenarios.kubernetes_identity(svc, user_token, size, settings)
        finally:
            svc.stop()
    finally:
        scenarios.kubernetes_identity_teardown(cluster.admin)


def _tracing(
    kubeconfig: Path, workdir: Path, size: int, settings: scenarios.Settings
) -> dict[str, Any]:
    jaeger = Jaeger(workdir / "jaeger").start()
    try:
        result = scenarios.tracing_costs(kubeconfig, workdir, jaeger.otlp_endpoint, size, settings)
        # What reached the backend: the "on" rows' spans went somewhere real.
        result["traces_stored"] = len(jaeger.traces("slo-api-bench", limit=100_000))
        return result
    finally:
        jaeger.stop()


def _in_run_order(results: dict[str, Any]) -> None:
    """Put back the order a full run renders in (results.json is written with sorted keys)."""
    packages = results["machine"]["packages"]
    results["machine"]["packages"] = {p: packages[p] for p in PACKAGES if p in packages}
    for entry in results["sizes"].values():
        pages = entry["config"]
        entry["config"] = dict(sorted(pages.items(), key=lambda item: item[1]["page"]))


@contextlib.contextmanager
def _fresh_plane(
    args: argparse.Namespace, size: int = 0, prometheus: Prometheus | None = None
) -> Iterator[tuple[Cluster, Path]]:
    """A control plane of its own in a scratch folder, with `size` LLM CRs in the fleet's
    namespace (and `prometheus` started beside it), stopped and removed afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="slo-api-bench-"))
    cluster = Cluster(workdir / "cluster")
    log("starting the control plane")
    try:
        if prometheus is not None:
            prometheus.start()
        cluster.start(kubeconfig_dir=workdir / "kubeconfigs")
        assert cluster.admin is not None
        assert cluster.credentials is not None
        cluster.admin.ensure_namespace(fleet.NAMESPACE)
        if size:
            log(f"creating {size} LLM CRs")
            asyncio.run(_create(cluster, 0, size, args.create_concurrency))
        yield cluster, workdir
    finally:
        cluster.stop()
        if prometheus is not None:
            prometheus.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _merged(args: argparse.Namespace, results: dict[str, Any]) -> int:
    """Write the results of the last full run with one measure merged in, and the report."""
    _in_run_order(results)
    args.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    args.report.write_text(render(results))
    log(f"merged into {args.json} and {args.report}")
    return 0


def run_only(args: argparse.Namespace, size: int, settings: scenarios.Settings) -> int:
    """One scenario on a fresh control plane, merged into the results of the last full run."""
    results: dict[str, Any] = json.loads(args.json.read_text())
    if str(size) not in results.get("sizes", {}):
        log(f"{args.json} has no {size}-route results to merge into: run `make bench` first")
        return 2
    with _fresh_plane(args, size) as (cluster, workdir):
        assert cluster.credentials is not None
        log(f"{size} routes: a Kubernetes identity against the static token")
        entry = _kubernetes(
            cluster, cluster.credentials.slo_api_kubeconfig, workdir, size, settings
        )
    entry["loadavg_at_start"] = machine()["loadavg_at_start"]
    results["sizes"][str(size)]["kubernetes"] = entry
    return _merged(args, results)


def _flush(args: argparse.Namespace) -> dict[str, Any]:
    counts = _counts(args.watchers) or [1000, 5000]
    log(f"a flush through ASGI against a bare transport.write, in-process: {counts} streams")
    result = flush_ratio.run(counts, flush_ratio.REPS)
    for count, r in result["runs"].items():
        log(
            f"flush to {int(count):,} streams: {r['asgi_us_per_stream']:.1f} us a stream through "
            f"ASGI, {r['floor_us_per_stream']:.1f} us bare: {r['ratio']:.2f}x (goal <= "
            f"{r['goal']:g}x: {'met' if r['met'] else 'NOT met'})"
        )
    return result


def run_flush(args: argparse.Namespace) -> int:
    """The in-process flush ratio alone, merged into the results of the last full run."""
    results: dict[str, Any] = json.loads(args.json.read_text())
    results["flush"] = _flush(args)
    return _merged(args, results)


def run_history(args: argparse.Namespace, size: int, settings: scenarios.Settings) -> int:
    """The write path with history on against off, on a fresh control plane, merged into the
    results of the last full run (the row stands alone: both sides are measured here)."""
    results: dict[str, Any] = json.loads(args.json.read_text())
    with _fresh_plane(args, size) as (cluster, workdir):
        assert cluster.credentials is not None
        log(f"{size} routes: PUT with the history recorded against it off")
        entry = scenarios.history_writes(
            cluster.credentials.slo_api_kubeconfig, workdir, size, settings
        )
    entry["loadavg_at_start"] = machine()["loadavg_at_start"]
    entry["alone"] = True
    results["history"] = entry
    return _merged(args, results)


def run_attainment(args: argparse.Namespace, size: int, settings: scenarios.Settings) -> int:
    """/config?view=attainment against its precomputed bytes, with a real Prometheus holding a
    day of vLLM histograms for the fleet's models, merged into the results of the last run."""
    results: dict[str, Any] = json.loads(args.json.read_text())
    scratch = Path(tempfile.mkdtemp(prefix="slo-api-bench-prometheus-"))
    prometheus = Prometheus(scratch)
    log("backfilling Prometheus")
    prometheus.backfill(scenarios.vllm_openmetrics(97))
    try:
        with _fresh_plane(args, size, prometheus) as (cluster, workdir):
            assert cluster.credentials is not None
            log(f"{size} routes: /config?view=attainment against the precomputed page")
            entry = scenarios.attainment_pages(
                cluster.credentials.slo_api_kubeconfig, workdir, prometheus.url, size, settings
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    entry["loadavg_at_start"] = machine()["loadavg_at_start"]
    results["attainment"] = entry
    return _merged(args, results)


def run_fleet(args: argparse.Namespace) -> int:
    """Samples an attainment refresh loads (Prometheus's statistics), without and with the
    recording rules, at each size of --fleet, merged into the results of the last run."""
    results: dict[str, Any] = json.loads(args.json.read_text())
    runs = []
    for size in args.fleet.split(","):
        routes, pods, span = (int(x) for x in size.split("x"))
        runs.append(fleet_samples.measure(routes, pods, span))
    results["fleet"] = {"runs": runs, "loadavg_at_start": machine()["loadavg_at_start"]}
    return _merged(args, results)


def run_memory(args: argparse.Namespace) -> int:
    """RSS of a replica that watched GitOps-managed CRs being made and changed, and of one
    started after, against the empty process, on a fresh control plane (see bench.memory)."""
    results: dict[str, Any] = json.loads(args.json.read_text())
    with _fresh_plane(args) as (cluster, workdir):
        assert cluster.credentials is not None
        pki = cluster.plane.pki
        log(f"{args.memory_crs} GitOps-managed LLM CRs, each changed twice, watched by a replica")
        entry = memory.measure(
            (cluster.plane.url, pki.ca_cert, pki.admin_cert, pki.admin_key),
            cluster.credentials.slo_api_kubeconfig,
            workdir,
            args.memory_crs,
            args.create_concurrency,
            tracemalloc=args.tracemalloc,
        )
    entry["loadavg_at_start"] = machine()["loadavg_at_start"]
    if args.tracemalloc:
        out = args.json.with_name("heap.json")
        out.write_text(json.dumps(entry, indent=1) + "\n")
        log(f"heap breakdown in {out}")
        return 0
    log(
        f"empty {entry['empty_kib'] / 1024:.0f} MiB; watched {entry['watched_kib'] / 1024:.0f} MiB "
        f"({entry['watched_mib_per_10k']:.1f} per 10,000); started after "
        f"{entry['after_kib'] / 1024:.0f} MiB ({entry['after_mib_per_10k']:.1f} per 10,000)"
    )
    results["memory"] = entry
    return _merged(args, results)


if __name__ == "__main__":
    sys.exit(main())
