"""Scope: WATCH_NAMESPACES watches each kind per namespace; WATCH_LABEL_SELECTOR narrows it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from slo_api.kube import Resource
from slo_api.settings import Settings
from tests.unit.conftest import Started
from tests.unit.fakes import FakeKube
from tests.unit.test_groups import NEW, OLD, GroupsKube, cr, deleted, make_watch, until

Obj = dict[str, Any]


def in_ns(obj: Obj, namespace: str) -> Obj:
    obj["metadata"]["namespace"] = namespace
    obj["metadata"]["uid"] += f"-{namespace}"
    return obj


class ScopedKube(GroupsKube):
    """Lists only the namespace asked for, and records what each list and watch asked."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[str, str, str | None, str]] = []

    async def list(self, res: Resource, **kwargs: Any) -> Obj:
        namespace, selector = kwargs.get("namespace"), kwargs.get("label_selector", "")
        self.asked.append(("list", res.group, namespace, selector))
        page = await super().list(res)
        page["items"] = [
            o for o in page["items"] if namespace is None or o["metadata"]["namespace"] == namespace
        ]
        return page


def names(watch: Any) -> set[tuple[str, str]]:
    return {
        (o["metadata"]["namespace"], o["metadata"]["name"])
        for o in watch.index.objects("llmslorequirements")
    }


# -- settings --------------------------------------------------------------------------------


def test_no_namespaces_means_every_namespace() -> None:
    assert Settings(slo_api_token="x" * 16).watch_namespaces == ()
    assert Settings(slo_api_token="x" * 16, watch_namespaces=" ").watch_namespaces == ()
    settings = Settings(slo_api_token="x" * 16, watch_namespaces=" team-a , team-b")
    assert settings.watch_namespaces == ("team-a", "team-b")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("team-a,,team-b", "has an empty namespace"),
        ("team-a,", "has an empty namespace"),
        ("team-a,team-a", "lists team-a more than once"),
        ("Team-A", "is not a namespace name"),
        ("team_a", "is not a namespace name"),
        ("a" * 64, "is not a namespace name"),
    ],
)
def test_bad_namespace_lists_are_refused_with_the_reason(value: str, says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(slo_api_token="x" * 16, watch_namespaces=value)
    assert says in str(caught.value)


@pytest.mark.parametrize(
    "selector",
    [
        "tier=prod",
        "tier==prod,team!=ml",
        "!legacy",
        "managed",
        "example.com/tier in (prod, staging)",
        "tier notin (dev),app.kubernetes.io/name=chat",
        "generation>3",
        "tier=",
    ],
)
def test_label_selectors_the_api_server_accepts_are_accepted(selector: str) -> None:
    assert Settings(slo_api_token="x" * 16, watch_label_selector=selector).watch_label_selector


@pytest.mark.parametrize(
    "selector", ["tier=prod,", "tier prod", "=prod", "tier in ()", "tier in (a", "tier=a b"]
)
def test_bad_label_selectors_are_refused(selector: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(slo_api_token="x" * 16, watch_label_selector=selector)
    assert "is not a label selector requirement" in str(caught.value)


def test_the_process_exits_2_naming_a_bad_scope_setting() -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SLO_API_")},
        "SLO_API_TOKEN": "x",
        "WATCH_NAMESPACES": "team-a,,team-b",
    }
    result = subprocess.run(
        [sys.executable, "-m", "slo_api"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "WATCH_NAMESPACES" in result.stderr
    assert "has an empty namespace" in result.stderr


# -- watching per namespace ------------------------------------------------------------------


async def test_each_served_group_is_watched_in_each_listed_namespace() -> None:
    kube = ScopedKube()
    kube.serve(NEW, in_ns(cr(NEW, "a"), "team-a"), in_ns(cr(NEW, "b"), "team-b"))
    kube.serve(OLD, in_ns(cr(OLD, "c"), "team-a"), in_ns(cr(OLD, "other"), "elsewhere"))
    watch = make_watch(kube)
    watch.namespaces = ("team-a", "team-b")
    watch.label_selector = "tier=prod"
    await watch.discover()
    try:
        await until(lambda: watch.synced, "synced")
        assert sorted(k for k in watch.informers) == [
            (NEW, "team-a"),
            (NEW, "team-b"),
            (OLD, "team-a"),
            (OLD, "team-b"),
        ]
        assert sorted(kube.asked) == [
            ("list", NEW, "team-a", "tier=prod"),
            ("list", NEW, "team-b", "tier=prod"),
            ("list", OLD, "team-a", "tier=prod"),
            ("list", OLD, "team-b", "tier=prod"),
        ]
        assert names(watch) == {("team-a", "a"), ("team-b", "b"), ("team-a", "c")}
        assert watch.state().watched == (NEW, OLD)

        # A relist in one namespace leaves the other namespaces' CRs alone.
        kube.objects[NEW] = [in_ns(cr(NEW, "b", rv=2), "team-b")]
        await watch.informers[(NEW, "team-a")]._list()
        assert names(watch) == {("team-a", "c"), ("team-b", "b")}

        # A group going away takes its CRs in every namespace.
        kube.unserve(NEW)
        await deleted(watch, NEW)
        await watch.discover()
        assert sorted(watch.informers) == [(OLD, "team-a"), (OLD, "team-b")]
        assert names(watch) == {("team-a", "c")}
    finally:
        await watch._stop(watch.kind.groups)


async def test_without_namespaces_each_group_is_watched_cluster_wide() -> None:
    kube = ScopedKube()
    kube.serve(NEW, in_ns(cr(NEW, "a"), "team-a"), in_ns(cr(NEW, "b"), "team-b"))
    watch = make_watch(kube)
    await watch.discover()
    try:
        await until(lambda: watch.synced, "synced")
        assert kube.asked == [("list", NEW, None, "")]
        assert names(watch) == {("team-a", "a"), ("team-b", "b")}
    finally:
        await watch._stop(watch.kind.groups)


# -- /readyz says what is watched ------------------------------------------------------------


async def test_readyz_says_what_is_watched(start: Started) -> None:
    async with start(FakeKube()) as (client, _):
        await until_ready(client)
        assert (await client.get("/readyz")).json()["scope"] == {
            "namespaces": None,
            "labelSelector": None,
        }
    async with start(
        FakeKube(), watch_namespaces="team-a,team-b", watch_label_selector="tier=prod"
    ) as (client, _):
        await until_ready(client)
        assert (await client.get("/readyz")).json()["scope"] == {
            "namespaces": ["team-a", "team-b"],
            "labelSelector": "tier=prod",
        }


async def until_ready(client: Any) -> None:
    for _ in range(500):
        if (await client.get("/readyz")).status_code == 200:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never ready")
