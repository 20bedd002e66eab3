"""Samples one attainment refresh loads from Prometheus, by Prometheus's own query statistics
(`stats=all`: `totalQueryableSamples`), at fleet sizes, without and with the recording rules
`sloctl rules` writes (`python -m bench --only fleet`).

No control plane: slo-api's attainment (the same code as the server's) runs in process over an
index of LLM CRs, against Debian's Prometheus backfilled with vLLM-shaped histograms of several
pods per model scraped every 15 s; the rules are built from slo-api's own answer, backfilled
over the same data with `promtool tsdb create-blocks-from rules`, and the refresh measured again
on a Prometheus holding both. The span is short (a real 28 days would be billions of samples to
backfill): every window longer than it loads the span, so the figures' ratio is the one for any
span; coverage's subqueries find fewer steps in a short span than in 28 days (their share is
counted apart), and docs/operating.md gives the formula for 28 days, coverage included.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import httpx
import yaml

from controlplane.prometheus import Prometheus, binary
from slo_api.attainment import recorded as recorded_series
from slo_api.attainment.cache import Attainment
from slo_api.attainment.prometheus import Prometheus as Client
from slo_api.attainment.selectors import parse_route_labels
from slo_api.cli import rules
from slo_api.kinds import build_kinds
from slo_api.metrics import Metrics
from slo_api.service import Service
from slo_api.settings import Settings

SCRAPE = 15
TTFT = "vllm:time_to_first_token_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
BOUNDS = {
    TTFT: (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5,
           10, 20, 40, 80, 160, 640, 2560, math.inf),
    TPOT: (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
           20, 40, 80, math.inf),
}  # fmt: skip
# Requests per scrape by bucket bound (not cumulative).
SHAPE = {TTFT: {0.1: 3, 0.25: 5, 0.5: 4, 1: 1}, TPOT: {0.025: 5, 0.05: 6, 0.1: 2}}
OBJECTIVES: dict[str, Any] = {
    "ttft": {"default": {"metrics": [{"type": "p90", "threshold": 0.5}]}},
    "otps": {"default": {"metrics": [{"type": "p50", "threshold": 20}]}},
}
GOAL = 50  # raw samples / recorded samples


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _write(path: Path, routes: int, pods: int, end: int, span: int) -> int:
    """OpenMetrics of every route's pods, a family at a time; the number of series."""
    count = 0
    with path.open("w") as out:
        for name, bounds in BOUNDS.items():
            out.write(f"# TYPE {name} histogram\n")
            times = range(end - span, end + 1, SCRAPE)
            for r in range(routes):
                for pod in range(pods):
                    labels = f'model_name="m{r}",pod="{pod}"'
                    below = 0
                    for bound in bounds:
                        below += SHAPE[name].get(bound, 0)
                        le = "+Inf" if math.isinf(bound) else f"{bound:g}"
                        series = f'{name}_bucket{{{labels},le="{le}"}}'
                        out.writelines(
                            f"{series} {1000 + below * i} {t}\n" for i, t in enumerate(times)
                        )
                        count += 1
                    out.writelines(
                        f"{name}_sum{{{labels}}} {1000 + 0.3 * below * i:.3f} {t}\n"
                        for i, t in enumerate(times)
                    )
                    # The requests counted, as the +Inf bucket (what coverage looks at).
                    out.writelines(
                        f"{name}_count{{{labels}}} {1000 + below * i} {t}\n"
                        for i, t in enumerate(times)
                    )
                    count += 2
        out.write("# EOF\n")
    return count


class Counting(httpx.AsyncHTTPTransport):
    """The real transport, asking each query for Prometheus's statistics and adding them up."""

    def __init__(self) -> None:
        super().__init__()
        self.samples = 0
        self.peak = 0
        self.queries = 0
        # The coverage subqueries' share (`timestamp(`), and the most one held at once.
        self.coverage = 0
        self.coverage_peak = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        form = {k: v[0] for k, v in parse_qs(request.content.decode()).items()}
        form["stats"] = "all"
        body = urlencode(form).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        asked = httpx.Request(request.method, request.url, headers=headers, content=body)
        answer = await super().handle_async_request(asked)
        content = await answer.aread()
        stats = (json.loads(content).get("data") or {}).get("stats") or {}
        loaded = int(stats.get("samples", {}).get("totalQueryableSamples", 0))
        peak = int(stats.get("samples", {}).get("peakSamples", 0))
        self.samples += loaded
        self.peak = max(self.peak, peak)
        self.queries += 1
        if "timestamp(" in form.get("query", ""):
            self.coverage += loaded
            self.coverage_peak = max(self.coverage_peak, peak)
        # The content is decoded: its encoding and length no longer apply.
        kept = {
            k: v
            for k, v in answer.headers.items()
            if k.lower() not in ("content-encoding", "content-length")
        }
        return httpx.Response(answer.status_code, headers=kept, content=content)


