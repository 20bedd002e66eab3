"""The guardrails as slo-api shows and explains them: `limits`, `overLimits`, the gauge and the
`400 limit_exceeded` of a refusal (the enforcement itself: tests/integration/test_guardrails.py)."""

from __future__ import annotations

from typing import Any

import pytest

from slo_api.kube import KubeError
from slo_api.limits import EXEMPT_LABEL, Limits, refusal
from tests.unit.conftest import AUTH, Started, job_cr, llm_cr, until
from tests.unit.fakes import FakeKube

# What the API server answers when the guardrails' policy refuses a change: 422, reason Invalid,
# this message and one cause without a field holding its part from the policy's name on; only
# the first failed validation is told (tests/integration/test_guardrails.py on the real one).
DENIAL = (
    'llmslorequirements.inference.modelsphere.dev "chat-cr" is forbidden: '
    "ValidatingAdmissionPolicy 'slo-limits' with binding 'slo-limits' denied request: "
    "{prefix} is {value} in this namespace's SLOLimits default: {rest}"
)


def limits_cr(namespace: str = "ns", name: str = "default", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "inference.modelsphere.dev/v1alpha1",
        "kind": "SLOLimits",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def namespace_obj(name: str, exempt: bool) -> dict[str, Any]:
    labels = {EXEMPT_LABEL: "true"} if exempt else {}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


ALL_CAPS: dict[str, Any] = {
    "maxPriority": 5,
    "maxReplicas": 8,
    "maxPDEngines": 4,
    "minTTFTSeconds": 0.2,
    "maxOTPS": 50,
    "minQueueDepth": 100,
}


def test_a_guardrails_refusal_names_the_field_and_the_cap_in_the_apis_words() -> None:
    cases = {
        ("maxPriority", "5"): ("priority", "may be at most 5"),
        ("maxReplicas", "8"): ("maximumDeployment.value", "may be at most 8"),
        ("minTTFTSeconds", "0.2"): ("ttft", "each ttft threshold may be at least 0.2 s"),
        ("maxOTPS", "50"): ("otps", "each otps threshold may be at most 50"),
        ("minQueueDepth", "100"): ("queue.maxDepth", "may be at least 100"),
        # Exactly as the policy wrote it, never rounded.
        ("maxOTPS", "1234567"): ("otps", "each otps threshold may be at most 1234567 "),
        ("minTTFTSeconds", "0.2500001"): ("ttft", "may be at least 0.2500001 s"),
    }
    for (cap, value), (field, rule) in cases.items():
        error = refusal(DENIAL.format(prefix=cap, value=value, rest="spec.x 7 is above it"))
        assert error is not None
        body = error.body()["error"]
        assert (error.status, body["code"], body["field"]) == (400, "limit_exceeded", field)
        assert rule in body["message"]
        assert f"{cap} is {value} in the namespace's SLOLimits `default`" in body["message"]
        assert "chat-cr" not in body["message"]
        assert body["causes"] == [{"field": field, "message": body["message"], "limit": cap}]
    # Another policy's denial is not a limit.
    assert refusal("ValidatingAdmissionPolicy 'x' with binding 'y' denied request: no") is None


async def test_a_route_shows_the_caps_that_apply_to_its_kind_and_what_is_beyond_them(
    start: Started,
) -> None:
    kube = FakeKube(
        {
            "llmslorequirements": [
                llm_cr(
                    "chat",
                    priority=7,
                    maximumDeployment={"type": "replica", "value": 4},
                    ttft={
                        "default": {"metrics": [{"type": "p90", "threshold": 0.5}]},
                        "ranges": [
                            {
                                "contextLengthRangeLow": 0,
                                "metrics": [{"type": "p90", "threshold": 0.1}],
                            }
                        ],
                    },
                )
            ],
            "jobslorequirements": [job_cr("render", queue={"maxDepth": 5, "promql": "up"})],
            "slolimits": [limits_cr(**ALL_CAPS), limits_cr(name="other", maxPriority=0)],
        }
    )
    async with start(kube) as (client, app):
        await until(lambda: app.state.runtime.limits.capped(), "limits read")
        llm = (await client.get("/routes/chat", headers=AUTH)).json()
        assert llm["limits"] == {k: v for k, v in ALL_CAPS.items() if k != "minQueueDepth"}
        assert llm["overLimits"] == ["priority", "ttft"]
        # Each value beyond, with the bound its key keeps: the page reads it, not the rule.
        assert llm["overLimitBounds"] == [
            {"limit": "maxPriority", "field": "priority", "bound": 7},
            {
                "limit": "minTTFTSeconds",
                "field": "ttft",
                "bound": 0.1,
                "contextLengthRangeLow": 0,
                "type": "p90",
            },
        ]
        job = (await client.get("/routes/render", headers=AUTH)).json()
        assert job["limits"] == {"maxPriority": 5, "maxReplicas": 8, "minQueueDepth": 100}
        assert job["overLimits"] == ["queue.maxDepth"]
        assert job["overLimitBounds"] == [
            {"limit": "minQueueDepth", "field": "queue.maxDepth", "bound": 5}
        ]
        full = (await client.get("/config", params={"view": "full"}, headers=AUTH)).json()
        assert {i["route"]: i.get("overLimits") for i in full["items"]} == {
            "chat": ["priority", "ttft"],
            "render": ["queue.maxDepth"],
        }
        metrics = (await client.get("/metrics")).text
        assert "slo_api_routes_over_limits 2.0" in metrics
        # A body read and sent back whole is accepted: the read-only parts are ignored.
        echoed = await client.put("/routes/render", json={**job, "priority": 1}, headers=AUTH)
        assert echoed.status_code == 200, echoed.text
        assert kube.patches[-1][1]["spec"] == {"priority": 1}


async def test_limits_follow_their_parameters_and_exempt_namespaces(start: Started) -> None:
    kube = FakeKube(
        {
            "llmslorequirements": [llm_cr("chat", priority=7)],
            "namespaces": [namespace_obj("ns", exempt=False)],
        }
    )
    async with start(kube) as (client, app):

        async def full_limits() -> Any:
            page = (await client.get("/config", params={"view": "full"}, headers=AUTH)).json()
            return page["items"][0].get("limits")

        # No parameters: no cap, nothing shown.
        body = (await client.get("/routes/chat", headers=AUTH)).json()
        assert "limits" not in body
        assert "overLimits" not in body
        assert await full_limits() is None
        limits = app.state.runtime.limits
        kube.push("slolimits", {"type": "ADDED", "object": limits_cr(maxPriority=5)})
        await until(lambda: limits.capped() == {"ns"}, "the limits read")
        assert await full_limits() == {"maxPriority": 5}
        assert "slo_api_routes_over_limits 1.0" in (await client.get("/metrics")).text
        kube.push("namespaces", {"type": "MODIFIED", "object": namespace_obj("ns", True)})
        await until(lambda: not limits.capped(), "the namespace exempt")
        assert await full_limits() is None
        assert "limits" not in (await client.get("/routes/chat", headers=AUTH)).json()
        assert "slo_api_routes_over_limits 0.0" in (await client.get("/metrics")).text


async def test_a_cluster_without_the_slolimits_crd_caps_nothing(start: Started) -> None:
    kube = FakeKube({"llmslorequirements": [llm_cr("chat", priority=7)]})
    kube.missing.add("slolimits")
    async with start(kube) as (client, _):
        body = (await client.get("/routes/chat", headers=AUTH)).json()
        assert "limits" not in body


async def test_a_write_the_guardrails_refuse_is_limit_exceeded_and_a_dry_run_too(
    start: Started,
) -> None:
    message = DENIAL.format(
        prefix="maxPriority", value="5", rest="spec.priority 7 is above it"
    ).replace("chat-cr", "chat")

    def refuse(method: str, *args: Any) -> None:
        if method == "patch":
            cause = {"message": message.split(" is forbidden: ", 1)[1]}
            raise KubeError(422, "Invalid", message, causes=[cause], is_status=True)

    kube = FakeKube({"llmslorequirements": [llm_cr("chat")]}, error_callback=refuse)
    async with start(kube) as (client, _):
        for params in ({}, {"dryRun": "true"}):
            response = await client.put(
                "/routes/chat", json={"priority": 7}, params=params, headers=AUTH
            )
            assert response.status_code == 400
            error = response.json()["error"]
            assert (error["code"], error["field"]) == ("limit_exceeded", "priority")
            assert error["message"].startswith("may be at most 5")
            assert '"chat"' not in response.text
            assert "ns" not in error["message"].split()


async def test_the_store_keeps_only_each_namespaces_default_and_follows_relists() -> None:
    limits = Limits()
    heard: list[set[str]] = []
    limits.subscribe(heard.append)
    listed = [
        limits.entry("slolimits", limits_cr("a", maxPriority=5, unknown=1)),
        limits.entry("slolimits", limits_cr("b", name="team", maxPriority=1)),
        limits.entry("slolimits", limits_cr("c", minQueueDepth=9)),
    ]
    await limits.replace_in_turns("slolimits", listed)
    assert (limits.in_effect("job", "a"), limits.in_effect("job", "b")) == ({"maxPriority": 5}, {})
    assert heard == [{"a", "c"}]
    # A relist of one watched namespace leaves the others alone.
    await limits.replace_in_turns("slolimits", [], namespace="a")
    assert limits.capped() == {"c"}
    limits.delete("slolimits", limits_cr("c"))
    assert limits.capped() == set()
    limits.upsert("slolimits", limits_cr("d", maxPriority=2))
    # The CRD gone: every namespace's limits go with it.
    limits.clear("slolimits")
    assert limits.capped() == set()
    # Exempt namespaces: the label's informer lists only those; a DELETED one is no longer.
    limits.upsert("slolimits", limits_cr("e", maxPriority=2))
    limits.upsert("namespaces", namespace_obj("e", exempt=True))
    assert limits.exempt("e")
    assert limits.in_effect("llm", "e") == {}
    limits.delete("namespaces", namespace_obj("e", exempt=True))
    assert limits.in_effect("llm", "e") == {"maxPriority": 2}


@pytest.mark.parametrize("odd", ["¹²", "\u0661\u0662", "a1b2", "012"])
async def test_limits_whose_versions_do_not_compare_take_effect_as_they_arrive(odd: str) -> None:
    limits = Limits()
    limits.reached("slolimits", "", None, "20")
    limits.upsert(
        "slolimits",
        {
            **limits_cr(maxPriority=5),
            "metadata": {"namespace": "ns", "name": "default", "resourceVersion": "20"},
        },
    )
    changed = limits_cr(maxPriority=3)
    changed["metadata"]["resourceVersion"] = odd
    limits.reached("slolimits", "", None, odd)
    limits.upsert("slolimits", changed)
    assert limits.in_effect("job", "ns") == {"maxPriority": 3}
    listed = [
        limits.entry("slolimits", changed),
        limits.entry("slolimits", limits_cr("b", maxPriority=1)),
    ]
    await limits.replace_in_turns("slolimits", listed)
    assert limits.capped() == {"ns", "b"}
    limits.delete("slolimits", changed)
    assert limits.capped() == {"b"}


def _llm_spec(ttft: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"spec": {"ttft": ttft, **spec}}


def _metrics(**values: float) -> list[dict[str, Any]]:
    return [{"type": t, "threshold": v} for t, v in values.items()]


def test_over_limits_holds_each_value_to_the_cap_unless_its_own_stored_value_is_beyond() -> None:
    caps = {"minTTFTSeconds": 0.2}
    old = _llm_spec(
        {
            "default": {"metrics": _metrics(p90=0.05, p99=0.5)},
            "ranges": [{"contextLengthRangeLow": 0, "metrics": _metrics(p90=0.5)}],
        }
    )
    stays = old["spec"]["ttft"]
    cases = {
        "stays": (stays, []),
        "moves toward the cap": ({"default": {"metrics": _metrics(p90=0.1, p99=0.5)}}, []),
        "spreads to another metric": (
            {"default": {"metrics": _metrics(p90=0.05, p99=0.05)}},
            ["ttft"],
        ),
        "swapped": ({"default": {"metrics": _metrics(p90=0.5, p99=0.05)}}, ["ttft"]),
        "spreads to a range": (
            {
                "default": {"metrics": _metrics(p90=0.05)},
                "ranges": [{"contextLengthRangeLow": 0, "metrics": _metrics(p90=0.05)}],
            },
            ["ttft"],
        ),
        "moves away": ({"default": {"metrics": _metrics(p90=0.01)}}, ["ttft"]),
    }
    for what, (ttft, over) in cases.items():
        assert Limits.over(_llm_spec(ttft), caps, old) == over, what
    # Stored (no old object, as on a create): beyond is beyond.
    assert Limits.over(old, caps) == ["ttft"]


def test_pdengines_are_capped_by_max_replicas_while_max_pdengines_is_unset() -> None:
    limits = Limits()
    limits.upsert("slolimits", limits_cr(maxReplicas=8))
    assert limits.in_effect("llm", "ns") == {"maxReplicas": 8, "maxPDEngines": 8}
    assert limits.in_effect("job", "ns") == {"maxReplicas": 8}
    pd = {"spec": {"maximumDeployment": {"type": "pdengine", "value": 9}}}
    assert Limits.over(pd, limits.in_effect("llm", "ns")) == ["maximumDeployment.value"]
    error = refusal(
        DENIAL.format(
            prefix="maxPDEngines is unset, so maxReplicas caps pdengines too: maxReplicas",
            value="8",
            rest="spec.maximumDeployment.value 9 pdengines is above it",
        )
    )
    assert error is not None
    body = error.body()["error"]
    assert "a pdengine maximumDeployment.value may be at most 8" in body["message"]
    assert body["causes"][0]["limit"] == "maxReplicas"
