"""Builders of the three kinds of CR, as a deployer would create them."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]
SLO = "inference.modelsphere.dev/v1alpha1"
POOL = "inference.llmkube.dev/v1alpha1"


def llm(namespace: str, name: str, service_id: str | None = None, **spec: Any) -> Obj:
    return {
        "apiVersion": SLO,
        "kind": "LLMSLORequirement",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"serviceId": service_id if service_id is not None else name, **spec},
    }


def job(namespace: str, name: str, service_id: str | None = None, **spec: Any) -> Obj:
    spec.setdefault("queue", {"maxDepth": 20, "promql": f'sum(jobs_pending{{service="{name}"}})'})
    return {
        "apiVersion": SLO,
        "kind": "JobSLORequirement",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"serviceId": service_id if service_id is not None else name, **spec},
    }


def pool(namespace: str, name: str, members: list[str], **spec: Any) -> Obj:
    return {
        "apiVersion": POOL,
        "kind": "ModelPool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"members": [{"inferenceServiceRef": {"name": m}} for m in members], **spec},
    }
