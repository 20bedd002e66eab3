"""The demo page and the guardrails, in Chromium: inputs bounded by the route's limits with the
reason beside them, and a save beyond one refused beside the field."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Page, expect

from controlplane.admin import Admin, load_kustomization
from controlplane.cluster import CONFIG, Cluster
from controlplane.demo import ServiceError, start_service, stop_service, wait_ready
from controlplane.server import free_port
from tests.browser.conftest import SLO, Service
from tests.browser.ui import field, field_error, open_page, open_route, save, saved, status

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def limited(
    admin: Admin, cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Service, str]]:
    """config/guardrails installed, a namespace capped, and a slo-api of its own started after
    the SLOLimits CRD exists (the session's slo-api would find it only at its next recheck)."""
    objs = load_kustomization(CONFIG / "guardrails")
    crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
    admin.apply_all(crds)
    admin.wait_crds(crds)
    admin.apply_all(o for o in objs if o not in crds)
    namespace = f"ui{os.getpid() % 10000}-limits"
    admin.ensure_namespace(namespace)
    admin.apply(
        {
            "apiVersion": SLO,
            "kind": "SLOLimits",
            "metadata": {"name": "default", "namespace": namespace},
            "spec": {"maxPriority": 5, "maxReplicas": 8, "minTTFTSeconds": 0.2},
        }
    )
    assert cluster.credentials is not None
    port = free_port()
    token = secrets.token_urlsafe(24)
    log_path = tmp_path_factory.mktemp("slo-api-limits") / "slo-api.log"
    with log_path.open("wb") as log:
        process = start_service(cluster.credentials.slo_api_kubeconfig, port, token, stdout=log)
    svc = Service(f"http://127.0.0.1:{port}", token, log_path, process)
    try:
        try:
            wait_ready(svc.url, process)
        except ServiceError as exc:
            pytest.fail(f"{exc}\n{svc.log_tail()}", pytrace=False)
        yield svc, namespace
    finally:
        stop_service(process)
        for obj in reversed(objs):
            if obj["kind"] != "CustomResourceDefinition":
                admin.delete(obj["apiVersion"], obj["kind"], None, obj["metadata"]["name"])


def _until_shown(service: Service, route: str, key: str, within: float = 30) -> None:
    """Until slo-api's body of the route has `key` (its informers have the limits)."""
    deadline = time.monotonic() + within
    headers = {"Authorization": f"Bearer {service.token}"}
    with httpx.Client(timeout=5, headers=headers) as http:
        while key not in http.get(f"{service.url}/routes/{route}").json():
            assert time.monotonic() < deadline, f"{route} never showed {key}"
            time.sleep(0.1)


def test_inputs_are_bounded_by_the_limits_and_say_why(
    page: Page, admin: Admin, limited: tuple[Service, str]
) -> None:
    service, namespace = limited
    route = f"{namespace}-chat"
    # Stored before the cap: priority 7 is beyond maxPriority 5.
    admin.apply(
        {
            "apiVersion": SLO,
            "kind": "LLMSLORequirement",
            "metadata": {"name": "chat", "namespace": namespace},
            "spec": {
                "serviceId": route,
                "priority": 3,
                "maximumDeployment": {"type": "replica", "value": 4},
                "ttft": {"default": {"metrics": [{"type": "p90", "threshold": 0.5}]}},
            },
        }
    )
    _until_shown(service, route, "limits")
    open_page(page, service.page_url, service.token)
    page.get_by_label("Search").fill(route)
    open_route(page, route)

    expect(page.locator("#limits-notice")).to_contain_text("maxPriority 5")
    priority = field(page, "priority")
    expect(priority).to_have_attribute("max", "5")
    note = page.locator('[data-limit-note="maxPriority"]')
    expect(note).to_contain_text("At most 5")
    expect(note).to_contain_text("SLOLimits")
    # The note is the input's description, for a screen reader too.
    described = priority.get_attribute("aria-describedby") or ""
    assert "limit-maxPriority" in described.split()
    expect(field(page, "maximumDeployment.value")).to_have_attribute("max", "8")
    expect(field(page, "ttft.default.metrics.0.threshold")).to_have_attribute("min", "0.2")
    expect(page.locator('[data-limit-note="minTTFTSeconds"]')).to_contain_text("at least 0.2 s")

    # A save beyond a limit is refused before it is sent, with the reason beside the field.
    priority.fill("9")
    save(page)
    expect(field_error(page, "priority")).to_contain_text("At most 5")
    expect(status(page)).to_contain_text("maxPriority")
    spec = admin.get(SLO, "LLMSLORequirement", namespace, "chat")["spec"]
    assert spec["priority"] == 3

    # Within it, it saves.
    priority.fill("5")
    save(page)
    saved(page)
    assert admin.get(SLO, "LLMSLORequirement", namespace, "chat")["spec"]["priority"] == 5


def test_a_value_stored_beyond_its_limit_stays_within_the_inputs_bounds(
    page: Page, admin: Admin, limited: tuple[Service, str]
) -> None:
    service, namespace = limited
    route = f"{namespace}-legacy"
    # Stored within the cap, then the cap lowered below it (admission never rechecks).
    admin.apply(
        {
            "apiVersion": SLO,
            "kind": "LLMSLORequirement",
            "metadata": {"name": "legacy", "namespace": namespace},
            "spec": {"serviceId": route, "priority": 5},
        }
    )
    admin.merge_patch(SLO, "SLOLimits", namespace, "default", {"spec": {"maxPriority": 2}})
    try:
        _until_shown(service, route, "overLimits")
        open_page(page, service.page_url, service.token)
        page.get_by_label("Search").fill(route)
        open_route(page, route)
        expect(page.locator("#limits-notice")).to_contain_text("Stored beyond them: priority")
        # The stored 5 stays a valid value (it may stay or come down), not the cap's 2.
        expect(field(page, "priority")).to_have_attribute("max", "5")
        expect(page.locator('[data-limit-note="maxPriority"]')).to_contain_text(
            "may stay or move toward it"
        )
    finally:
        admin.merge_patch(SLO, "SLOLimits", namespace, "default", {"spec": {"maxPriority": 5}})


def test_a_grandfathered_threshold_may_move_toward_its_limit_but_not_spread(
    page: Page, admin: Admin, limited: tuple[Service, str]
) -> None:
    service, namespace = limited
    route = f"{namespace}-spread"
    ttft = {
        "default": {"metrics": [{"type": "p90", "threshold": 0.3}]},
        "ranges": [{"contextLengthRangeLow": 4096, "metrics": [{"type": "p90", "threshold": 0.5}]}],
    }
    admin.apply(
        {
            "apiVersion": SLO,
            "kind": "LLMSLORequirement",
            "metadata": {"name": "spread", "namespace": namespace},
            "spec": {"serviceId": route, "ttft": ttft},
        }
    )
    # The cap raised past the stored default p90 (admission never rechecks what is stored).
    admin.merge_patch(SLO, "SLOLimits", namespace, "default", {"spec": {"minTTFTSeconds": 0.4}})
    puts: list[str] = []
    page.on("request", lambda r: puts.append(r.url) if r.method == "PUT" else None)
    try:
        _until_shown(service, route, "overLimitBounds")
        open_page(page, service.page_url, service.token)
        page.get_by_label("Search").fill(route)
        open_route(page, route)
        held = field(page, "ttft.default.metrics.0.threshold")
        in_range = field(page, "ttft.ranges.0.metrics.0.threshold")
        # The stored 0.3 bounds only its own input; the range's p90 is held to the cap.
        expect(held).to_have_attribute("min", "0.3")
        expect(in_range).to_have_attribute("min", "0.4")
        note = page.locator('[data-limit-note="minTTFTSeconds"]')
        expect(note).to_contain_text("Other thresholds and new ranges are held to it")

        # Spread to another range: refused by the page, with the reason, nothing sent.
        in_range.fill("0.3")
        save(page)
        error = field_error(page, "ttft.ranges.0.metrics.0.threshold")
        expect(error).to_contain_text("at least 0.4 s")
        expect(error).to_contain_text("only for its own range and metric type")
        expect(status(page)).to_contain_text("Not saved")
        in_range.fill("0.5")

        # Spread to another metric of the same range: refused too.
        page.get_by_role("button", name="Add ttft default metric").click()
        added = field(page, "ttft.default.metrics.1.threshold")
        expect(added).to_have_attribute("min", "0.4")
        added.fill("0.3")
        save(page)
        expect(field_error(page, "ttft.default.metrics.1.threshold")).to_contain_text(
            "only for its own range and metric type"
        )
        expect(status(page)).to_contain_text("Not saved")
        assert puts == []
        assert admin.get(SLO, "LLMSLORequirement", namespace, "spread")["spec"]["ttft"] == ttft

        # Moving the grandfathered value toward the cap (and the new metric within it) saves.
        added.fill("0.45")
        held.fill("0.35")
        save(page)
        saved(page)
        stored = admin.get(SLO, "LLMSLORequirement", namespace, "spread")["spec"]["ttft"]
        assert stored["default"]["metrics"] == [
            {"type": "p90", "threshold": 0.35},
            {"type": added_type(page), "threshold": 0.45},
        ]
    finally:
        admin.merge_patch(SLO, "SLOLimits", namespace, "default", {"spec": {"minTTFTSeconds": 0.2}})


def added_type(page: Page) -> str:
    return field(page, "ttft.default.metrics.1.type").input_value()
