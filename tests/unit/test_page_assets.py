"""The demo page's ES modules: every one the page imports is served, as JavaScript, and they
import each other without a cycle (so each can be loaded, and read, on its own)."""

from __future__ import annotations

import pytest

from slo_api.api.health import MODULES
from tests.unit.conftest import Started
from tests.unit.js_imports import ScanError, find_cycle, specifiers


async def served_graph(start: Started) -> dict[str, list[str]]:
    """The page's module graph as a browser walks it: from the page's script, over HTTP."""
    graph: dict[str, list[str]] = {}
    async with start() as (client, _):
        page = (await client.get("/demo-webui")).text
        assert '<script type="module" src="demo-webui/app.js"></script>' in page
        pending = ["app.js"]
        while pending:
            name = pending.pop()
            if name in graph:
                continue
            response = await client.get(f"/demo-webui/{name}")
            assert response.status_code == 200, name
            assert response.headers["content-type"].startswith("text/javascript"), name
            deps = specifiers(response.text)
            # Relative only: the page makes no request beyond the service that serves it.
            assert all(spec.startswith("./") for spec in deps), (name, deps)
            graph[name] = [spec[2:] for spec in deps]
            pending += graph[name]
    return graph


async def test_every_module_the_page_imports_is_served_as_javascript(start: Started) -> None:
    graph = await served_graph(start)
    assert {"live.js", "editor.js", "list.js"} <= graph.keys()
    # And every module served is one the page loads: none is left over.
    assert set(MODULES) == graph.keys()


async def test_the_page_imports_no_module_cycle(start: Started) -> None:
    graph = await served_graph(start)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])
    # The bottom of the page stands alone.
    assert graph["state.js"] == []
    assert graph["dom.js"] == []
    assert graph["api.js"] == ["state.js"]


def test_imports_are_found_however_they_are_written() -> None:
    source = """
    import {
      a,
      b as c,
    } from "./multi.js";
    import * as all from './star.js';
    import def, { x } from "./default.js"
    import "./side-effect.js";
    export { y } from "./reexport.js";
    export * from "./star-export.js";
    export * as ns from "./ns-export.js";
    const later = () => import("./dynamic.js");
    const tpl = `${await import("./in-template.js")} text`;
    """
    assert specifiers(source) == [
        "./multi.js",
        "./star.js",
        "./default.js",
        "./side-effect.js",
        "./reexport.js",
        "./star-export.js",
        "./ns-export.js",
        "./dynamic.js",
        "./in-template.js",
    ]


def test_what_only_looks_like_an_import_is_none() -> None:
    source = r"""
    // import { a } from "./line-comment.js";
    /* import "./block-comment.js";
       export * from "./block-comment-2.js"; */
    const s = 'import "./in-string.js"';
    const d = "export * from './in-string-2.js'";
    const t = `import { b } from "./in-template.js"`;
    const r = /import "\.\/in-regex.js"/g;
    const url = import.meta.url;
    obj.import("./method.js");
    const half = 4 / 2; const more = half / 2; // import "./after-division.js"
    export const from = "./not-loaded.js";
    export { half, more };
    export default function f() {}
    """
    assert specifiers(source) == []


def test_a_dynamic_import_that_cannot_be_followed_is_an_error() -> None:
    with pytest.raises(ScanError):
        specifiers('const name = "./x.js"; import(name);')


def test_a_cycle_is_found_however_long() -> None:
    assert find_cycle({"a": ["b"], "b": ["c"], "c": []}) is None
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle({"app": ["x", "y"], "x": [], "y": ["y"]}) == ["y", "y"]
