"""The recorded series `sloctl rules` makes give slo-api the figures the raw series give, on
Debian's real Prometheus: two days of vLLM-shaped histograms from several pods per model are
backfilled, slo-api's attainment is read over every window, the rules sloctl builds from that
answer are backfilled over the same data with `promtool tsdb create-blocks-from rules`, and
the same attainment read again from the recorded series (no raw bucket series queried) must
match, objective by objective."""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from controlplane.prometheus import Prometheus, binary
from slo_api.attainment.cache import SECONDS, Attainment
from slo_api.attainment.prometheus import Prometheus as Client
from slo_api.attainment.selectors import ANNOTATION, parse_route_labels
from slo_api.cli import rules
from slo_api.kinds import build_kinds
from slo_api.metrics import Metrics
from slo_api.service import Service
from slo_api.settings import Settings
from tests.integration.attainment_data import TPOT, TPOT_BOUNDS, TTFT, TTFT_BOUNDS
from tests.integration.prometheus_stats import Recording

pytestmark = pytest.mark.integration

DAY = 86400
SPAN = 2 * DAY
STEP = 60
RECENT = 3 * 3600
# Prometheus (and promtool) evaluate a group at an offset of its own within each interval: a
# recorded window ends up to one step before the query's time. Windows within the last 3 hours
# hold one traffic throughout, so both read the same; the longer ones differ by at most the
# requests of a step at each end.
RULE_STEP = 300
BASE = 1_000_000
LABELS = parse_route_labels('model_name="{model}"')
TOKEN = "t" * 32
# Requests per minute by bucket bound, per pod, by the sample's age: older than 30 hours, the
# 27 hours before the last 3, the last 3. Each pod of a model a little different.
SHAPES = {
    TTFT: (
        {0.1: 20, 0.25: 40, 0.5: 35, 1: 4, 2.5: 1},
        {0.25: 30, 0.5: 50, 1: 15},
        {0.25: 10, 1: 40, 5: 9},
    ),
    TPOT: ({0.025: 50, 0.05: 45, 0.1: 5}, {0.05: 60, 0.1: 40}, {0.1: 70, 0.2: 30}),
}
PODS = {"chat-7b": 3, "code-13b": 2}
OBJECTIVES: dict[str, Any] = {
    # 0.3 s lies between the 0.25 and 0.5 bounds: interpolated.
    "ttft": {
        "default": {"metrics": [{"type": "p90", "threshold": 0.3}, {"type": "avg", "threshold": 1}]}
    },
    "otps": {"default": {"metrics": [{"type": "p50", "threshold": 12}]}},
}


def _generate(end: int) -> str:
    lines = []
    for name, bounds in ((TTFT, TTFT_BOUNDS), (TPOT, TPOT_BOUNDS)):
        lines.append(f"# TYPE {name} histogram\n")
        old, day, hour = SHAPES[name]
        for model, pods in PODS.items():
            for pod in range(pods):
                counts = dict.fromkeys(bounds, float(BASE))
                total = 1000.0
                rows: dict[str, list[str]] = {}
                for t in range(end - SPAN, end + 1, STEP):
                    age = end - t
                    phase = hour if age <= RECENT else day if age <= 30 * 3600 else old
                    below = 0
                    for bound in bounds:
                        below += phase.get(bound, 0) * (pod + 1)
                        counts[bound] += below
                        le = "+Inf" if math.isinf(bound) else f"{bound:g}"
                        rows.setdefault(le, []).append(f"{counts[bound]:.12g} {t}")
                    total += sum(n * (pod + 1) * b * 0.7 for b, n in phase.items())
                    rows.setdefault("sum", []).append(f"{total:.12g} {t}")
                    rows.setdefault("count", []).append(f"{counts[math.inf]:.12g} {t}")
                labels = f'model_name="{model}",pod="{pod}"'
                for le, values in rows.items():
                    series = (
                        f"{name}_{le}{{{labels}}}"
                        if le in ("sum", "count")
                        else f'{name}_bucket{{{labels},le="{le}"}}'
                    )
                    lines.extend(f"{series} {v}\n" for v in values)
    return "".join(lines) + "# EOF\n"


def _crs() -> list[dict[str, Any]]:
    def cr(name: str, model: str) -> dict[str, Any]:
        return {
            "apiVersion": "inference.modelsphere.dev/v1alpha1",
            "kind": "LLMSLORequirement",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {
                "serviceId": name,
                "model": model,
                "priority": 0,
                "minimumDeployment": {"type": "replica", "value": 1},
                **OBJECTIVES,
            },
        }

    own = cr("chat-pod0", "chat-7b")
    own["metadata"]["annotations"] = {ANNOTATION: '{model_name="chat-7b", pod="0"}'}
    return [cr("chat", "chat-7b"), cr("code", "code-13b"), own]


def _attainment(
    url: str, at: int, transport: httpx.AsyncBaseTransport, max_samples: int = 50_000_000
) -> Attainment:
    kinds = build_kinds(Settings(slo_api_token=TOKEN))
    index = Service.index_for(kinds)
    for obj in _crs():
        index.upsert("llmslorequirements", obj)
    return Attainment(
        index,
        {k.resource.plural: k.name for k in kinds},
        Metrics(),
        Client(url, 30, transport=transport),
        labels=LABELS,
        refresh_seconds=60,
        series_limit=10,
        max_samples=max_samples,
        clock=lambda: float(at),
    )


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str, Prometheus]]:
    # On the 5-minute grid the rules are evaluated on, so each window holds whole steps.
    end = int(time.time()) // 3600 * 3600 - 3600
    text = _generate(end)
    prometheus = Prometheus(tmp_path_factory.mktemp("raw"))
    prometheus.backfill(text)
    prometheus.start()
    yield end, text, prometheus
    prometheus.stop()


