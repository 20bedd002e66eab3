"""sloctl attainment and sloctl rules against a mocked slo-api (the issue's response shape)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import respx
import yaml

from slo_api.attainment.arithmetic import alerting
from slo_api.cli import rules
from tests.unit.test_sloctl import SERVER, run, table_rows

SOURCE_OK = {"status": "ok", "reason": None, "asOf": "2026-12-02T05:00:00Z"}
BURNS = {"5m": 0.4, "30m": 0.5, "1h": 0.6, "6h": 0.7}


def objective(metric: str, kind: str, threshold: float, **values: Any) -> dict[str, Any]:
    percentile = kind.startswith("p")
    base: dict[str, Any] = {
        "metric": metric,
        "type": kind,
        "threshold": threshold,
        "objective": int(kind[1:]) / 100 if percentile else None,
        "observed": None,
        "goodRatio": None,
        "budgetRemaining": None,
        "burnRates": dict(BURNS) if percentile else None,
        "status": "met",
        "estimated": False,
    }
    return {**base, **values}


CHAT: dict[str, Any] = {
    "route": "chat-7b",
    "kind": "llm",
    "window": "28d",
    "source": SOURCE_OK,
    "objectives": [
        objective("ttft", "p90", 0.8, observed=0.62, goodRatio=0.97, budgetRemaining=0.7,
                  estimated=True),
        objective("otps", "avg", 20, observed=31.5),
    ],
    "unmeasured": [
        {
            "metric": "ttft",
            "range": {"contextLengthRangeLow": 0, "contextLengthRangeHigh": 4096},
            "reason": "vLLM's metrics carry no context length",
        }
    ],
    "selectors": {
        "ttft": 'vllm:time_to_first_token_seconds{model_name="chat-7b-instruct"}',
        "otps": 'vllm:request_time_per_output_token_seconds{model_name="chat-7b-instruct"}',
    },
}  # fmt: skip
CODE: dict[str, Any] = {
    "route": "code-13b",
    "kind": "llm",
    "window": "28d",
    "source": SOURCE_OK,
    "objectives": [
        objective("ttft", "p99", 1.0, observed=1.6, goodRatio=0.985, budgetRemaining=-0.5,
                  status="violated"),
        objective("otps", "p50", 30, observed=33.0, goodRatio=0.6, budgetRemaining=0.2,
                  status="at_risk"),
    ],
    "unmeasured": [],
    "selectors": {
        "ttft": 'vllm:time_to_first_token_seconds{model_name="code-13b"}',
        "otps": 'vllm:request_time_per_output_token_seconds{model_name="code-13b"}',
    },
}  # fmt: skip
JOB: dict[str, Any] = {
    "route": "batch-render",
    "kind": "job",
    "window": "28d",
    "source": SOURCE_OK,
    "objectives": [
        {
            **objective("queue", "maxDepth", 20, observed=12, goodRatio=0.99),
            "objective": None,
            "burnRates": None,
        }
    ],
    "unmeasured": [],
    "selectors": None,
}


def page(*items: dict[str, Any]) -> dict[str, Any]:
    return {"items": list(items), "total": len(items), "page": 1, "pageSize": 200}


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[respx.MockRouter]:
    monkeypatch.setenv("SLO_API_URL", SERVER)
    monkeypatch.setenv("SLO_API_TOKEN", "s3cret")
    with respx.mock(base_url=SERVER, assert_all_called=False, assert_all_mocked=True) as router:
        yield router


# -- attainment ---------------------------------------------------------------------------------


def test_attainment_of_one_route_is_a_row_per_objective_and_unmeasured_target(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    route = api.get("/routes/chat-7b/attainment").respond(json=CHAT)
    code, out, _ = run(capsys, "attainment", "chat-7b", "--window", "7d")
    assert code == 0
    assert route.calls.last.request.url.params["window"] == "7d"
    lines = [line.split() for line in out.splitlines()]
    assert lines == [
        ["ROUTE", "METRIC", "TARGET", "OBSERVED", "BUDGET", "STATUS", "EXHAUSTS"],
        ["chat-7b", "ttft", "p90<=0.8s", "~0.62s", "70.0%", "met", "-"],
        ["chat-7b", "otps", "avg>=20/s", "31.5/s", "-", "met", "-"],
        ["chat-7b", "ttft", "[0,4096)", "-", "-", "unmeasured", "-"],
    ]


def test_attainment_says_when_the_budget_runs_out_and_why_there_is_no_data(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    burning = objective(
        "otps",
        "p50",
        30,
        observed=33.0,
        goodRatio=0.6,
        budgetRemaining=0.2,
        status="at_risk",
        exhaustsAt={"1h": "2026-12-03T02:00:00Z", "6h": "2026-12-04T09:00:00Z"},
    )
    later = objective(
        "ttft",
        "p90",
        0.8,
        observed=0.5,
        goodRatio=0.95,
        budgetRemaining=0.5,
        exhaustsAt={"1h": None, "6h": "2026-12-20T00:00:00Z"},
    )
    few = objective(
        "ttft",
        "p99",
        1.0,
        goodRatio=0.9,
        status="no_data",
        reason="insufficient_traffic",
        exhaustsAt={"1h": None, "6h": None},
    )
    api.get("/routes/code-13b/attainment").respond(
        json={**CODE, "objectives": [burning, later, few]}
    )
    code, out, _ = run(capsys, "attainment", "code-13b")
    assert code == 0
    rows = [line.split() for line in out.splitlines()[1:]]
    # The sooner of the two forecasts, with the burn rate's window it is at.
    assert [r[5:] for r in rows] == [
        ["at_risk", "2026-12-03T02:00:00Z(1h)"],
        ["met", "2026-12-20T00:00:00Z(6h)"],
        ["no_data(insufficient_traffic)", "-"],
    ]


def test_attainment_json_and_yaml_are_the_servers_answer(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/routes/chat-7b/attainment").respond(json=CHAT)
    _, out, _ = run(capsys, "attainment", "chat-7b", "-o", "json")
    assert json.loads(out) == [CHAT]
    _, out, _ = run(capsys, "attainment", "chat-7b", "-o", "yaml")
    assert yaml.safe_load(out) == [CHAT]


def test_attainment_lists_every_route_in_the_servers_budget_order(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    listing = api.get("/config", params__contains={"view": "attainment"})
    empty = {**CHAT, "route": "embed-small", "objectives": [], "unmeasured": []}
    listing.respond(json=page(CODE, CHAT, JOB, empty))
    code, out, _ = run(capsys, "attainment", "--sort", "budget")
    assert code == 0
    params = listing.calls.last.request.url.params
    assert (params["sort"], params["page"], "window" in params) == ("budget", "1", False)
    rows = [line.split() for line in out.splitlines()[1:]]
    # The server's order (lowest budget first) is kept, not re-sorted by route name.
    assert [(r[0], r[1], r[4], r[5]) for r in rows] == [
        ("code-13b", "ttft", "-50.0%", "violated"),
        ("code-13b", "otps", "20.0%", "at_risk"),
        ("chat-7b", "ttft", "70.0%", "met"),
        ("chat-7b", "otps", "-", "met"),
        ("chat-7b", "ttft", "-", "unmeasured"),
        ("batch-render", "queue", "-", "met"),
        # No objectives, and a source that answered: nothing to say, not "ok".
        ("embed-small", "-", "-", "-"),
    ]
    assert rows[-2][2:4] == ["<=20", "12"]


def test_attainment_says_why_figures_are_missing_or_old(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    unconfigured = {**CHAT, "source": {"status": "not_configured", "reason": None, "asOf": None},
                    "objectives": [], "unmeasured": []}  # fmt: skip
    api.get("/routes/chat-7b/attainment").respond(json=unconfigured)
    code, out, err = run(capsys, "attainment", "chat-7b")
    assert code == 0
    assert table_rows(out)["chat-7b"] == ["chat-7b", "-", "-", "-", "-", "not_configured", "-"]
    assert err == ""
    stale = {"status": "unavailable", "reason": "timeout", "asOf": "2026-12-02T04:00:00Z"}
    api.get("/config", params__contains={"view": "attainment"}).respond(
        json=page({**CHAT, "source": stale}, {**CODE, "source": stale})
    )
    code, out, err = run(capsys, "attainment")
    assert code == 0
    # The kept figures are shown, and said once to be old.
    assert table_rows(out)["code-13b"][5] in ("violated", "at_risk")
    assert err.splitlines() == [
        "sloctl: Prometheus unavailable (timeout); figures as of 2026-12-02T04:00:00Z (2 routes)"
    ]
    # Figures no refresh has renewed for long are said to be stale, with their time.
    old = {"status": "stale", "reason": "no refresh for 185 s", "asOf": "2026-12-02T04:00:00Z"}
    api.get("/routes/chat-7b/attainment").respond(json={**CHAT, "source": old})
    code, out, err = run(capsys, "attainment", "chat-7b")
    assert code == 0
    assert err.splitlines() == [
        "sloctl: chat-7b: stale (no refresh for 185 s); figures as of 2026-12-02T04:00:00Z"
    ]


def test_attainment_sort_is_for_the_list_and_unknown_windows_are_refused(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "attainment", "chat-7b", "--sort", "budget")
    assert code == 2
    assert "leave out ROUTE" in err
    code, _, _ = run(capsys, "attainment", "--window", "30d")
    assert code == 2


def test_attainment_of_a_route_the_caller_may_not_read_is_the_servers_404(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/routes/secret/attainment").respond(
        404, json={"error": {"code": "not_found", "message": "route secret not found"}}
    )
    code, out, err = run(capsys, "attainment", "secret")
    assert (code, out) == (3, "")
    assert "route secret not found" in err


# -- rules --------------------------------------------------------------------------------------


def with_alerting(item: dict[str, Any]) -> dict[str, Any]:
    """The item as the server lists it: `alerting` from its percentile targets, made by the
    server's own function."""
    if item["kind"] != "llm" or "alerting" in item:
        return {**item, "alerting": item.get("alerting", [])}
    made = [
        alerting(o["metric"], o["type"], o["threshold"])
        for o in item["objectives"]
        if o["metric"] in ("ttft", "otps")
    ]
    return {**item, "alerting": [a for a in made if a is not None]}


