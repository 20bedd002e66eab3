"""What the robustness runner records of an API server object (the ground truth's shape)."""

from __future__ import annotations

from robustness.model import build
from robustness.recording import Meta, Recording, Truth
from robustness.run import trim


def test_the_truth_keeps_each_managers_spec_fields_and_drops_the_rest() -> None:
    obj = {
        "apiVersion": "inference.modelsphere.dev/v1alpha1",
        "kind": "LLMSLORequirement",
        "metadata": {
            "name": "chat",
            "namespace": "a",
            "uid": "u-1",
            "resourceVersion": "42",
            "annotations": {"argocd.argoproj.io/tracking-id": "x"},
            "generation": 3,
            "managedFields": [
                {
                    "manager": "argocd-controller",
                    "operation": "Apply",
                    "time": "2026-12-01T00:00:00Z",
                    "fieldsV1": {"f:spec": {"f:priority": {}, "f:serviceId": {}}},
                },
                {"manager": "ctl", "operation": "Update", "subresource": "status", "fieldsV1": {}},
            ],
        },
        "spec": {"serviceId": "chat", "priority": 3},
        "status": {"phase": "Ready"},
    }
    kept = trim(obj)
    assert kept["managers"] == [
        {
            "manager": "argocd-controller",
            "operation": "Apply",
            "time": "2026-12-01T00:00:00Z",
            "fields": ["priority", "serviceId"],
        }
    ]
    assert "status" not in kept
    assert "generation" not in kept["metadata"]
    recording = Recording(Meta(seed=1, command=[]))
    recording.add(Truth(1.0, "llmslorequirements", "ADDED", kept))
    [state] = build(recording).states["u-1"]
    assert (state.route, state.rv, state.owned) == ("chat", 42, {"priority": 3})
