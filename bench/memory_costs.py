"""Where the memory of a CR goes, in-process, no control plane: `python -m bench.memory_costs`.

The index, the route history and the change log of one process (as the runtime wires them,
history on, the summary view followed as it always is) are fed the states of N LLM CRs that
`python -m bench --only memory` makes on a real control plane: applied by Argo CD
(server-side, its tracking annotation), status written by an operator, one client-owned
field changed with kubectl edit. Two ways, as that bench measures two replicas:

- **watched**: each CR's three states arrive as watch events, each decoded anew as the
  informer's are, its strings its own (a revision is recorded for the edit; the API server
  here takes every revision and lists none);
- **started after**: the edited states arrive as a list (the index's entries), and every
  marked CR's seed reads back no revision.

What is still held once everything settled is grouped by tracemalloc's tracebacks: by the
part of slo-api that holds it (the allocation's outermost slo-api module beyond the index's
own entry points), then by line. Allocator slack and what peaks left behind are not in it:
`python -m bench --only memory` measures the resident memory.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import tracemalloc
from typing import Any

import orjson

from bench.memory import status_of
from controlplane.fleet import NAMESPACE, llm
from slo_api.feed import Feed
from slo_api.history import History
from slo_api.kinds import build_kinds
from slo_api.metrics import Metrics
from slo_api.ownership import Ownership
from slo_api.service import Service
from slo_api.settings import Settings

PLURAL = "llmslorequirements"
GROUP = "inference.modelsphere.dev"
Obj = dict[str, Any]


class _ApiServer:
    """What the history asks of the API server: revisions are taken, none are listed."""

    timeout = 30.0

    async def create(self, res: Any, namespace: str, body: Obj) -> Obj:
        return body

    async def list(self, res: Any, **_: Any) -> Obj:
        return {"items": [], "metadata": {}}


def _fields(spec: Obj, skip: tuple[str, ...] = ()) -> Obj:
    return {
        f"f:{k}": ({f"f:{kk}": {} for kk in v} if isinstance(v, dict) else {})
        for k, v in spec.items()
        if k not in skip
    }


def states(i: int) -> list[Obj]:
    """One CR's three states, managedFields as the API server writes them."""
    applied = llm(i)
    name = applied["metadata"]["name"]
    minute, second = (i // 300) % 60, (i // 5) % 60  # five CRs applied a second
    times = [f"2026-12-04T{h}:{minute:02d}:{second:02d}Z" for h in (15, 16, 17)]
    meta = applied["metadata"]
    meta["annotations"] = {
        "argocd.argoproj.io/tracking-id": f"apps:{GROUP}/LLMSLORequirement:{NAMESPACE}/{name}"
    }
    meta |= {
        "uid": f"{i:08d}-1111-4222-8333-{i:012d}",
        "creationTimestamp": times[0],
        "generation": 1,
        "resourceVersion": str(1000 + 3 * i),
    }
    common = {"apiVersion": f"{GROUP}/v1alpha1", "fieldsType": "FieldsV1"}
    argo: Obj = {
        "manager": "argocd-controller",
        "operation": "Apply",
        "time": times[0],
        **common,
        "fieldsV1": {
            "f:metadata": {"f:annotations": {"f:argocd.argoproj.io/tracking-id": {}}},
            "f:spec": _fields(applied["spec"]),
        },
    }
    meta["managedFields"] = [argo]
    status = copy.deepcopy(applied)
    status["metadata"]["resourceVersion"] = str(1001 + 3 * i)
    status.update(status_of(times[1]))
    operator = {
        "manager": "llm-operator",
        "operation": "Update",
        "time": times[1],
        "subresource": "status",
        **common,
        "fieldsV1": {"f:status": {"f:conditions": {}, "f:observedGeneration": {}}},
    }
    status["metadata"]["managedFields"] = [copy.deepcopy(argo), operator]
    edited = copy.deepcopy(status)
    edited["metadata"] |= {"resourceVersion": str(1002 + 3 * i), "generation": 2}
    edited["spec"]["priority"] = (i + 1) % 11
    argo_after = copy.deepcopy(argo)
    argo_after["fieldsV1"]["f:spec"] = _fields(applied["spec"], skip=("priority",))
    edit = {
        "manager": "kubectl-edit",
        "operation": "Update",
        "time": times[2],
        **common,
        "fieldsV1": {"f:spec": {"f:priority": {}}},
    }
    edited["metadata"]["managedFields"] = [argo_after, copy.deepcopy(operator), edit]
    return [applied, status, edited]


def _part(frames: list[str]) -> str:
    for part in ("/slo_api/feed/", "/slo_api/history/", "/slo_api/ownership", "/slo_api/index"):
        if any(part in f for f in frames):
            return part.strip("/").removeprefix("slo_api/").rstrip("/")
    return "other"


async def measure(crs: int, mode: str, top: int) -> dict[str, Any]:
    settings = Settings(slo_api_token="bench-token-not-a-secret")  # noqa: S106
    kinds = build_kinds(settings)
    ownership = Ownership()
    kube: Any = _ApiServer()
    index = Service.index_for(kinds, ownership)
    history = History(kube, kinds, settings.route_history_entries, ownership=ownership)
    service = Service(kube, kinds, index, ownership, remembered=history.remembered)
    index.on_observed(history.observe)
    Feed(
        service,
        Metrics(),
        history_bytes=settings.watch_history_bytes,
        max_streams=settings.max_watchers,
        streams_per_identity=settings.watch_streams_per_identity,
        bookmark_seconds=settings.watch_bookmark_seconds,
        by=history.by,
    )
    gc.collect()
    tracemalloc.start(32)
    before = tracemalloc.take_snapshot()
    if mode == "watched":
        for i in range(crs):
            for state in states(i):
                index.upsert(PLURAL, orjson.loads(orjson.dumps(state)), GROUP)
            await asyncio.sleep(0)
    else:
        listed = [
            index.entry(PLURAL, orjson.loads(orjson.dumps(states(i)[-1])), GROUP)
            for i in range(crs)
        ]
        index.replace(PLURAL, listed, GROUP)
        del listed
    for _ in range(100):  # what the history and the change log do in the background
        await asyncio.sleep(0)
    await history.close()
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    parts: dict[str, int] = {}
    lines: dict[str, int] = {}
    for stat in after.compare_to(before, "traceback"):
        frames = [f.filename for f in stat.traceback]
        ours = [f for f in stat.traceback if "/slo_api/" in f.filename] or [stat.traceback[-1]]
        # The two innermost slo-api lines: a helper (exact, BoundedDict) and its caller.
        key = " < ".join(
            f"{f.filename.split('/slo_api/')[-1]}:{f.lineno}" for f in reversed(ours[-2:])
        )
        parts[_part(frames)] = parts.get(_part(frames), 0) + stat.size_diff
        lines[key] = lines.get(key, 0) + stat.size_diff
    total = sum(parts.values())
    return {
        "mode": mode,
        "crs": crs,
        "bytes_per_cr": round(total / crs),
        "mib_per_10k": round(total / crs * 10_000 / 2**20, 1),
        "parts": {k: round(v / crs) for k, v in sorted(parts.items(), key=lambda kv: -kv[1])},
        "lines": [
            (k, round(v / crs)) for k, v in sorted(lines.items(), key=lambda kv: -kv[1])[:top]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.memory_costs", description=__doc__)
    parser.add_argument("--crs", type=int, default=2000)
    parser.add_argument("--top", type=int, default=15, help="lines shown")
    args = parser.parse_args()
    for mode in ("watched", "after"):
        result = asyncio.run(measure(args.crs, mode, args.top))
        print(f"{mode}: {result['bytes_per_cr']} B per CR ({result['mib_per_10k']} MiB per 10,000)")
        for part, size in result["parts"].items():
            print(f"  {part}: {size} B per CR")
        for line, size in result["lines"]:
            print(f"    {size:6d} B  {line}")


if __name__ == "__main__":
    main()
