"""The page's attainment, in Chromium, against slo-api reading the demo's Prometheus: a month of
backfilled history and the load simulator (chat-7b meets its SLO, code-13b is at risk,
reason-70b is violated)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, Request, expect

from tests.browser.conftest import Samples, Service
from tests.browser.ui import (
    REPO,
    attainment,
    objective,
    open_page,
    open_route,
    route_button,
    screenshot,
    update_docs_screenshot,
)

pytestmark = pytest.mark.browser

ATTAINMENT_SCREENSHOT = REPO / "docs" / "attainment.png"


def test_an_open_route_charts_each_objective_against_its_target(
    page: Page, service: Service, samples: Samples, screenshot_dir: Path
) -> None:
    route = samples.route("code-13b")
    open_page(page, service.page_url, service.token)
    open_route(page, route)

    ttft = objective(page, "ttft", "p95")
    expect(ttft).to_contain_text("TTFT p95 ≤ 1.2 s")
    # A good month, a fast burn now: budget left, and at risk.
    expect(ttft.locator(".status-badge")).to_have_text("At risk")
    expect(ttft).to_contain_text(re.compile(r"\d+\.\d% of budget left"))
    # Burning that fast, the budget left runs out: when, at the hour's burn rate, is said.
    expect(ttft.locator(".objective-note").last).to_have_text(
        re.compile(r"^At the 1h burn rate the budget runs out at \d{4}-\d\d-\d\dT[\d:]{8}Z;")
    )
    chart = ttft.get_by_role("img", name=f"{route}: TTFT p95 observed over 28d")
    expect(chart).to_be_visible()
    # The chart is the page's own SVG: the target line and the observed series drawn.
    expect(chart.locator("line.chart-target")).to_have_count(1)
    expect(chart.locator("path.chart-observed")).to_have_attribute("d", re.compile(r"^M[\d.]+ "))
    expect(chart.locator("desc")).to_contain_text("target p95 ≤ 1.2 s")
    # The figures' time is said, and the chart's axis ends at it (not at the browser's now).
    as_of = attainment(page).locator(".attainment-as-of")
    expect(as_of).to_have_text(re.compile(r"^Figures as of \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\.$"))
    time_of_day = (as_of.text_content() or "")[25:30]
    expect(chart.locator("text.chart-as-of")).to_have_text(f"as of {time_of_day} UTC")
    # Its OTPS slows down with it: more than half the requests below 30 tok/s now pages a p50.
    expect(objective(page, "otps", "p50").locator(".status-badge")).to_have_text("At risk")
    expect(objective(page, "otps", "p99")).to_contain_text("p99 ≥ 12 tok/s")
    # Nothing but what the answer holds: no placeholder for a part it lacks.
    expect(attainment(page)).not_to_contain_text("null")

    # Over the last hour alone the objective is not met.
    attainment(page).get_by_label("Window").select_option("1h")
    expect(ttft.locator(".status-badge")).to_have_text("Violated")
    expect(ttft).to_contain_text("budget overspent by")
    expect(ttft.get_by_role("img", name=f"{route}: TTFT p95 observed over 1h")).to_be_visible()
    screenshot(page, screenshot_dir, "attainment-at-risk")


def test_a_violated_route_and_one_meeting_its_slo_say_so_and_list_what_is_unmeasured(
    page: Page, service: Service, samples: Samples
) -> None:
    open_page(page, service.page_url, service.token)
    open_route(page, samples.route("reason-70b"))
    ttft = objective(page, "ttft", "p90")
    expect(ttft.locator(".status-badge")).to_have_text("Violated")
    expect(ttft).to_contain_text("budget overspent by")
    # 2 s lies between vLLM's 1 and 2.5 bounds: the figure is an estimate, and says so.
    expect(ttft).to_contain_text("Observed ≈")

    open_route(page, samples.route("chat-7b"))
    chat = objective(page, "ttft", "p90")
    expect(chat.locator(".status-badge")).to_have_text("Met")
    expect(objective(page, "otps", "avg")).to_contain_text("no error budget")
    # Per-range targets cannot be measured from vLLM's metrics: listed, with no number.
    expect(attainment(page).locator(".unmeasured")).to_contain_text("context 0\u20134096")

    open_route(page, samples.route("nightly-eval"))
    queue = objective(page, "queue", "maxDepth")
    expect(queue).to_contain_text("depth ≤ 5")
    expect(queue.locator(".status-badge")).to_have_text("Violated")


def test_the_list_sorts_by_the_budget_left(
    page: Page, service: Service, samples: Samples, screenshot_dir: Path
) -> None:
    asked: list[str] = []

    def note(request: Request) -> None:
        if "view=attainment" in request.url:
            asked.append(request.url)

    page.on("request", note)
    open_page(page, service.page_url, service.token)
    page.get_by_label("Sort").select_option("budget")
    names = [samples.route(n) for n in ("reason-70b", "code-13b", "chat-7b")]
    expect(route_button(page, names[0])).to_contain_text("Violated")
    order = page.locator("#route-list button.route-button").evaluate_all(
        "(buttons) => buttons.map((b) => b.dataset.route)"
    )
    # Overspent first, then the least budget left; routes without a budget after them.
    assert [r for r in order if r in names] == names
    assert order.index(names[2]) < order.index(samples.route("gpu-slot-a"))
    assert any("sort=budget" in url for url in asked)
    expect(route_button(page, names[1])).to_contain_text("budget left")

    open_route(page, names[1])
    expect(objective(page, "ttft", "p95").get_by_role("img")).to_be_visible()
    screenshot(page, screenshot_dir, "attainment-by-budget")
    update_docs_screenshot(page, ATTAINMENT_SCREENSHOT)
