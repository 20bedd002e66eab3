"""The demo page's route model and schema reader, loaded alone in Node (no browser, no DOM):
the page derives a summary from a body as the service does, walks `GET config` pages with
its one paginator, and names a reset's values from the OpenAPI document."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from slo_api.api.health import MODULES, STATIC
from slo_api.kinds import build_kinds
from slo_api.settings import Settings
from tests.unit.conftest import TOKEN, job_cr, llm_cr, pool_cr, served_openapi

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node (the page's modules run in it)")

KINDS = {k.name: k for k in build_kinds(Settings(slo_api_token=TOKEN))}

# Stands in for what a page module finds in a browser: where it is, the tab's storage, fetch
# (answering from `input`: the OpenAPI document and the `GET config` pages).
DRIVER = """
import { readFileSync } from "node:fs";
const input = JSON.parse(readFileSync(0, "utf8"));
globalThis.location = { pathname: "/demo-webui" };
globalThis.sessionStorage = { getItem: () => "a-token" };
const calls = [];
globalThis.fetch = async (url) => {
  calls.push(url);
  const page = Number(new URL(url, "http://page/").searchParams.get("page"));
  const body = url === "openapi.json" ? input.openapi : input.pages[page - 1];
  return { ok: true, status: 200, headers: new Map(), text: async () => JSON.stringify(body) };
};
const { loadSchema, resetValues } = await import("./schema.js");
const routes = await import("./routes.js");
const { resetText } = await import("./editor.js");
await loadSchema();
const walked = await routes.fetchSummaries();
console.log(JSON.stringify({
  summaries: input.bodies.map(routes.summaryOf),
  walked: walked.items.map((item) => item.route),
  calls,
  resets: Object.fromEntries(["llm", "job", "pool"].map((k) => [k, resetText(resetValues(k))])),
}));
"""


def run_page(tmp_path: Path, **input: Any) -> dict[str, Any]:
    assert NODE is not None
    for name in MODULES:
        (tmp_path / name).write_text((STATIC / name).read_text())
    (tmp_path / "package.json").write_text('{"type": "module"}')
    (tmp_path / "driver.js").write_text(DRIVER)
    done = subprocess.run(
        [NODE, "driver.js"],
        cwd=tmp_path,
        input=json.dumps({"openapi": served_openapi(), "bodies": [], "pages": [], **input}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def no_pool(namespace: str, route: str) -> None:
    return None


def test_a_summary_of_a_body_is_the_services_summary(tmp_path: Path) -> None:
    pool = pool_cr("p", ["a"], default="a")
    pool["status"] = {"phase": "Ready", "residentMember": "a"}
    crs = [
        ("llm", llm_cr("a", maximumDeployment={"value": 4}, ttft={"default": {"metrics": []}})),
        ("job", job_cr("j", priority=10)),
        ("pool", pool),
        ("pool", pool_cr("cold", ["b"])),
    ]
    bodies = [KINDS[kind].project(cr, no_pool) for kind, cr in crs]
    got = run_page(tmp_path, bodies=bodies, pages=[{"items": [], "total": 0}])
    assert got["summaries"] == [KINDS[kind].summary(cr) for kind, cr in crs]


def page(*names: str) -> list[dict[str, str]]:
    return [{"route": name, "kind": "llm"} for name in names]


def test_the_pages_are_walked_until_total_or_an_empty_page(tmp_path: Path) -> None:
    whole = run_page(tmp_path, pages=[{"items": page("a", "b"), "total": 3}, {"items": page("c")}])
    assert whole["walked"] == ["a", "b", "c"]
    assert [c for c in whole["calls"] if c.startswith("config")] == [
        "config?page=1&pageSize=200",
        "config?page=2&pageSize=200",
    ]
    # A total that promises more than the pages hold: the empty page ends the walk.
    short = run_page(
        tmp_path,
        pages=[
            {"items": page("a"), "total": 9},
            {"items": page("b"), "total": 9},
            {"items": [], "total": 9},
        ],
    )
    assert short["walked"] == ["a", "b"]
    assert len([c for c in short["calls"] if c.startswith("config")]) == 3


def test_the_reset_notice_names_what_delete_sets(tmp_path: Path) -> None:
    resets = run_page(tmp_path, pages=[{"items": [], "total": 0}])["resets"]
    assert resets == {
        "llm": "priority 0, minimum 1 replica, no maximum, no TTFT/OTPS targets",
        "job": "priority 0, minimum 1 replica, no maximum",
        "pool": "swap policy sticky, swap budget 300s, no default, no reclaim delay",
    }
