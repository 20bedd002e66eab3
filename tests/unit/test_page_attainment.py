"""The page's attainment figures, loaded alone in Node: what a chart draws from a series and a
target, how a budget and a target read, and the list's budget order from an attainment item."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from slo_api.api.health import MODULES, STATIC

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node (the page's modules run in it)")

DRIVER = """
import { readFileSync } from "node:fs";
const input = JSON.parse(readFileSync(0, "utf8"));
globalThis.location = { pathname: "/demo-webui" };
globalThis.sessionStorage = { getItem: () => "" };
const a = await import("./attainment.js");
const { budgetOf } = await import("./routes.js");
const box = { width: 100, height: 60, left: 0, right: 0, top: 0, bottom: 0 };
console.log(JSON.stringify({
  charts: input.charts.map(([series, target, span]) => a.chartGeometry(series, target, box, span)),
  sources: input.sources.map((s) => a.sourceText(s)),
  targets: input.objectives.map(a.targetText),
  budgets: input.budgets.map(a.budgetText),
  notes: input.notes.map(a.objectiveNotes),
  ranks: input.items.map(budgetOf),
}));
"""


def run_page(tmp_path: Path, **input: Any) -> dict[str, Any]:
    assert NODE is not None
    for name in MODULES:
        (tmp_path / name).write_text((STATIC / name).read_text())
    (tmp_path / "package.json").write_text('{"type": "module"}')
    (tmp_path / "driver.js").write_text(DRIVER)
    base: dict[str, list[Any]] = {
        "charts": [],
        "objectives": [],
        "budgets": [],
        "items": [],
        "sources": [],
        "notes": [],
    }
    done = subprocess.run(
        [NODE, "driver.js"],
        cwd=tmp_path,
        input=json.dumps({**base, **input}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_a_chart_draws_the_series_against_the_target_with_gaps_where_no_requests_came(
    tmp_path: Path,
) -> None:
    # Values up to 1.0 against a target of 2: the scale tops out at 2 * 1.15.
    series = [[0, 0.5], [100, None], [200, 1.0], [300, 0.0], [400, None], [500, 0.25]]
    (chart,) = run_page(tmp_path, charts=[[series, 2.0]])["charts"]
    top = 2.0 * 1.15
    assert chart["top"] == pytest.approx(top)
    assert chart["targetY"] == pytest.approx(60 - 2.0 / top * 60)
    # x: 500 s across 100 units. A step without requests lifts the pen: the line does not
    # pretend to know it; a point alone between gaps is a dot.
    assert chart["path"] == f"M40.0 {60 - 1.0 / top * 60:.1f} L60.0 60.0"
    assert chart["dots"] == [
        ["0.0", f"{60 - 0.5 / top * 60:.1f}"],
        ["100.0", f"{60 - 0.25 / top * 60:.1f}"],
    ]
    assert (chart["low"], chart["high"], chart["count"]) == (0.0, 1.0, 4)


def test_a_chart_spans_the_window_up_to_as_of_with_gaps_for_missing_steps(
    tmp_path: Path,
) -> None:
    # A 1h window as of t=4000 (5-minute steps): points at 1000..1600, none at 1900, then 2200
    # and 2500, and nothing for the last 25 minutes.
    series = [[1000, 1.0], [1300, 1.0], [1600, 1.0], [2200, 1.0], [2500, 1.0]]
    span = {"start": 400, "end": 4000, "step": 300}
    (chart,) = run_page(tmp_path, charts=[[series, 1.0, span]])["charts"]
    y = f"{60 - 1.0 / 1.15 * 60:.1f}"

    def x(t: int) -> str:
        return f"{(t - 400) / 3600 * 100:.1f}"

    # The axis is the window, not the points: the first point is a sixth in, the last ends
    # 25 minutes before the right edge; the missing step at 1900 lifts the pen.
    assert chart["path"] == (
        f"M{x(1000)} {y} L{x(1300)} {y} L{x(1600)} {y} M{x(2200)} {y} L{x(2500)} {y}"
    )
    assert chart["dots"] == []


def test_the_figures_time_is_always_said(tmp_path: Path) -> None:
    ok = {"status": "ok", "reason": None, "asOf": "2026-12-04T12:00:00Z"}
    stale = {"status": "stale", "reason": "no refresh for 190 s", "asOf": "2026-12-04T11:50:00Z"}
    down = {"status": "unavailable", "reason": "timeout", "asOf": None}
    assert run_page(tmp_path, sources=[ok, stale, down])["sources"] == [
        "Figures as of 2026-12-04T12:00:00Z.",
        "Figures stale (no refresh for 190 s); as of 2026-12-04T11:50:00Z.",
        "Prometheus unavailable (timeout); no figures yet.",
    ]


def test_an_empty_series_draws_only_the_target(tmp_path: Path) -> None:
    (chart,) = run_page(tmp_path, charts=[[[], 0.8]])["charts"]
    assert (chart["path"], chart["dots"], chart["count"], chart["low"]) == ("", [], 0, None)
    assert chart["top"] == pytest.approx(0.8 * 1.15)


def test_targets_and_budgets_read_as_a_person_says_them(tmp_path: Path) -> None:
    got = run_page(
        tmp_path,
        objectives=[
            {"metric": "ttft", "type": "p90", "threshold": 0.8},
            {"metric": "otps", "type": "p50", "threshold": 30},
            {"metric": "queue", "type": "maxDepth", "threshold": 20},
        ],
        budgets=[0.732, -0.5, None],
    )
    assert got["targets"] == ["p90 ≤ 0.8 s", "p50 ≥ 30 tok/s", "depth ≤ 20"]
    assert got["budgets"] == [
        "73.2% of budget left",
        "budget overspent by 50.0%",
        "no error budget",
    ]


def test_a_route_ranks_by_its_lowest_budget_and_shows_its_worst_status(tmp_path: Path) -> None:
    items = [
        {
            "objectives": [
                {"budgetRemaining": 0.4, "status": "at_risk"},
                {"budgetRemaining": -0.2, "status": "violated"},
                {"budgetRemaining": None, "status": "met"},
            ]
        },
        {"objectives": [{"budgetRemaining": None, "status": "no_data"}]},
        {"objectives": []},
        # Below the traffic floor: its budget is shown under the objective, but the route
        # ranks as no data, as the server orders it.
        {
            "objectives": [
                {"budgetRemaining": -4.0, "status": "no_data", "reason": "insufficient_traffic"}
            ]
        },
    ]
    assert run_page(tmp_path, items=items)["ranks"] == [
        {"budget": -0.2, "status": "violated"},
        {"budget": None, "status": "no_data"},
        {"budget": None, "status": None},
        {"budget": None, "status": "no_data"},
    ]


def test_an_objective_says_what_its_figures_rest_on_and_when_its_budget_runs_out(
    tmp_path: Path,
) -> None:
    few = {
        "metric": "ttft",
        "status": "no_data",
        "reason": "insufficient_traffic",
        "requests": 42.5,
        "goodRatio": 0.58,
        "estimated": True,
        "goodRatioBounds": {"low": 0.5, "high": 0.9},
        "coverage": {"since": "2026-12-04T06:00:00Z", "fraction": 0.25},
        "exhaustsAt": {"1h": None, "6h": None},
    }
    burning = {
        "metric": "otps",
        "status": "at_risk",
        "reason": None,
        "goodRatio": 0.9,
        "estimated": False,
        "goodRatioBounds": {"low": 0.9, "high": 0.9},
        "coverage": {"since": "2026-11-06T12:00:00Z", "fraction": 1.0},
        "exhaustsAt": {"1h": "2026-12-05T02:00:00Z", "6h": None},
    }
    unmatched = {"metric": "ttft", "status": "no_data", "reason": "no_series", "coverage": None}
    idle = {"metric": "ttft", "status": "no_data", "reason": "no_traffic"}
    notes = run_page(tmp_path, notes=[few, burning, unmatched, idle, {"metric": "queue"}])["notes"]
    assert notes == [
        [
            "Too few requests to judge: 42.5 in the window.",
            "58.0% within the target, estimated: between 50.0% and 90.0%.",
            "Prometheus holds 25.0% of the window (since 2026-12-04T06:00:00Z).",
        ],
        [
            "At the 1h burn rate the budget runs out at 2026-12-05T02:00:00Z; "
            "at the 6h rate it does not.",
        ],
        ["No series match this route's selector in the window."],
        ["No requests in the window."],
        [],
    ]
