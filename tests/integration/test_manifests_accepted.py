"""The API server accepts config/ as it is: a server-side dry run of every manifest, which also
refuses unknown fields. What the manifests must hold is checked as files in
tests/unit/test_manifests.py, which loads the objects sent here."""

from __future__ import annotations

import copy
import shutil

import pytest

from controlplane.admin import Admin, Obj
from tests.unit import test_manifests as manifests

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "obj", [obj for _, obj in manifests.OBJECTS], ids=[label for label, _ in manifests.OBJECTS]
)
def test_every_object_is_accepted_by_the_api_server(
    admin: Admin, request: pytest.FixtureRequest, obj: Obj
) -> None:
    sent = copy.deepcopy(obj)
    meta = sent.setdefault("metadata", {})
    if "/namespaces/" in admin.path(sent["apiVersion"], sent["kind"], "probe"):
        if "namespace" not in meta:
            # A sample without a namespace goes to the current one, as `kubectl apply` would.
            meta["namespace"] = request.getfixturevalue("namespace")
        elif meta["namespace"] != manifests.NAMESPACE:
            # Samples may name the deployer's namespace; llm-scaler itself must come from rbac.
            admin.ensure_namespace(meta["namespace"])
    result = admin.apply(sent, dry_run=True)
    assert result["kind"] == sent["kind"]
    assert result["metadata"]["name"] == meta["name"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_everything_the_namespaced_overlay_renders_is_accepted_by_the_api_server(
    admin: Admin,
) -> None:
    for obj in manifests._rendered(manifests.NAMESPACED):
        namespace = obj["metadata"].get("namespace")
        if namespace and namespace != manifests.NAMESPACE:  # llm-scaler exists: the harness made it
            admin.ensure_namespace(namespace)
        result = admin.apply(copy.deepcopy(obj), dry_run=True)
        assert result["metadata"]["name"] == obj["metadata"]["name"]