def generated(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], *items: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """`sloctl rules` for routes whose attainment is `items`."""
    listed = [with_alerting(item) for item in items]
    api.get("/config", params__contains={"view": "attainment"}).respond(json=page(*listed))
    code, out, err = run(capsys, "rules", "--namespace", "monitoring")
    assert code == 0, err
    assert "&id" not in out, "a YAML anchor: write each rule's labels out"
    document: dict[str, Any] = yaml.safe_load(out)
    return document, err


def test_rules_record_each_percentile_objective_and_alert_on_its_burn(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    document, err = generated(api, capsys, CHAT, CODE, JOB)
    assert (document["kind"], document["metadata"]["namespace"]) == ("PrometheusRule", "monitoring")
    groups = {g["name"]: g["rules"] for g in document["spec"]["groups"]}
    assert list(groups) == [
        "slo-api.chat-7b.ttft.p90.0.8",
        "slo-api.code-13b.ttft.p99.1",
        "slo-api.code-13b.otps.p50.30",
        # Each route's 5-minute increases, which slo-api reads in place of the raw series.
        "slo-api.chat-7b.increase5m",
        "slo-api.code-13b.increase5m",
    ]
    # The average and the job route have no error budget: said, not silently dropped.
    assert "chat-7b otps avg: an average has no error budget" in err
    chat = groups["slo-api.chat-7b.ttft.p90.0.8"]
    records = {r["record"]: r for r in chat if "record" in r}
    assert set(records) == {
        "slo:sli_error:ratio_rate5m",
        "slo:sli_error:ratio_rate30m",
        "slo:sli_error:ratio_rate1h",
        "slo:sli_error:ratio_rate6h",
        "slo:sli_error:ratio_rate3d",
        "slo:objective:ratio",
    }
    labels = {"route": "chat-7b", "metric": "ttft", "type": "p90", "threshold": "0.8"}
    assert all(r["labels"] == labels for r in chat if "record" in r)
    # The series are those the server named; 0.8 s lies between the 0.75 and 1 bounds.
    assert records["slo:sli_error:ratio_rate1h"]["expr"] == (
        '1 - (sum(rate(vllm:time_to_first_token_seconds_bucket{model_name="chat-7b-instruct", '
        'le="0.75"}[1h])) / sum(rate(vllm:time_to_first_token_seconds_count'
        '{model_name="chat-7b-instruct"}[1h])))'
    )
    alerts = {r["alert"]: r for r in chat if "alert" in r}
    fast, slow = alerts["SLOErrorBudgetBurnFast"], alerts["SLOErrorBudgetBurnSlow"]
    assert (fast["labels"], slow["labels"]) == (
        {**labels, "severity": "page"},
        {**labels, "severity": "ticket"},
    )
    page_arms = " ".join(fast["expr"].split()).split(" or ")
    assert "rate1h" in page_arms[0]
    assert "rate5m" in page_arms[0]
    # p90 burns at most 10: the workbook's 13.44 (and 5.6) for 28 days are capped at 5, half
    # the requests missing.
    assert page_arms[0].count("> 0.5)") == 1
    assert page_arms[0].count("> 0.5 ") == 1
    assert "rate6h" in page_arms[1]
    assert "rate30m" in page_arms[1]
    assert "capped" in fast["annotations"]["description"]
    assert "rate3d" in slow["expr"]
    assert "rate6h" in slow["expr"]
    assert slow["expr"].count("> 0.0933333") == 2  # 0.933 (10% of 28 days in 3d) x 0.1
    assert "le=0.75" in fast["annotations"]["threshold_bucket"]
    assert "between bucket bounds" in fast["annotations"]["threshold_bucket"]
    p99 = {r["alert"]: r for r in groups["slo-api.code-13b.ttft.p99.1"] if "alert" in r}
    assert p99["SLOErrorBudgetBurnFast"]["expr"].count("> 0.1344") == 2  # 13.44 x 0.01
    assert p99["SLOErrorBudgetBurnFast"]["expr"].count("> 0.056") == 2  # 5.6 x 0.01


def test_the_rules_count_at_the_bucket_the_server_names(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    # Whatever the server counts an objective at, the rules count at: no copy of the bounds.
    named = with_alerting(CHAT)
    named["alerting"][0]["bucket"] = {"le": 0.5, "exact": False}
    document, _ = generated(api, capsys, named)
    rules_ = document["spec"]["groups"][0]["rules"]
    assert 'le="0.5"}[5m]' in rules_[0]["expr"]
    missing = next(r for r in rules_ if r.get("alert") == "SLOThresholdBucketMissing")
    assert missing["expr"] == (
        "absent_over_time(vllm:time_to_first_token_seconds_bucket"
        '{model_name="chat-7b-instruct", le="0.5"}[1h])'
    )
    assert missing["labels"]["severity"] == "ticket"


def test_two_targets_of_one_type_get_a_group_each(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    both = {
        **CHAT,
        "objectives": [
            objective("ttft", "p90", 0.8),
            objective("ttft", "p90", 2.5),
            objective("ttft", "p90", 2.5),
        ],
    }
    document, err = generated(api, capsys, both)
    groups = {g["name"]: g["rules"] for g in document["spec"]["groups"]}
    assert list(groups) == [
        "slo-api.chat-7b.ttft.p90.0.8",
        "slo-api.chat-7b.ttft.p90.2.5",
        "slo-api.chat-7b.increase5m",
    ]
    assert groups["slo-api.chat-7b.ttft.p90.2.5"][0]["labels"]["threshold"] == "2.5"
    assert "chat-7b ttft p90 2.5: the same target twice" in err


def test_an_arm_that_cannot_fire_is_named(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    # A server whose arms were not capped: 14.4 is beyond p90's highest burn rate, 10.
    uncapped = with_alerting(CHAT)
    uncapped["alerting"][0]["arms"][0].update(burnRate=14.4, capped=False)
    document, err = generated(api, capsys, uncapped)
    assert document["spec"]["groups"]
    assert (
        "chat-7b ttft p90 0.8: the page arm over 1h and 5m cannot fire (it needs a burn rate "
        "above 14.4; p90 burns at most 10)"
    ) in err
    _, err = generated(api, capsys, CHAT)
    assert "cannot fire" not in err


def test_arms_the_rules_cannot_use_are_refused_with_the_reason(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    # A factor that is not a number, and a window that would end the range selector early.
    wrong = with_alerting(CHAT)
    wrong["alerting"][0]["arms"][0]["burnRate"] = "fast"
    odd = with_alerting({**CODE, "route": "odd"})
    odd["alerting"][0]["arms"][1]["long"] = "1h]) or vector(1"
    document, err = generated(api, capsys, wrong, odd)
    assert [g["name"] for g in document["spec"]["groups"]] == [
        "slo-api.odd.otps.p50.30",
        "slo-api.odd.increase5m",
    ]
    assert "chat-7b ttft p90: the server named no usable alert arms" in err
    assert "odd ttft p99: the server named no usable alert arms" in err


def test_an_otps_threshold_is_a_time_per_output_token_bucket(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    document, _ = generated(api, capsys, CODE)
    otps = next(g for g in document["spec"]["groups"] if ".otps.p50." in g["name"])
    expr = next(r["expr"] for r in otps["rules"] if r.get("record", "").endswith("rate5m"))
    # 30 tokens/s is 1/30 s per token, between the 0.025 and 0.05 bounds: 0.025 counts.
    assert (
        'vllm:request_time_per_output_token_seconds_bucket{model_name="code-13b", le="0.025"}'
        in expr
    )
    ttft = next(g for g in document["spec"]["groups"] if ".ttft.p99." in g["name"])
    expr = next(r["expr"] for r in ttft["rules"] if r.get("record", "").endswith("rate5m"))
    # A whole bound matches however the exporter spells it.
    assert 'le=~"1|1[.]0"' in expr
    alert = next(r for r in ttft["rules"] if r.get("alert"))
    assert "between" not in alert["annotations"]["threshold_bucket"]


def test_rules_leave_out_what_cannot_be_expressed_and_say_why(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = {**CHAT, "route": "tiny", "objectives": [objective("ttft", "p90", 0.0005)]}
    nameless = {**CODE, "route": "nameless", "selectors": None}
    document, err = generated(api, capsys, tiny, nameless)
    assert document["spec"]["groups"] == []
    assert (
        "tiny ttft p90 0.0005: no bucket bound of vllm:time_to_first_token_seconds lies at or "
        "below the threshold"
    ) in err
    assert "nameless ttft p99: the server named no series selector" in err
    # A selector without a metric name reads the histogram's own.
    assert rules.parse_selector('{a="b"}', rules.TTFT_METRIC) == (rules.TTFT_METRIC, 'a="b"')
    with pytest.raises(ValueError, match="not a vector selector"):
        rules.parse_selector('model_name="x"', rules.TTFT_METRIC)
    assert "no percentile objective to make rules for" in err


def test_a_selector_with_quotes_stays_one_matcher(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    # The server escapes CR values into its selectors; sloctl places them as they are.
    hostile = {
        **CHAT,
        "selectors": {
            "ttft": r'vllm:time_to_first_token_seconds{model_name="a\"}, x{"}',
            "otps": None,
        },
    }
    document, _ = generated(api, capsys, hostile)
    expr = document["spec"]["groups"][0]["rules"][0]["expr"]
    assert r'_seconds_bucket{model_name="a\"}, x{", le="0.75"}[5m]' in expr
    assert r'_count{model_name="a\"}, x{"}[5m]' in expr


def test_rules_need_no_figures_only_the_servers_alerting_and_selectors(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    # slo-api without Prometheus (or cut off from it) still names each route's series,
    # buckets and arms.
    unconfigured = {"status": "not_configured", "reason": None, "asOf": None}
    bare = {**with_alerting(CODE), "source": unconfigured, "objectives": []}
    api.get("/config", params__contains={"view": "attainment"}).respond(json=page(bare))
    code, out, err = run(capsys, "rules")
    assert code == 0, err
    groups = [g["name"] for g in yaml.safe_load(out)["spec"]["groups"]]
    assert groups == [
        "slo-api.code-13b.ttft.p99.1",
        "slo-api.code-13b.otps.p50.30",
        "slo-api.code-13b.increase5m",
    ]
    objective = next(
        r
        for r in yaml.safe_load(out)["spec"]["groups"][0]["rules"]
        if r.get("record") == "slo:objective:ratio"
    )
    assert objective["expr"] == "vector(0.99)"
    # An older server names no alerting: said, no rules guessed.
    api.get("/config", params__contains={"view": "attainment"}).respond(json=page(CODE))
    code, out, err = run(capsys, "rules")
    assert "code-13b: the server named no alerting for it" in err


def test_attainment_escapes_what_would_steer_the_terminal(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    evil = "\x1b[2J\x1b]0;owned\x07"
    stale = {"status": "unavailable", "reason": f"bad{evil}", "asOf": None}
    hostile = {**CHAT, "route": f"r{evil}", "source": stale, "objectives": [
        {**objective("ttft", "p90", 0.8, status=f"met{evil}"), "type": f"p90{evil}"}
    ], "unmeasured": [{"metric": "ttft", "range": evil, "reason": evil}]}  # fmt: skip
    api.get("/config", params__contains={"view": "attainment"}).respond(json=page(hostile))
    code, out, err = run(capsys, "attainment")
    assert code == 0
    assert "\x1b" not in out + err
    assert "\x07" not in out + err
    assert "r\\x1b[2J\\x1b]0;owned\\x07" in out
    assert "bad\\x1b[2J" in err
