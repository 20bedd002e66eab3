"""/docs in Chromium: Swagger UI renders from slo-api's own assets, nothing from elsewhere."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import Service

pytestmark = pytest.mark.browser


def test_docs_render_the_operations_from_same_origin_assets_only(
    page: Page, service: Service
) -> None:
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(f"{service.url}/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("slo-api")
    expect(page.locator("#operations-routes-getRoute")).to_be_visible()
    origin = urlsplit(service.url).netloc
    others = [u for u in requests if not u.startswith("data:") and urlsplit(u).netloc != origin]
    assert not others, others
    assert any(u.endswith("/docs/swagger-ui-bundle.js") for u in requests), requests
