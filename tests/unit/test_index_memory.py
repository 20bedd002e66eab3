"""What the index costs per CR: every replica holds every CR, so this decides how many routes a
pod of a given size can serve (docs/operating.md's sizing table comes from `make bench`)."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

from bench.populate import llm
from slo_api.index import ENTRY_OVERHEAD
from slo_api.kinds import build_kinds
from slo_api.service import Service
from slo_api.settings import Settings

CRS = 5000
# The goal per CR: 20 MiB per 10,000 CRs of resident memory, measured by `make bench`. The live
# objects of the index must stay well inside it.
GOAL_BYTES_PER_CR = 20 * 2**20 / 10_000


def served(i: int) -> dict[str, Any]:
    """An LLM CR as the API server returns it: metadata filled in, managedFields included."""
    obj = llm(i)
    obj["metadata"] |= {
        "uid": f"{i:08d}-0000-4000-8000-{i:012d}",
        "resourceVersion": str(100_000 + i),
        "generation": 1,
        "creationTimestamp": "2026-12-01T00:00:00Z",
        "managedFields": [{"manager": "deployer", "operation": "Update", "fieldsV1": {}}],
    }
    return obj


def test_an_indexed_cr_costs_a_fraction_of_the_goal() -> None:
    kinds = build_kinds(Settings(slo_api_token="unit-write-token"))
    index = Service.index_for(kinds)
    objs = [served(i) for i in range(CRS)]
    gc.collect()
    tracemalloc.start()
    try:
        index.replace("llmslorequirements", objs)
        del objs
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    per_cr = held / CRS
    assert per_cr < GOAL_BYTES_PER_CR * 0.75, per_cr
    # The size metric's estimate is within a quarter of what is really held.
    estimate = index.estimated_bytes() / CRS
    assert abs(estimate - per_cr) < per_cr / 4, (estimate, per_cr, ENTRY_OVERHEAD)


def test_reads_decode_what_was_stored() -> None:
    kinds = build_kinds(Settings(slo_api_token="unit-write-token"))
    index = Service.index_for(kinds)
    obj = served(7)
    index.upsert("llmslorequirements", obj)
    stored = index.get("llmslorequirements", "bench", obj["metadata"]["name"])
    assert stored is not None
    assert "managedFields" not in stored["metadata"]
    assert stored["spec"] == obj["spec"]
    # Each read is a fresh object: a caller changing it cannot change the index.
    stored["spec"]["priority"] = 99
    again = index.get("llmslorequirements", "bench", obj["metadata"]["name"])
    assert again is not None
    assert again["spec"]["priority"] == obj["spec"]["priority"]


def test_cached_renders_are_counted_in_the_estimate() -> None:
    kinds = build_kinds(Settings(slo_api_token="unit-write-token"))
    index = Service.index_for(kinds)
    service = Service(None, kinds, index)  # type: ignore[arg-type]  # no API server needed
    index.replace("llmslorequirements", [served(i) for i in range(CRS)])
    before = index.estimated_bytes()
    gc.collect()
    tracemalloc.start()
    try:
        for route in index.routes():
            service.line("summary", route)
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    grown = index.estimated_bytes() - before
    # About 80% of the encoded bytes for small CRs: the sizing formula rests on this metric.
    assert abs(grown - held) < held / 4, (grown, held)
    # Dropped renders stop counting.
    index.replace("llmslorequirements", [])
    assert index.estimated_bytes() == 0


def applied_by_argo(i: int) -> dict[str, Any]:
    """An LLM CR that Argo CD applied server-side: tracking annotation, every spec field owned."""
    obj = served(i)
    fields: dict[str, Any] = {f"f:{k}": {".": {}, "f:value": {}} for k in obj["spec"]}
    obj["metadata"]["annotations"] = {
        "argocd.argoproj.io/tracking-id": f"chat:inference.modelsphere.dev/LLMSLORequirement:b/{i}"
    }
    obj["metadata"]["managedFields"] = [
        {
            "manager": "argocd-controller",
            "operation": "Apply",
            "apiVersion": "inference.modelsphere.dev/v1alpha1",
            "time": "2026-12-01T00:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": {}}, "f:spec": fields},
        },
        {"manager": "scaler", "operation": "Update", "subresource": "status", "fieldsV1": {}},
    ]
    return obj


def test_gitops_ownership_stays_within_the_goal() -> None:
    kinds = build_kinds(Settings(slo_api_token="unit-write-token"))
    index = Service.index_for(kinds)
    objs = [applied_by_argo(i) for i in range(CRS)]
    gc.collect()
    tracemalloc.start()
    try:
        index.replace("llmslorequirements", objs)
        del objs
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    per_cr = held / CRS
    assert per_cr < GOAL_BYTES_PER_CR * 0.75, per_cr
    stored = index.get("llmslorequirements", "bench", applied_by_argo(1)["metadata"]["name"])
    assert stored is not None
    assert [e["manager"] for e in stored["metadata"]["managedFields"]] == ["argocd-controller"]
