"""The open route's history on the demo page: who changed it, and a restore confirmed first."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Dialog, Page, expect

from controlplane.admin import Admin
from tests.browser.conftest import SLO, Samples, Service
from tests.browser.ui import field, open_page, open_route, save, saved, status

pytestmark = pytest.mark.browser


def test_the_history_shows_who_changed_the_route_and_restores_an_entry(
    page: Page, service: Service, samples: Samples, admin: Admin
) -> None:
    route = samples.route("history-1b")
    ns = samples.namespace()
    admin.create(
        {
            "apiVersion": SLO,
            "kind": "LLMSLORequirement",
            "metadata": {"name": route, "namespace": ns},
            "spec": {"serviceId": route, "priority": 2},
        }
    )
    open_page(page, service.page_url, service.token)
    open_route(page, route)
    history = page.locator("#history-body")
    expect(history).to_contain_text("No recorded changes")

    field(page, "priority").fill("5")
    save(page)
    saved(page)
    entries = history.locator(".history-entry")
    expect(entries).to_have_count(1)
    expect(entries.first).to_contain_text("via slo-api")
    expect(entries.first).to_contain_text("priority: 2 → 5")

    # A change around slo-api, by another field manager: the page follows it, history too.
    admin.request(
        "PATCH",
        admin.path(SLO, "LLMSLORequirement", ns, route),
        {"spec": {"priority": 7}},
        "application/merge-patch+json",
        params={"fieldManager": "kubectl-edit"},
    )
    expect(field(page, "priority")).to_have_value("7")
    expect(entries).to_have_count(2)
    expect(entries.first).to_contain_text("kubectl-edit")
    expect(entries.first).to_contain_text("priority: 5 → 7")
    # Every entry shown: no "Showing the latest" line, and nothing in its place.
    expect(history).not_to_contain_text("Showing the latest")
    expect(history).not_to_contain_text("null")

    asked: list[str] = []

    def answer(accept: bool) -> None:
        def handle(dialog: Dialog) -> None:
            asked.append(dialog.message)
            if accept:
                dialog.accept()
            else:
                dialog.dismiss()

        page.once("dialog", handle)

    restore = entries.nth(1).get_by_role("button", name="Restore")
    answer(accept=False)
    restore.click()
    for _ in range(50):
        if asked:
            break
        page.wait_for_timeout(100)
    assert asked, "Restore did not ask for confirmation"
    assert route in asked[0]
    expect(field(page, "priority")).to_have_value("7")
    assert admin.get(SLO, "LLMSLORequirement", ns, route)["spec"]["priority"] == 7

    answer(accept=True)
    restore.click()
    expect(status(page)).to_contain_text("Restored")
    expect(field(page, "priority")).to_have_value("5")
    assert admin.get(SLO, "LLMSLORequirement", ns, route)["spec"]["priority"] == 5
    expect(entries).to_have_count(3)
    expect(entries.first).to_contain_text("priority: 7 → 5")


def test_an_entry_carried_over_from_a_config_map_says_it_was_migrated(
    page: Page, service: Service, samples: Samples, admin: Admin
) -> None:
    route = samples.route("history-migrated")
    ns = samples.namespace()
    admin.create(
        {
            "apiVersion": SLO,
            "kind": "LLMSLORequirement",
            "metadata": {"name": route, "namespace": ns},
            "spec": {"serviceId": route, "priority": 2},
        }
    )
    # The history as slo-api answers it after carrying an earlier version's ConfigMap over.
    carried = {
        "id": "7",
        "time": "2025-12-01T00:00:00Z",
        "actor": "bob",
        "via": "slo-api",
        "requestId": "r7",
        "clientRequestId": None,
        "changes": [{"field": "priority", "from": 1, "to": 2}],
        "after": {"route": route, "kind": "llm", "priority": 2},
        "migrated": True,
    }
    recorded = {**carried, "id": "9", "actor": "alice", "migrated": False}
    page.route(
        f"**/routes/{route}/history*",
        lambda r: r.fulfill(
            json={"items": [recorded, carried], "total": 2, "page": 1, "pageSize": 20}
        ),
    )
    open_page(page, service.page_url, service.token)
    open_route(page, route)
    entries = page.locator("#history-body .history-entry")
    expect(entries).to_have_count(2)
    expect(entries.nth(0).locator(".history-migrated")).to_have_count(0)
    expect(entries.nth(1).locator(".history-migrated")).to_have_text("migrated")
    expect(entries.nth(1).locator(".history-migrated")).to_have_attribute(
        "title", re.compile("editors could write")
    )