def _crs(routes: int) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "inference.modelsphere.dev/v1alpha1",
            "kind": "LLMSLORequirement",
            "metadata": {"name": f"r{r}", "namespace": "bench"},
            "spec": {
                "serviceId": f"r{r}",
                "model": f"m{r}",
                "priority": 0,
                "minimumDeployment": {"type": "replica", "value": 1},
                **OBJECTIVES,
            },
        }
        for r in range(routes)
    ]


def _attainment(url: str, at: int, crs: list[dict[str, Any]], transport: Counting) -> Attainment:
    kinds = build_kinds(Settings(slo_api_token="b" * 32))
    index = Service.index_for(kinds)
    for obj in crs:
        index.upsert("llmslorequirements", obj)
    return Attainment(
        index,
        {k.resource.plural: k.name for k in kinds},
        Metrics(),
        Client(url, 300, transport=transport),
        labels=parse_route_labels('model_name="{model}"'),
        refresh_seconds=60,
        series_limit=10,
        clock=lambda: float(at),
    )


async def _refresh(
    url: str, at: int, crs: list[dict[str, Any]]
) -> tuple[Counting, float, list[dict[str, Any]]]:
    """One refresh: its statistics, its seconds and every route's 28-day answer."""
    counting = Counting()
    attainment = _attainment(url, at, crs, counting)
    began = time.perf_counter()
    await attainment.refresh()
    seconds = time.perf_counter() - began
    assert attainment.reason is None, attainment.reason
    listing = [attainment.answer(f"r{r}", "llm", crs[r], "28d") for r in range(len(crs))]
    await attainment.stop()
    return counting, seconds, listing


def measure(routes: int, pods: int, span: int) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="slo-api-fleet-"))
    end = int(time.time()) // 3600 * 3600 - 3600
    crs = _crs(routes)
    try:
        raw = Prometheus(workdir / "raw")
        raw.workdir.mkdir(parents=True)
        source = workdir / "raw.om"
        log(f"{routes} routes x {pods} pods: writing {span // 60} min of 15 s samples")
        series = _write(source, routes, pods, end, span)
        log(f"{series:,} series: backfilling")
        _blocks(["openmetrics", str(source), str(raw.storage)], workdir)
        raw.start()
        try:
            without, without_seconds, listing = asyncio.run(_refresh(raw.url, end, crs))
            found, _, _ = rules.objectives(listing)
            document = rules.prometheus_rule(found, "slo-api", None)
            recording = {recorded_series.group(f"r{r}") for r in range(routes)}
            groups = [g for g in document["spec"]["groups"] if g["name"] in recording]
            (workdir / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
            log(f"backfilling {len(groups)} recording groups with promtool")
            _blocks(
                [
                    "rules",
                    f"--start={end - span}",
                    f"--end={end}",
                    f"--url={raw.url}",
                    f"--output-dir={workdir / 'recorded'}",
                    "rules.yaml",
                ],
                workdir,
            )
        finally:
            raw.stop()
        for block in (workdir / "recorded").iterdir():
            shutil.move(str(block), raw.storage / block.name)
        raw.start()
        try:
            with_rules, with_seconds, recorded = asyncio.run(_refresh(raw.url, end, crs))
        finally:
            raw.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    ratio = without.samples / max(with_rules.samples, 1)
    log(
        f"{routes} routes x {pods} pods: {without.samples:,} samples without the rules, "
        f"{with_rules.samples:,} with: {ratio:.1f}x"
    )
    return {
        "routes": routes,
        "pods": pods,
        "span_seconds": span,
        "scrape_seconds": SCRAPE,
        "series": series,
        "without": {
            "samples": without.samples,
            "peak": without.peak,
            "queries": without.queries,
            "seconds": without_seconds,
            "coverage_samples": without.coverage,
            "coverage_peak": without.coverage_peak,
        },
        "with": {
            "samples": with_rules.samples,
            "peak": with_rules.peak,
            "queries": with_rules.queries,
            "seconds": with_seconds,
            "coverage_samples": with_rules.coverage,
            "coverage_peak": with_rules.coverage_peak,
        },
        # Every route's good ratios over 28 days, the same read either way.
        "same_figures": all(
            math.isclose(x["goodRatio"], y["goodRatio"], rel_tol=1e-9)
            for a, b in zip(listing, recorded, strict=True)
            for x, y in zip(a["objectives"], b["objectives"], strict=True)
        ),
        "ratio": ratio,
        "goal": GOAL,
        "ran_at": time.strftime("%Y-%m-%d", time.gmtime()),
    }


def _blocks(arguments: list[str], cwd: Path) -> None:
    done = subprocess.run(
        [binary("promtool"), "tsdb", "create-blocks-from", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"promtool failed: {done.stderr[-2000:]}")
