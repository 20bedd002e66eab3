"""Resident memory with the route history on, for CRs a GitOps tool manages and others changed.

`python -m bench --only memory`: on a fresh control plane, each LLM CR is applied server-side
by `argocd-controller` with Argo CD's tracking annotation, then its status is written by an
operator (`llm-operator`, the status subresource) and one client-owned field changed by a
person (`kubectl-edit`, a merge patch): every CR carries three managers, one change is
recorded in its history, and the ownership memory holds an overridden owner for it.

Two replicas are measured, as a pod's memory limit must hold either:

- **watched**: started on the empty control plane (its RSS then is the baseline), it watches
  every CR being made and changed and records each change's revision;
- **started after**: a fresh replica started once it is all done, which lists the CRs and
  reads back the owners their newest revisions remember (the seed).

Each is measured once what it does in the background is over: no more calls to the API
server for `SETTLED` seconds. With `--tracemalloc`, the same run is made with
`PYTHONTRACEMALLOC` set and the launcher's `/bench/heap` breakdown is kept instead of RSS
(tracing costs memory of its own).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench import populate
from bench.scenarios import ServiceProcess
from controlplane.fleet import NAMESPACE, llm, route_name

GITOPS = "argocd-controller"
OPERATOR = "llm-operator"
PERSON = "kubectl-edit"
# The goal: RSS grows at most this much per 10,000 CRs over the empty process.
GOAL_MIB_PER_10K = 20.0
# No call to the API server for this long: the replica's background work is over.
SETTLED = 8.0
Obj = dict[str, Any]


def gitops_llm(i: int) -> Obj:
    obj = llm(i)
    name = obj["metadata"]["name"]
    obj["metadata"]["annotations"] = {
        "argocd.argoproj.io/tracking-id": (
            f"bench-apps:inference.modelsphere.dev/LLMSLORequirement:{NAMESPACE}/{name}"
        )
    }
    return obj


def status_of(when: str = "2026-12-04T00:00:00Z") -> Obj:
    """The status the operator writes to each CR (a merge patch's body)."""
    return {
        "status": {
            "observedGeneration": 1,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Deployed",
                    "message": "every replica serves the model",
                    "lastTransitionTime": when,
                }
            ],
        }
    }


async def make_and_change(
    client: httpx.AsyncClient, start: int, stop: int, concurrency: int
) -> float:
    """Apply, status-update and change CRs start..stop-1; seconds taken."""
    numbers = iter(range(start, stop))
    path = f"{populate.SLO_PATH}/namespaces/{NAMESPACE}/llmslorequirements"

    async def call(url: str, body: Obj, content_type: str, manager: str, force: bool) -> None:
        params = {"fieldManager": manager} | ({"force": "true"} if force else {})
        for attempt in range(8):
            response = await client.patch(
                url,
                content=orjson.dumps(body),
                headers={"Content-Type": content_type},
                params=params,
            )
            if response.status_code == 200 or response.status_code == 201:
                return
            if response.status_code in (409, 429) or response.status_code >= 500:
                await asyncio.sleep(0.2 * (attempt + 1))
                continue
            raise RuntimeError(f"{url}: {response.status_code} {response.text[:300]}")
        raise RuntimeError(f"{url}: gave up")

    async def worker() -> None:
        for i in numbers:
            url = f"{path}/{route_name(i)}"
            await call(url, gitops_llm(i), "application/apply-patch+yaml", GITOPS, True)
            await call(
                f"{url}/status", status_of(), "application/merge-patch+json", OPERATOR, False
            )
            change = {"spec": {"priority": (i + 1) % 11}}
            await call(url, change, "application/merge-patch+json", PERSON, False)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - began


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def settle(svc: ServiceProcess, stored_at_least: int = 0, timeout: float = 900) -> float:
    """Wait until the replica recorded `stored_at_least` revisions (stored or already there)
    and then made no call to the API server for SETTLED seconds; seconds waited."""
    began = time.perf_counter()
    last, quiet_since = -1.0, time.perf_counter()
    with httpx.Client(base_url=svc.url, timeout=60) as client:
        while time.perf_counter() - began < timeout:
            try:
                text = client.get("/metrics").text
            except httpx.TimeoutException:  # a traced heap is slow: busy, not quiet
                quiet_since = time.perf_counter()
                continue
            calls = _metric(text, "slo_api_upstream_requests_total")
            recorded = _metric(text, "slo_api_history_entries_total", outcome="stored") + _metric(
                text, "slo_api_history_entries_total", outcome="already"
            )
            if calls != last:
                last, quiet_since = calls, time.perf_counter()
            elif recorded >= stored_at_least and time.perf_counter() - quiet_since >= SETTLED:
                return time.perf_counter() - began
            time.sleep(1.0)
    raise RuntimeError(f"replica did not settle in {timeout:.0f} s")


def heap(svc: ServiceProcess) -> Any:
    return httpx.get(f"{svc.url}/bench/heap", timeout=600).json()


def measure(
    client_args: tuple[str, Path, Path, Path],
    kubeconfig: Path,
    workdir: Path,
    crs: int,
    concurrency: int,
    tracemalloc: bool = False,
) -> dict[str, Any]:
    """Both replicas at `crs` CRs (see the module's doc)."""
    env = {"PYTHONTRACEMALLOC": "8"} if tracemalloc else {}
    out: dict[str, Any] = {"crs": crs, "tracemalloc": tracemalloc}
    watched = ServiceProcess(kubeconfig, workdir, env).start()
    try:
        time.sleep(SETTLED)
        out["empty_kib"] = watched.rss_kib()
        if tracemalloc:
            out["empty_heap"] = heap(watched)

        async def fill() -> float:
            async with populate.admin_client(*client_args, concurrency) as client:
                return await make_and_change(client, 0, crs, concurrency)

        out["fill_s"] = asyncio.run(fill())
        out["watched_settle_s"] = settle(watched, stored_at_least=crs)
        out["watched_kib"] = watched.rss_kib()
        out["watched_peak_kib"] = watched.peak_kib()
        if tracemalloc:
            out["watched_heap"] = heap(watched)
    finally:
        watched.stop()
    after = ServiceProcess(kubeconfig, workdir, env).start()
    try:
        out["after_settle_s"] = settle(after)
        out["after_kib"] = after.rss_kib()
        out["after_peak_kib"] = after.peak_kib()
        if tracemalloc:
            out["after_heap"] = heap(after)
    finally:
        after.stop()
    scale = 10_000 / crs / 1024
    out["watched_mib_per_10k"] = (out["watched_kib"] - out["empty_kib"]) * scale
    out["after_mib_per_10k"] = (out["after_kib"] - out["empty_kib"]) * scale
    out["goal_mib_per_10k"] = GOAL_MIB_PER_10K
    out["ran_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return out
