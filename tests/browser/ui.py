"""Steps on the demo page, in the words a user would use."""

from __future__ import annotations

import os
from pathlib import Path

from playwright.sync_api import Locator, Page, expect

REPO = Path(__file__).resolve().parents[2]
# The screenshot in the docs is replaced only on request: SLO_API_UPDATE_SCREENSHOT=1.
DOCS_SCREENSHOT = REPO / "docs" / "demo-webui.png"


def enter_token(page: Page, token: str) -> None:
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Use token").click()


def open_page(page: Page, url: str, token: str) -> None:
    page.goto(url)
    enter_token(page, token)
    expect(status(page)).to_contain_text("Loaded")


def route_button(page: Page, route: str) -> Locator:
    return page.locator(f'#route-list button[data-route="{route}"]')


def open_route(page: Page, route: str) -> None:
    route_button(page, route).click()
    expect(page.locator("#editor-heading")).to_contain_text(route)
    expect(page.locator("#route-form")).to_be_visible()
    expect(status(page)).to_contain_text(f"Loaded {route}")


def status(page: Page) -> Locator:
    return page.locator("#status")


def field(page: Page, path: str) -> Locator:
    """The control of an API field, e.g. `ttft.default.metrics.0.threshold`."""
    return page.locator(f'#editor-body [data-field="{path}"]')


def field_error(page: Page, path: str) -> Locator:
    """The message shown beside that control."""
    control = field(page, path)
    slot = control.get_attribute("data-error-slot")
    assert slot, f"{path} has no error slot"
    return page.locator(f"#{slot}")


def save(page: Page) -> None:
    page.get_by_role("button", name="Save").click()


def saved(page: Page) -> None:
    expect(status(page)).to_contain_text("Saved")


def screenshot(page: Page, directory: Path, name: str) -> Path:
    path = directory / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def update_docs_screenshot(page: Page, path: Path = DOCS_SCREENSHOT) -> None:
    """Replaces docs/demo-webui.png (or another picture in docs/), only when
    SLO_API_UPDATE_SCREENSHOT=1."""
    if updating_docs_screenshot():
        path.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(path), full_page=True)


def attainment(page: Page) -> Locator:
    """The open route's attainment section."""
    return page.get_by_role("region", name="Attainment")


def objective(page: Page, metric: str, kind: str) -> Locator:
    """One objective of the open route: its target, figures, status and chart."""
    return attainment(page).locator(f'li.objective[data-metric="{metric}"][data-type="{kind}"]')


def updating_docs_screenshot() -> bool:
    return os.environ.get("SLO_API_UPDATE_SCREENSHOT") == "1"