def _figures(answer: dict[str, Any]) -> list[dict[str, Any]]:
    keep = ("metric", "type", "threshold", "objective", "observed", "goodRatio", "budgetRemaining")
    return [
        {**{k: o[k] for k in keep}, **{f"burn{w}": r for w, r in (o["burnRates"] or {}).items()}}
        for o in answer["objectives"]
    ]


async def test_recorded_series_give_the_raw_figures(
    raw: tuple[int, str, Prometheus], tmp_path: Path
) -> None:
    end, text, source = raw
    routes = [(obj["metadata"]["name"], obj) for obj in _crs()]
    plain = Recording()
    before = _attainment(source.url, end, plain)
    await before.refresh()
    windows = ("1h", "1d", "7d", "28d")
    expected = {
        (route, w): before.answer(route, "llm", obj, w) for route, obj in routes for w in windows
    }
    for answer in expected.values():
        assert answer["source"]["status"] == "ok", answer["source"]
        assert all(o["goodRatio"] is not None for o in answer["objectives"] if o["type"] != "avg")
    # The raw path was taken: bucket series queried, as many as there are.
    assert any("increase(vllm:time_to_first_token_seconds_bucket" in q for q in plain.queries)
    await before.stop()

    # sloctl's rules, from the server's own answer, backfilled over the same data.
    found, skipped, _ = rules.objectives(expected[(r, "28d")] for r, _ in routes)
    assert all("an average has no error budget" in s for s in skipped), skipped
    document = rules.prometheus_rule(found, "slo-api", None)
    recording = [g for g in document["spec"]["groups"] if g["name"].endswith(".increase5m")]
    assert len(recording) == len(routes)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": recording}))
    blocks = tmp_path / "blocks"
    done = subprocess.run(
        [
            binary("promtool"),
            "tsdb",
            "create-blocks-from",
            "rules",
            f"--start={end - SPAN}",
            f"--end={end}",
            f"--url={source.url}",
            f"--output-dir={blocks}",
            "rules.yaml",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    both = Prometheus(tmp_path / "both")
    both.backfill(text)
    for block in blocks.iterdir():
        shutil.move(str(block), both.storage / block.name)
    both.start()
    try:
        sent = Recording()
        after = _attainment(both.url, end, sent)
        await after.refresh()
        for (route, w), was in expected.items():
            obj = dict(routes)[route]
            now = after.answer(route, "llm", obj, w)
            assert now["source"]["status"] == "ok"
            assert now["narrowed"] == []
            for got, want in zip(_figures(now), _figures(was), strict=True):
                assert got.keys() == want.keys()
                for key, value in want.items():
                    if not isinstance(value, float):
                        assert got[key] == value, (route, w, key)
                        continue
                    seconds = SECONDS[key[4:] if key.startswith("burn") else w]
                    if seconds <= RECENT - RULE_STEP:
                        assert got[key] == pytest.approx(value, rel=1e-9), (route, w, key)
                    else:
                        # A step's requests at each end, of the window's (or the data's) span.
                        share = 2 * RULE_STEP / min(seconds, SPAN)
                        scale = 1 / (1 - got["objective"]) if got["objective"] else 1.0
                        allowed = share * max(abs(value), scale, 1.0)
                        assert abs(got[key] - value) <= allowed, (route, w, key, got[key], value)
        # Read from the recorded series alone: no raw bucket series was queried, and the
        # coverage is of the recorded series (backfilled over the whole span), not the raw.
        assert not [q for q in sent.queries if "increase(vllm:" in q]
        assert not [q for q in sent.queries if "timestamp(vllm:" in q]
        for route, obj in routes:
            for objective in after.answer(route, "llm", obj, "1d")["objectives"]:
                assert objective["coverage"]["fraction"] == pytest.approx(1.0, abs=2 / 1000)
        await after.stop()
    finally:
        both.stop()


async def test_no_raw_query_loads_more_than_max_samples_and_the_answer_says_it_narrowed(
    raw: tuple[int, str, Prometheus],
) -> None:
    end, _, source = raw
    limit = 100_000
    sent = Recording()
    attainment = _attainment(source.url, end, sent, max_samples=limit)
    await attainment.refresh()
    chat = dict((obj["metadata"]["name"], obj) for obj in _crs())["chat"]
    try:
        answer = attainment.answer("chat", "llm", chat, "28d")
        assert answer["source"]["status"] == "ok"
        narrowed = {n["metric"]: n for n in answer["narrowed"]}
        assert set(narrowed) == {"ttft", "otps"}
        assert narrowed["ttft"]["to"] is not None
        assert f"ATTAINMENT_MAX_SAMPLES ({limit})" in narrowed["ttft"]["reason"]
        # Figures over what was read, not none.
        assert answer["objectives"][0]["goodRatio"] is not None
        # Prometheus's own count: no query, coverage included, loaded more than the limit,
        # and the windows that fit were not narrowed.
        raw_queries = {q: n for q, n in sent.loaded.items() if "increase(vllm:" in q}
        assert raw_queries
        assert max(sent.loaded.values()) <= limit, sent.loaded
        assert attainment.answer("chat", "llm", chat, "1h")["narrowed"] == []
    finally:
        await attainment.stop()
