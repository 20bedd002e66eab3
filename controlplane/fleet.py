"""A fleet of LLM CRs of one typical shape, numbered: what `make bench` fills a control plane
with, and what the index's memory test sizes one CR by, so that both measure the same CR."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]
NAMESPACE = "bench"


def route_name(i: int) -> str:
    # Zero-padded so that sorted route order is creation order: page N is predictable.
    return f"svc-{i:06d}"


def llm(i: int) -> Obj:
    name = route_name(i)
    return {
        "apiVersion": "inference.modelsphere.dev/v1alpha1",
        "kind": "LLMSLORequirement",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": name}},
        "spec": {
            "serviceId": name,
            "model": f"model-{i % 97}",
            "targetRef": {"kind": "Deployment", "name": name},
            "priority": i % 11,
            "minimumDeployment": {"type": "replica", "value": 1},
            "maximumDeployment": {"type": "replica", "value": 4 + i % 5},
            "ttft": {
                "default": {"metrics": [{"type": "p90", "threshold": 0.8}]},
                "ranges": [
                    {
                        "contextLengthRangeLow": 0,
                        "contextLengthRangeHigh": 4096,
                        "metrics": [{"type": "p90", "threshold": 0.5}],
                    }
                ],
            },
            "otps": {"default": {"metrics": [{"type": "avg", "threshold": 20}]}},
        },
    }
