"""In-process costs of the change feed, without a control plane: `python -m bench.stream_costs`.

- CPU of one new stream's initial state (static token, summary and full view) at N routes,
  the first stream and the next (the per-route frames cached by then);
- memory a history entry holds beside its item (tracemalloc);
- the longest turn of the event loop while a relist that changes every route is applied with
  S streams open (the index's replace in turns, as the informer runs it, and the feed's
  recording), and whether every caught-up stream stays open;
- the memory such a relist holds on top of the index (tracemalloc): the listed entries, the
  copy of the index built aside, the change log's records.

`--old PATH` runs the first measure against another implementation of the feed module (the
one this replaced, to compare) where its interface allows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import time
import tracemalloc
from typing import Any

from slo_api.feed import Feed
from slo_api.feed.history import Change, History, More
from slo_api.kinds import build_kinds
from slo_api.metrics import Metrics
from slo_api.service import Service
from slo_api.settings import Settings

LLM = "llmslorequirements"
GROUP = "inference.modelsphere.dev"


def llm(i: int, rv: int, priority: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "LLMSLORequirement",
        "metadata": {
            "namespace": f"ns{i % 50}",
            "name": f"svc-{i}",
            "uid": f"uid-{i}",
            "resourceVersion": str(rv),
        },
        "spec": {
            "serviceId": f"route-{i:06d}",
            "priority": priority,
            "minimumDeployment": {"type": "replica", "value": 1},
            "maximumDeployment": {"type": "replica", "value": 4},
            "ttft": {"default": {"metrics": [{"type": "p90", "threshold": 0.8}]}},
            "otps": {"default": {"metrics": [{"type": "avg", "threshold": 20}]}},
        },
    }


def service(routes: int) -> Service:
    kinds = build_kinds(Settings(slo_api_token="bench-token-not-a-secret"))  # noqa: S106
    svc = Service(None, kinds, Service.index_for(kinds))  # type: ignore[arg-type]
    svc.index.reached(LLM, GROUP, None, "1")
    svc.index.replace(LLM, [llm(i, 1) for i in range(routes)], GROUP)
    return svc


def feed(svc: Service, history_bytes: int = 64 << 20) -> Feed:
    return Feed(
        svc,
        Metrics(),
        history_bytes=history_bytes,
        max_streams=100_000,
        streams_per_identity=100_000,
        bookmark_seconds=3600,
        flush_seconds=0,
    )


async def _initial_cpu(f: Feed, view: str) -> float:
    async def write(chunk: bytes) -> None:
        pass

    stream = f.open(view, None)
    started = time.process_time()
    await f._initial(stream, write)
    spent = time.process_time() - started
    f.close(stream)
    return spent


async def initial_state(routes: int) -> dict[str, float]:
    f = feed(service(routes))
    out = {}
    for view in ("summary", "full"):
        out[f"{view}_first_ms"] = 1000 * await _initial_cpu(f, view)
        out[f"{view}_next_ms"] = 1000 * await _initial_cpu(f, view)
    return out


def history_bytes_per_change(changes: int) -> float:
    """What a history entry holds beside its items (those are the index's lines, shared while
    current; the budget counts each entry's item and one framed copy of it on top of this)."""
    items = [b"x" * 300 for _ in range(changes)]
    routes = [f"route-{i:06d}" for i in range(changes)]
    owners = (("llm", "ns1", GROUP),)
    source = (LLM, GROUP, "")
    history = History("summary", None, 0, 1 << 40)
    more = More(None, shared=True)  # what the log gives every change that is not framed yet
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(changes):
        change = Change(routes[i], items[i], owners, owners, source, more)
        history.append(i + 1, i, change)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held / changes


async def relist(routes: int, streams: int, freeze: bool = True) -> dict[str, float]:
    svc = service(routes)
    f = feed(svc)
    written = [0] * streams

    async def run(n: int) -> None:
        async def write(chunk: bytes) -> None:
            written[n] += len(chunk)
            await asyncio.sleep(0)

        stream = f.open("summary", None)
        with contextlib.suppress(asyncio.CancelledError):
            await f.serve(stream, write)

    tasks = [asyncio.create_task(run(n)) for n in range(streams)]
    for _ in range(100):  # every stream through its initial state (a few loop turns each)
        await asyncio.sleep(0)
    # The informer builds the entries as it reads the list; what stalls the loop is after:
    # the index's replace (in turns, as the informer runs it), then the feed's recording.
    # As the informer reads a list: page by page into entries, no decoded CR kept.
    entries = [svc.index.entry(LLM, llm(i, 3, priority=1 + i % 9), GROUP) for i in range(routes)]
    if freeze:  # as the runtime does once every kind is first listed
        gc.collect()
        gc.freeze()
    longest = 0.0
    done = False

    async def ticker() -> None:
        nonlocal longest
        while not done:
            tick = time.perf_counter()
            await asyncio.sleep(0)
            longest = max(longest, time.perf_counter() - tick)

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    started = time.perf_counter()
    svc.index.reached(LLM, GROUP, None, "3")
    await svc.index.replace_in_turns(LLM, entries, GROUP)
    replaced = time.perf_counter() - started
    # Polled on purpose: every turn of the loop is one the ticker measures.
    while f.log._pending or time.perf_counter() - started < replaced + 0.5:  # noqa: ASYNC110
        await asyncio.sleep(0)
    done = True
    await ticking
    stall = longest
    ended = sum(1 for s in f.streams if s.ended is not None)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    gc.unfreeze()
    return {
        "streams": streams,
        "replace_wall_ms": 1000 * replaced,
        "longest_turn_ms": 1000 * stall,
        "streams_ended": ended,
    }


async def relist_memory(routes: int) -> dict[str, float]:
    """MiB per 10,000 CRs that a relist changing every CR holds beside the index it replaces
    (tracemalloc): once the list is read, at the peak while it is applied, and after it."""
    tracemalloc.start()
    svc = service(routes)
    f = feed(svc, history_bytes=Settings.model_fields["watch_history_bytes"].default)
    gc.collect()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()  # the index's build is not what is measured
    entries = [svc.index.entry(LLM, llm(i, 3, priority=1 + i % 9), GROUP) for i in range(routes)]
    listed = tracemalloc.get_traced_memory()[0]
    svc.index.reached(LLM, GROUP, None, "3")
    await svc.index.replace_in_turns(LLM, entries, GROUP)
    del entries
    while f.log._pending:  # noqa: ASYNC110 (the change log records it in turns)
        await asyncio.sleep(0)
    gc.collect()
    after, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    per = 10_000 / routes / 2**20
    return {
        "index_mib": base * per,
        "listed_mib": (listed - base) * per,
        "peak_mib": (peak - base) * per,
        "after_mib": (after - base) * per,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_costs", description=__doc__)
    parser.add_argument("--routes", type=int, default=100_000)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=20_000)
    args = parser.parse_args()
    out: dict[str, Any] = {"routes": args.routes}
    out["initial_state"] = asyncio.run(initial_state(args.routes))
    out["history_bytes_per_change"] = round(history_bytes_per_change(args.changes))
    out["relist"] = asyncio.run(relist(args.routes, args.streams))
    out["relist_without_gc_freeze"] = asyncio.run(relist(args.routes, args.streams, False))
    out["relist_memory_per_10k"] = asyncio.run(relist_memory(args.routes))
    out["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out["loadavg"] = " ".join(open("/proc/loadavg").read().split()[:3])  # noqa: SIM115
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
