"""The demo page, driven in Chromium against slo-api on the real control plane.

Each test edits a route of its own (the samples are applied once per session), checks what
the page shows and what the API server stored.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Dialog, Page, Request, expect

from controlplane.admin import Admin, Obj
from controlplane.cluster import Cluster
from controlplane.demo import start_service, stop_service, wait_ready
from controlplane.server import free_port
from tests.browser.conftest import POOL, SLO, Samples, Service
from tests.browser.ui import (
    enter_token,
    field,
    field_error,
    open_page,
    open_route,
    route_button,
    save,
    saved,
    screenshot,
    status,
    update_docs_screenshot,
)

pytestmark = pytest.mark.browser


def llm_spec(admin: Admin, samples: Samples, name: str) -> Obj:
    obj = admin.get(SLO, "LLMSLORequirement", samples.namespace(), samples.route(name))
    spec: Obj = obj["spec"]
    return spec


def job_spec(admin: Admin, samples: Samples, name: str) -> Obj:
    obj = admin.get(SLO, "JobSLORequirement", samples.namespace(), samples.route(name))
    spec: Obj = obj["spec"]
    return spec


def pool_spec(admin: Admin, samples: Samples, name: str) -> Obj:
    obj = admin.get(POOL, "ModelPool", samples.namespace(), samples.route(name))
    spec: Obj = obj["spec"]
    return spec


def test_llm_ttft_threshold_is_saved_and_shown_after_reload(
    page: Page, service: Service, samples: Samples, admin: Admin, screenshot_dir: Path
) -> None:
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    route = samples.route("chat-7b")
    open_page(page, service.page_url, service.token)
    open_route(page, route)
    # A pool member shows its pool, read-only.
    pool_info = page.get_by_role("region", name="Model pool (read-only)")
    expect(pool_info).to_contain_text(samples.route("gpu-slot-a"))
    expect(pool_info).to_contain_text("Ready")

    threshold = field(page, "ttft.default.metrics.0.threshold")
    expect(threshold).to_have_value("0.8")
    threshold.fill("0.65")
    save(page)
    saved(page)
    expect(status(page)).to_contain_text("ttft")

    spec = llm_spec(admin, samples, "chat-7b")
    assert spec["ttft"]["default"]["metrics"] == [{"type": "p90", "threshold": 0.65}]
    assert len(spec["ttft"]["ranges"]) == 2, "the whole section is sent: ranges are kept"
    assert spec["otps"]["default"]["metrics"] == [{"type": "avg", "threshold": 20}]
    assert spec["model"] == "chat-7b-instruct", "fields slo-api does not own are untouched"

    page.reload()  # the token stays in sessionStorage and the route in the URL fragment
    expect(field(page, "ttft.default.metrics.0.threshold")).to_have_value("0.65")
    expect(route_button(page, route)).to_have_attribute("aria-current", "true")
    # The picture shows the route's attainment too, once it is drawn.
    expect(page.locator("#attainment-body li.objective").first).to_be_visible()
    screenshot(page, screenshot_dir, "llm-route-edited")
    update_docs_screenshot(page)

    origin = service.url + "/"
    outside = [u for u in requests if not u.startswith(origin) and not u.startswith("data:")]
    assert not outside, f"the page made requests outside slo-api: {outside}"


def test_bad_values_show_the_api_error_beside_the_field(
    page: Page, service: Service, samples: Samples, admin: Admin, screenshot_dir: Path
) -> None:
    route = samples.route("code-13b")
    before = llm_spec(admin, samples, "code-13b")
    open_page(page, service.page_url, service.token)
    open_route(page, route)

    # A negative threshold: refused by slo-api's own validation.
    field(page, "ttft.default.metrics.0.threshold").fill("-1")
    save(page)
    expect(status(page)).to_contain_text("Not saved")
    # The status line names the field once, as `field: message`; beside it, only the message.
    expect(status(page)).to_contain_text("Not saved: ttft.default.metrics[0].threshold: ")
    expect(status(page)).not_to_contain_text("threshold: ttft")
    error = field_error(page, "ttft.default.metrics.0.threshold")
    expect(error).to_be_visible()
    expect(error).not_to_be_empty()
    expect(error).not_to_contain_text("ttft.default")
    expect(field(page, "ttft.default.metrics.0.threshold")).to_have_attribute(
        "aria-invalid", "true"
    )
    expect(field(page, "ttft.default.metrics.0.threshold")).to_be_focused()
    screenshot(page, screenshot_dir, "field-error")

    # Maximum below minimum: a cross-field rule only the API server checks (CEL in the CRD).
    field(page, "ttft.default.metrics.0.threshold").fill("1.2")
    field(page, "minimumDeployment.type").select_option("replica")
    field(page, "minimumDeployment.value").fill("5")
    field(page, "maximumDeployment.value").fill("3")
    save(page)
    expect(status(page)).to_contain_text("Not saved")
    max_error = field_error(page, "maximumDeployment.value")
    expect(max_error).to_contain_text("below")
    expect(max_error).not_to_contain_text("maximumDeployment.value:")
    expect(field_error(page, "ttft.default.metrics.0.threshold")).to_be_hidden()

    # An empty value never leaves the page.
    field(page, "priority").fill("")
    save(page)
    expect(field_error(page, "priority")).to_contain_text("number")

    assert llm_spec(admin, samples, "code-13b") == before


def test_sections_are_sent_whole_ranges_added_and_a_section_removed(
    page: Page, service: Service, samples: Samples, admin: Admin
) -> None:
    route = samples.route("code-13b")
    open_page(page, service.page_url, service.token)
    open_route(page, route)
    page.get_by_role("button", name="Add range").first.click()
    expect(field(page, "ttft.ranges.0.contextLengthRangeLow")).to_be_focused()
    field(page, "ttft.ranges.0.contextLengthRangeHigh").fill("2048")
    field(page, "ttft.ranges.0.metrics.0.type").select_option("p99")
    field(page, "ttft.ranges.0.metrics.0.threshold").fill("0.9")
    page.get_by_role("button", name="Remove OTPS targets").click()
    expect(page.get_by_role("button", name="Add OTPS targets")).to_be_focused()
    save(page)
    saved(page)
    spec = llm_spec(admin, samples, "code-13b")
    assert spec["ttft"] == {
        "default": {"metrics": [{"type": "p95", "threshold": 1.2}]},
        "ranges": [
            {
                "contextLengthRangeLow": 0,
                "contextLengthRangeHigh": 2048,
                "metrics": [{"type": "p99", "threshold": 0.9}],
            }
        ],
    }
    assert "otps" not in spec
    page.reload()
    expect(field(page, "ttft.ranges.0.contextLengthRangeHigh")).to_have_value("2048")
    expect(page.get_by_role("button", name="Add OTPS targets")).to_be_visible()


def test_job_queue_max_depth_is_saved_with_enter(
    page: Page, service: Service, samples: Samples, admin: Admin, screenshot_dir: Path
) -> None:
    route = samples.route("batch-render")
    promql = job_spec(admin, samples, "batch-render")["queue"]["promql"]
    open_page(page, service.page_url, service.token)
    # Keyboard only: the route list is made of buttons, the form submits on Enter.
    route_button(page, route).focus()
    page.keyboard.press("Enter")
    expect(page.locator("#route-form")).to_be_visible()
    expect(field(page, "queue.promql")).to_have_value(promql)
    max_depth = field(page, "queue.maxDepth")
    expect(max_depth).to_have_value("20")
    max_depth.fill("35")
    max_depth.press("Enter")
    saved(page)
    expect(max_depth).to_have_value("35")
    spec = job_spec(admin, samples, "batch-render")
    assert spec["queue"] == {"maxDepth": 35, "promql": promql}
    screenshot(page, screenshot_dir, "job-route-edited")

    # An empty query is refused beside the field, and nothing is stored.
    field(page, "queue.promql").fill("")
    save(page)
    expect(field_error(page, "queue.promql")).to_be_visible()
    assert job_spec(admin, samples, "batch-render")["queue"]["promql"] == promql


def test_pool_swap_budget_with_status(
    page: Page, service: Service, samples: Samples, admin: Admin, screenshot_dir: Path
) -> None:
    route = samples.route("gpu-slot-a")
    open_page(page, service.page_url, service.token)
    open_route(page, route)
    pool_status = page.locator("#pool-status")
    expect(pool_status).to_contain_text("Ready")
    expect(pool_status).to_contain_text(samples.route("chat-7b"))
    members = page.get_by_role("table", name="Members as observed")
    expect(members.locator("tbody tr")).to_have_count(2)
    expect(field(page, "pool.default")).to_have_value(samples.route("chat-7b"))

    # Not a duration: slo-api refuses it, beside the field.
    field(page, "pool.swapBudget").fill("soon")
    save(page)
    expect(field_error(page, "pool.swapBudget")).to_be_visible()

    field(page, "pool.swapBudget").fill("90s")
    field(page, "pool.default").select_option(samples.route("code-13b"))
    save(page)
    saved(page)
    expect(field_error(page, "pool.swapBudget")).to_be_hidden()
    spec = pool_spec(admin, samples, "gpu-slot-a")
    assert spec["swapBudget"] == "90s"
    assert spec["default"] == samples.route("code-13b")
    assert spec["reclaimAfter"] == "10m"
    screenshot(page, screenshot_dir, "pool-route-edited")

    # The installed CRD allows only `sticky`: the API server's reason lands beside the select.
    field(page, "pool.swapPolicy").select_option("reclaim")
    save(page)
    expect(field_error(page, "pool.swapPolicy")).to_be_visible()
    assert pool_spec(admin, samples, "gpu-slot-a")["swapPolicy"] == "sticky"


def test_reset_asks_first(page: Page, service: Service, samples: Samples, admin: Admin) -> None:
    route = samples.route("reason-70b")
    open_page(page, service.page_url, service.token)
    open_route(page, route)
    asked: list[str] = []

    def answer(accept: bool) -> None:
        def handle(dialog: Dialog) -> None:
            asked.append(dialog.message)
            if accept:
                dialog.accept()
            else:
                dialog.dismiss()

        page.once("dialog", handle)

    answer(accept=False)
    page.get_by_role("button", name="Reset to defaults…").click()
    for _ in range(50):
        if asked:
            break
        page.wait_for_timeout(100)
    assert asked, "Reset did not ask for confirmation"
    assert route in asked[0]
    expect(status(page)).not_to_contain_text("Reset")
    assert llm_spec(admin, samples, "reason-70b")["priority"] == 8

    answer(accept=True)
    page.get_by_role("button", name="Reset to defaults…").click()
    expect(status(page)).to_contain_text("Reset")
    expect(field(page, "priority")).to_have_value("0")
    expect(page.locator("#max-add")).to_be_visible()
    expect(page.locator("#f-ttft-add")).to_be_visible()
    spec = llm_spec(admin, samples, "reason-70b")
    assert spec["priority"] == 0
    assert spec["minimumDeployment"] == {"type": "replica", "value": 1}
    assert "maximumDeployment" not in spec
    assert "ttft" not in spec


def test_a_change_made_elsewhere_is_412_with_reload(
    page: Page, service: Service, samples: Samples, admin: Admin
) -> None:
    route = samples.route("embed-small")
    open_page(page, service.page_url, service.token)
    open_route(page, route)
    # Edited before the change elsewhere: the page follows changes live, so a form without
    # edits would simply show the new values.
    field(page, "priority").fill("6")
    admin.merge_patch(
        SLO, "LLMSLORequirement", samples.namespace(), route, {"spec": {"priority": 4}}
    )
    save(page)
    expect(status(page)).to_contain_text("changed elsewhere")
    page.get_by_role("button", name="Reload route").click()
    expect(field(page, "priority")).to_have_value("4")
    field(page, "priority").fill("6")
    page.get_by_label("High priority (10)").check()
    expect(field(page, "priority")).to_have_value("10")
    save(page)
    saved(page)
    assert llm_spec(admin, samples, "embed-small")["priority"] == 10


def test_list_filters_and_conflicts(page: Page, service: Service, samples: Samples) -> None:
    open_page(page, service.page_url, service.token)
    page.get_by_label("Search").fill(samples.prefix)
    buttons = page.locator("#route-list button")
    expect(buttons).to_have_count(8)
    page.get_by_label("Kind").select_option("job")
    expect(buttons).to_have_count(2)
    page.get_by_label("Kind").select_option("pool")
    expect(buttons).to_have_count(1)
    page.get_by_label("Kind").select_option("ambiguous")
    expect(buttons).to_have_count(1)
    conflict = route_button(page, samples.route("translate-3b"))
    expect(conflict).to_contain_text("Conflict")
    conflict.click()
    expect(status(page)).to_contain_text("more than one")
    expect(page.locator("#editor-body")).to_contain_text("2")
    expect(page.locator("#route-form")).to_have_count(0)


def test_token_is_asked_for_and_a_wrong_one_is_refused(page: Page, service: Service) -> None:
    page.goto(service.page_url)
    expect(status(page)).to_contain_text("Enter the API token")
    expect(page.get_by_label("API token")).to_be_focused()
    enter_token(page, "not-the-token")
    expect(status(page)).to_contain_text("not accepted")
    enter_token(page, service.token)
    expect(status(page)).to_contain_text("Loaded")


def test_works_behind_a_gateway_path_prefix(
    page: Page, gateway: str, service: Service, samples: Samples
) -> None:
    requests: list[Request] = []
    page.on("request", lambda r: requests.append(r))
    open_page(page, gateway, service.token)
    open_route(page, samples.route("nightly-eval"))
    expect(field(page, "queue.maxDepth")).to_have_value("5")
    base = gateway.rsplit("/", 1)[0] + "/"
    outside = [r.url for r in requests if not r.url.startswith(base) and r.url != "data:,"]
    assert not outside, f"requests that escaped the gateway prefix: {outside}"


def test_the_list_and_the_open_route_follow_changes_made_elsewhere(
    page: Page, service: Service, samples: Samples, admin: Admin
) -> None:
    # Not under the samples' prefix, which other tests count routes by.
    route = "live" + samples.prefix.rstrip("-")
    namespace = samples.namespace()
    open_page(page, service.page_url, service.token)
    expect(page.locator("#live")).to_have_text("live")
    page.evaluate("window.notReloaded = true")
    admin.create(
        {
            "apiVersion": SLO,
            "kind": "LLMSLORequirement",
            "metadata": {"name": route, "namespace": namespace},
            "spec": {"serviceId": route, "priority": 2},
        }
    )
    try:
        expect(route_button(page, route)).to_contain_text("priority 2")
        open_route(page, route)
        admin.merge_patch(SLO, "LLMSLORequirement", namespace, route, {"spec": {"priority": 3}})
        # A form without edits shows the new values; the list follows.
        expect(field(page, "priority")).to_have_value("3")
        expect(route_button(page, route)).to_contain_text("priority 3")
        expect(status(page)).to_contain_text("changed elsewhere")

        field(page, "priority").fill("8")
        admin.merge_patch(SLO, "LLMSLORequirement", namespace, route, {"spec": {"priority": 5}})
        # Unsaved edits are kept, and the page says the route changed underneath them.
        expect(status(page)).to_contain_text("Your edits are kept")
        expect(route_button(page, route)).to_contain_text("priority 5")
        expect(field(page, "priority")).to_have_value("8")
        page.get_by_role("button", name="Reload route").click()
        expect(field(page, "priority")).to_have_value("5")
    finally:
        admin.delete(SLO, "LLMSLORequirement", namespace, route)
    expect(route_button(page, route)).to_have_count(0)
    expect(status(page)).to_contain_text("deleted elsewhere")
    assert page.evaluate("window.notReloaded") is True


@pytest.fixture
def short_lived_streams(cluster: Cluster, samples: Samples, tmp_path: Path) -> Iterator[Service]:
    """slo-api whose change streams end every 2-4 s (WATCH_LIFETIME_SECONDS=2)."""
    assert cluster.credentials is not None
    port, token = free_port(), secrets.token_urlsafe(24)
    log_path = tmp_path / "slo-api.log"
    with log_path.open("wb") as log:
        process = start_service(
            cluster.credentials.slo_api_kubeconfig,
            port,
            token,
            stdout=log,
            extra_env={"WATCH_LIFETIME_SECONDS": "2"},
        )
    svc = Service(f"http://127.0.0.1:{port}", token, log_path, process)
    try:
        wait_ready(svc.url, process)
        yield svc
    finally:
        stop_service(process)


def test_the_live_view_resumes_by_itself_where_a_stream_that_reached_its_lifetime_ended(
    page: Page, short_lived_streams: Service, samples: Samples, admin: Admin
) -> None:
    service = short_lived_streams
    route = "lifetime" + samples.prefix.rstrip("-")
    namespace = samples.namespace()
    watches: list[str] = []
    page.on("request", lambda r: watches.append(r.url) if "watch=true" in r.url else None)
    open_page(page, service.page_url, service.token)
    expect(page.locator("#live")).to_have_text("live")
    page.evaluate("window.notReloaded = true")
    admin.create(
        {
            "apiVersion": SLO,
            "kind": "LLMSLORequirement",
            "metadata": {"name": route, "namespace": namespace},
            "spec": {"serviceId": route, "priority": 2},
        }
    )
    try:
        expect(route_button(page, route)).to_contain_text("priority 2")
        # Two streams end at their lifetime; each time the page comes back from its place.
        for _ in range(2):
            with page.expect_request(lambda r: "watch=true" in r.url, timeout=15_000):
                pass
        admin.merge_patch(SLO, "LLMSLORequirement", namespace, route, {"spec": {"priority": 3}})
        expect(route_button(page, route)).to_contain_text("priority 3")
    finally:
        admin.delete(SLO, "LLMSLORequirement", namespace, route)
    expect(route_button(page, route)).to_have_count(0)
    # Only the first stream took the whole state; every later one resumed from a place.
    assert "since=" not in watches[0]
    assert len(watches) >= 3
    assert all("since=" in url for url in watches[1:])
    assert page.evaluate("window.notReloaded") is True


def test_fields_a_gitops_tool_manages_are_shown_and_saved_only_when_forced(
    page: Page, service: Service, samples: Samples, admin: Admin
) -> None:
    route = samples.route("gitops-7b")
    admin.apply(
        {
            "apiVersion": SLO,
            "kind": "LLMSLORequirement",
            "metadata": {"name": route, "namespace": samples.namespace()},
            "spec": {"serviceId": route, "priority": 3},
        },
        field_manager="argocd-controller",
    )
    open_page(page, service.page_url, service.token)
    page.get_by_label("Search").fill(route)
    open_route(page, route)
    notice = page.locator("#managed-notice")
    expect(notice).to_contain_text("argocd-controller (priority)")
    expect(page.locator('[data-managed-note="priority"]')).to_have_text(
        "Managed by argocd-controller"
    )

    # A field the tool does not manage saves as usual.
    field(page, "minimumDeployment.value").fill("2")
    save(page)
    saved(page)

    # A managed one is not sent: the page says whose it is and offers force, with a warning.
    requests: list[Request] = []
    page.on("request", lambda r: requests.append(r) if r.method == "PUT" else None)
    field(page, "priority").fill("9")
    save(page)
    expect(status(page)).to_contain_text("managed by argocd-controller")
    expect(status(page)).to_contain_text("source the tool syncs from")
    assert requests == []
    assert llm_spec(admin, samples, "gitops-7b")["priority"] == 3

    asked: list[str] = []

    def accept(dialog: Dialog) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.once("dialog", accept)
    page.get_by_role("button", name="Save anyway…").click()
    expect(status(page)).to_contain_text("Forced")
    assert asked
    assert "revert" in asked[0]
    assert "argocd-controller" in asked[0]
    assert "force=true" in requests[-1].url
    assert llm_spec(admin, samples, "gitops-7b")["priority"] == 9
