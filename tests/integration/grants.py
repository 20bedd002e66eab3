"""What slo-api's own identity may do to a CR: exactly get, list, watch and patch."""

from __future__ import annotations

import pytest

from controlplane.admin import Admin, AdminError


def assert_exactly_slo_api_verbs(
    sa: Admin, api: str, kind: str, namespace: str, name: str, *, listed_in: str | None = None
) -> None:
    """`sa` may get, list, watch (cluster-wide, or in `listed_in`) and patch the CR, and is
    refused (403) creating or deleting one."""
    assert sa.get(api, kind, namespace, name)["metadata"]["name"] == name
    assert any(o["metadata"]["name"] == name for o in sa.list(api, kind, listed_in))
    watched = sa.request(
        "GET", sa.path(api, kind, listed_in), params={"watch": "1", "timeoutSeconds": "1"}
    )
    assert watched is not None
    sa.merge_patch(api, kind, namespace, name, {"metadata": {"labels": {"seen": "yes"}}})
    new = {"apiVersion": api, "kind": kind, "metadata": {"name": "new", "namespace": namespace}}
    with pytest.raises(AdminError) as created:
        sa.create({**new, "spec": {}})
    assert created.value.status == 403
    with pytest.raises(AdminError) as deleted:
        sa.delete(api, kind, namespace, name)
    assert deleted.value.status == 403
