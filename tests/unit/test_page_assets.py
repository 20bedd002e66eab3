"""The demo page's ES modules: every one the page imports is served, as JavaScript."""

from __future__ import annotations

import re

from tests.unit.conftest import Started

IMPORT = re.compile(r'^import [^;]+ from "\./([\w-]+\.js)";$', re.MULTILINE)


async def test_every_module_the_page_imports_is_served_as_javascript(start: Started) -> None:
    async with start() as (client, _):
        page = (await client.get("/demo-webui")).text
        assert '<script type="module" src="demo-webui/app.js"></script>' in page
        pending, seen = ["app.js"], set()
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            response = await client.get(f"/demo-webui/{name}")
            assert response.status_code == 200, name
            assert response.headers["content-type"].startswith("text/javascript"), name
            pending += IMPORT.findall(response.text)
        assert {"live.js", "editor.js", "list.js"} <= seen
