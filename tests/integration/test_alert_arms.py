"""Every objective `sloctl rules` writes rules for can page, checked by promtool.

A burn rate cannot exceed 1 / (1 - objective) (2 for p50), so the workbook's factors alone would
leave loose objectives without a page. Here the server's own `alerting` (bucket and arms) goes
through `sloctl rules`, then `promtool check rules` and `promtool test rules` with series of 100%
bad traffic for an hour (the page alert fires) and good traffic after (it resolves).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import respx
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slo_api.attainment.arithmetic import BOUNDS, PERCENTILES, LatencyMetric, alerting
from slo_api.cli.__main__ import main

pytestmark = pytest.mark.integration

SERVER = "http://slo.test"
Obj = dict[str, Any]
HISTOGRAM = {
    "ttft": "vllm:time_to_first_token_seconds",
    "otps": "vllm:request_time_per_output_token_seconds",
}
# Minutes of 100% bad traffic, then good traffic until the end of the series.
BAD_MINUTES = 70
END_MINUTES = 180
PER_MINUTE = 100


@pytest.fixture(autouse=True)
def _server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLO_API_URL", SERVER)
    monkeypatch.setenv("SLO_API_TOKEN", "s3cret")


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: `make test-tools` installs Debian's prometheus package")
    return found


def _item(route: str, model: str, targets: list[tuple[LatencyMetric, str, float]]) -> Obj:
    """A route as the attainment listing gives it, `alerting` made by the server's function."""
    matchers = '{model_name="' + model + '"}'
    made = [alerting(metric, kind, threshold) for metric, kind, threshold in targets]
    return {
        "route": route,
        "kind": "llm",
        "window": "28d",
        "source": {"status": "not_configured", "reason": None, "asOf": None},
        "selectors": {"ttft": matchers, "otps": matchers},
        "objectives": [],
        "unmeasured": [],
        "alerting": [a for a in made if a is not None],
    }


def _sloctl_rules(items: list[Obj], capsys: pytest.CaptureFixture[str]) -> tuple[Obj, str]:
    with respx.mock(base_url=SERVER, assert_all_mocked=True) as api:
        api.get("/config", params__contains={"view": "attainment"}).respond(
            json={"items": items, "total": len(items), "page": 1, "pageSize": 200}
        )
        code = main(["rules"])
    out, err = capsys.readouterr()
    assert code == 0, err
    document: Obj = yaml.safe_load(out)
    return document, err


def _le(bound: float) -> str:
    return repr(float(bound))  # as vLLM's Python client spells it: 1.0, 0.25


def _series(model: str, metric: str, le: str | None) -> list[Obj]:
    """100% bad traffic for BAD_MINUTES, then 100% good: the bucket `le` (None: the exporter
    lacks it) stays still while the count climbs, then climbs with it."""
    name = HISTOGRAM[metric]
    labels = f'model_name="{model}"'
    total = f"0+{PER_MINUTE}x{END_MINUTES}"
    good = f"0x{BAD_MINUTES} {PER_MINUTE}+{PER_MINUTE}x{END_MINUTES - BAD_MINUTES - 1}"
    series = [
        {"series": f'{name}_bucket{{{labels},le="+Inf"}}', "values": total},
        {"series": f"{name}_count{{{labels}}}", "values": total},
    ]
    if le is not None:
        series.append({"series": f'{name}_bucket{{{labels},le="{le}"}}', "values": good})
    return series


def _alerts(document: Obj) -> dict[str, list[Obj]]:
    alerts: dict[str, list[Obj]] = {}
    for group in document["spec"]["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                alerts.setdefault(rule["alert"], []).append(rule)
    return alerts


def _promtool_test(
    document: Obj, input_series: list[Obj], evals: list[tuple[str, str, list[Obj]]]
) -> str:
    """`promtool test rules` of the document's rules: each (time, alert, expected alerts)."""
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        (where / "rules.yaml").write_text(yaml.safe_dump(document["spec"], sort_keys=False))
        checked = subprocess.run(
            [_promtool(), "check", "rules", "rules.yaml"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if checked.returncode != 0:
            return checked.stdout + checked.stderr + f"\ncheck exit {checked.returncode}"
        tests = {
            "rule_files": ["rules.yaml"],
            "evaluation_interval": "1m",
            "tests": [
                {
                    "interval": "1m",
                    "input_series": input_series,
                    "alert_rule_test": [
                        {"eval_time": at, "alertname": name, "exp_alerts": expected}
                        for at, name, expected in evals
                    ],
                }
            ],
        }
        (where / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
        result = subprocess.run(
            [_promtool(), "test", "rules", "tests.yaml"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    return result.stdout + result.stderr + f"\nexit {result.returncode}"


def _expected(rules: list[Obj]) -> list[Obj]:
    return [{"exp_labels": r["labels"], "exp_annotations": r["annotations"]} for r in rules]


def _fires_then_resolves(document: Obj, input_series: list[Obj]) -> str:
    """The page alert fires for every objective after an hour of bad traffic (65m) and for
    none once the short windows hold only good traffic again (40 minutes of it)."""
    pages = _alerts(document)["SLOErrorBudgetBurnFast"]
    return _promtool_test(
        document,
        input_series,
        [
            ("65m", "SLOErrorBudgetBurnFast", _expected(pages)),
            (f"{BAD_MINUTES + 40}m", "SLOErrorBudgetBurnFast", []),
            ("65m", "SLOThresholdBucketMissing", []),
        ],
    )


@pytest.mark.parametrize("kind", sorted(PERCENTILES))
@pytest.mark.parametrize(("metric", "threshold"), [("ttft", 0.5), ("otps", 30.0)])
def test_the_page_fires_under_bad_traffic_and_resolves_for_every_percentile(
    kind: str, metric: LatencyMetric, threshold: float, capsys: pytest.CaptureFixture[str]
) -> None:
    item = _item("chat", "chat-7b", [(metric, kind, threshold)])
    document, err = _sloctl_rules([item], capsys)
    assert "cannot fire" not in err
    le = _le(item["alerting"][0]["bucket"]["le"])
    result = _fires_then_resolves(document, _series("chat-7b", metric, le))
    assert result.endswith("exit 0"), result


def test_the_harness_fails_when_the_page_stays_silent(capsys: pytest.CaptureFixture[str]) -> None:
    """Without bad traffic nothing pages, and promtool says the expected page is missing."""
    item = _item("chat", "chat-7b", [("ttft", "p50", 0.5)])
    document, _ = _sloctl_rules([item], capsys)
    name = HISTOGRAM["ttft"]
    always_good = [
        {"series": f'{name}_bucket{{model_name="chat-7b",le="0.5"}}', "values": "0+100x180"},
        {"series": f'{name}_count{{model_name="chat-7b"}}', "values": "0+100x180"},
    ]
    result = _fires_then_resolves(document, always_good)
    assert not result.endswith("exit 0"), result
    assert "SLOErrorBudgetBurnFast" in result


def test_a_missing_bucket_bound_is_an_alert_of_its_own(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The exporter has no 0.5 bucket: the burn alerts see no series and stay silent, the
    # bucket's own alert does not.
    item = _item("chat", "chat-7b", [("ttft", "p99", 0.5)])
    document, _ = _sloctl_rules([item], capsys)
    missing = _alerts(document)["SLOThresholdBucketMissing"]
    expected = [
        {
            "exp_labels": {**missing[0]["labels"], "model_name": "chat-7b", "le": "0.5"},
            "exp_annotations": missing[0]["annotations"],
        }
    ]
    result = _promtool_test(
        document,
        _series("chat-7b", "ttft", None),
        [("65m", "SLOThresholdBucketMissing", expected), ("65m", "SLOErrorBudgetBurnFast", [])],
    )
    assert result.endswith("exit 0"), result


def test_two_targets_of_one_type_on_one_metric_make_valid_rules_that_page_apart(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 0.25 s and 2.5 s at p90: only the 0.25 s bucket stays still, so only its target pages.
    item = _item("chat", "chat-7b", [("ttft", "p90", 0.25), ("ttft", "p90", 2.5)])
    document, _ = _sloctl_rules([item], capsys)
    name = HISTOGRAM["ttft"]
    series = [
        *_series("chat-7b", "ttft", "0.25"),
        {"series": f'{name}_bucket{{model_name="chat-7b",le="2.5"}}', "values": "0+100x180"},
    ]
    pages = [r for r in _alerts(document)["SLOErrorBudgetBurnFast"]]
    assert [p["labels"]["threshold"] for p in pages] == ["0.25", "2.5"]
    result = _promtool_test(
        document, series, [("65m", "SLOErrorBudgetBurnFast", _expected(pages[:1]))]
    )
    assert result.endswith("exit 0"), result


# -- the property: any objective of any percentile --------------------------------------------


def _threshold(metric: LatencyMetric) -> st.SearchStrategy[float]:
    """Thresholds on a bucket bound and between two (TTFT in seconds, OTPS in tokens/s)."""
    bounds = BOUNDS[metric]
    on = st.sampled_from(bounds[1:-1])
    between = st.integers(1, len(bounds) - 2).flatmap(
        lambda i: st.floats(bounds[i - 1], bounds[i], exclude_min=True, exclude_max=True)
    )
    seconds = st.one_of(on, between)
    return seconds if metric == "ttft" else seconds.map(lambda s: 1 / s)


@st.composite
def _targets(draw: st.DrawFn) -> list[tuple[LatencyMetric, str, float]]:
    out: list[tuple[LatencyMetric, str, float]] = []
    for _ in range(draw(st.integers(1, 3))):
        metric: LatencyMetric = draw(st.sampled_from(("ttft", "otps")))
        out.append((metric, draw(st.sampled_from(sorted(PERCENTILES))), draw(_threshold(metric))))
    return out


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(targets=_targets())
def test_any_objective_pages_under_bad_traffic_and_resolves(
    targets: list[tuple[LatencyMetric, str, float]], capsys: pytest.CaptureFixture[str]
) -> None:
    # One route per target, so each has its own series to burn.
    items = [_item(f"r{i}", f"m{i}", [t]) for i, t in enumerate(targets)]
    document, err = _sloctl_rules(items, capsys)
    assert "cannot fire" not in err
    # One group of alerts per target, beside each route's group of recorded 5-minute increases.
    groups = [g["name"] for g in document["spec"]["groups"]]
    alerting = [g for g in groups if not g.endswith(".increase5m")]
    assert len(alerting) == len(targets), err
    assert len(groups) == len(alerting) + len(items), groups
    series = []
    for i, item in enumerate(items):
        metric = item["alerting"][0]["metric"]
        series += _series(f"m{i}", metric, _le(item["alerting"][0]["bucket"]["le"]))
    result = _fires_then_resolves(document, series)
    assert result.endswith("exit 0"), result
