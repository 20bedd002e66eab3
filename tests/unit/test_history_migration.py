"""Carrying the route history of earlier versions (one ConfigMap per CR) over into revisions:
only what the old version could have written, one bad entry never blocking the rest, and a
placeholder replaced by the caller a ConfigMap names without ever losing the change."""

from __future__ import annotations

import logging
import re
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slo_api.history import History, writer
from slo_api.history.changes import VALUE_CAP
from slo_api.history.legacy import LEGACY_LABEL, _decimal, _not_after
from slo_api.history.revisions import REVISIONS, order
from slo_api.kube import KubeError
from slo_api.service import Target
from tests.unit import vtime
from tests.unit.conftest import AUTH, Started, llm_cr
from tests.unit.fakes import FakeKube, fail
from tests.unit.test_history import GRACE, GROUP, LLM, NAME, PLURAL, _by, _revisions

# The fake's RouteRevision CRD is created at FakeKube.CRD_CREATED (2026-06-01).
BEFORE_CRD = "2026-05-01T00:00:00Z"
AFTER_CRD = "2026-07-01T00:00:00Z"
UID = "uid-cr-1"


def _old(n: int, **extra: Any) -> dict[str, Any]:
    """An entry as the earlier version wrote it."""
    return {
        "id": str(n),
        "time": "2025-12-01T00:00:00Z",
        "actor": "bob",
        "via": "slo-api",
        "requestId": f"r{n}",
        "changes": [{"field": "priority", "from": n - 1, "to": n}],
        "after": {"route": "a", "kind": "llm", "priority": n},
        **extra,
    }


def _config_map(
    entries: list[Any],
    *,
    name: str = "slo-history.llm.cr-1",
    uid: str = UID,
    created: str | None = BEFORE_CRD,
    kind: str = "llm",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "resourceVersion": "7",
        "labels": {LEGACY_LABEL: kind},
        "ownerReferences": [
            {
                "apiVersion": "inference.modelsphere.dev/v1alpha1",
                "kind": "LLMSLORequirement",
                "name": "cr-1",
                "uid": uid,
            }
        ],
    }
    if created is not None:
        meta["creationTimestamp"] = created
    return {"metadata": meta, "data": {"entries": orjson.dumps(entries).decode()}}


def _held(kube: FakeKube, cm: dict[str, Any]) -> None:
    kube.config_maps[("ns", cm["metadata"]["name"])] = cm


def _ids(history: dict[str, Any]) -> list[str]:
    return [e["id"] for e in history["items"]]


async def test_one_bad_legacy_entry_never_blocks_the_rest_nor_answers_500(
    start: Started, caplog: pytest.LogCaptureFixture
) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a", priority=2)]})  # resourceVersion 101
    huge = "x" * (VALUE_CAP + 1)
    entries: list[Any] = [
        _old(1),
        {**_old(2), "id": "¹"},  # a digit, not a decimal: never reaches int()
        {**_old(3), "id": "٣"},  # a decimal, not ASCII: no revision name
        {**_old(4), "id": "0004"},  # not as a resourceVersion is written
        {**_old(5), "note": "not a key the old version wrote"},
        {**_old(6), "id": "600"},  # after the CR's current resourceVersion
        {**_old(7), "id": 7},  # not a string
        "not an entry",
        {**_old(8), "changes": [{"field": "ttft", "from": None, "to": huge}]},
        {**_old(9), "changes": [{"field": "spec.replicas", "from": 1, "to": 9}]},
        _old(10),
    ]
    _held(kube, _config_map(entries))
    # Every carry fails at first: reads show the ConfigMap's entries meanwhile.
    kube.error_callback = fail(KubeError(503, "down"), "create", times=None)
    caplog.set_level(logging.WARNING, "slo_api.history")
    async with start(kube) as (client, app):
        during = await client.get("/routes/a/history", headers=AUTH)
        assert during.status_code == 200, during.text
        assert _ids(during.json()) == ["10", "8", "1"]
        assert all(e["migrated"] for e in during.json()["items"])
        kube.error_callback = None
        history = app.state.runtime.history
        await history.migrate()
        # The migration finished: reads no longer list ConfigMaps.
        listed: list[str] = []
        kube.error_callback = lambda method, *args: listed.append(method)
        after = (await client.get("/routes/a/history", headers=AUTH)).json()
        assert "list_config_maps" not in listed
        assert _ids(after) == ["10", "8", "1"]
        assert [e["migrated"] for e in after["items"]] == [True, True, True]
        (eight,) = [e for e in after["items"] if e["id"] == "8"]
        assert eight["changes"][0]["to"]["size"] == VALUE_CAP + 3  # kept as its digest
        assert [e["id"] for e in _revisions(kube, UID)] == ["1", "8", "10"]
    # Each entry left out is logged, with why.
    skipped = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(skipped) == 8, skipped
    assert any("'¹'" in m for m in skipped)


async def test_a_new_entry_says_it_was_not_migrated(start: Started) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a", priority=2)]})
    async with start(kube) as (client, _):
        assert (await client.put("/routes/a", json={"priority": 3}, headers=AUTH)).is_success
        (entry,) = (await client.get("/routes/a/history", headers=AUTH)).json()["items"]
        assert entry["migrated"] is False


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param({"created": AFTER_CRD}, id="made-after-the-revision-crd"),
        pytest.param({"created": FakeKube.CRD_CREATED}, id="made-in-the-crd-s-second"),
        pytest.param({"created": None}, id="no-creation-time"),
        pytest.param({"name": "slo-history.llm.other"}, id="another-cr-s-name"),
        pytest.param({"uid": "uid-someone-else"}, id="owned-by-another-uid"),
        pytest.param({"kind": "job"}, id="labelled-another-kind"),
    ],
)
async def test_a_config_map_the_old_version_did_not_write_is_left_alone(
    start: Started, caplog: pytest.LogCaptureFixture, forged: dict[str, Any]
) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a", priority=2)]})
    cm = _config_map([_old(90, actor="mallory")], **forged)
    _held(kube, cm)
    caplog.set_level(logging.WARNING, "slo_api.history")
    async with start(kube) as (client, app):
        history = app.state.runtime.history
        assert (await client.get("/routes/a/history", headers=AUTH)).json()["items"] == []
        assert await history.migrate() == 0
        assert await history.migrate() == 0
        assert _revisions(kube, UID) == []
        # Left as it is, for whoever made it to look at, and said once.
        assert kube.config_maps == {("ns", cm["metadata"]["name"]): cm}
        notes = [r for r in caplog.records if cm["metadata"]["name"] in r.getMessage()]
        assert len(notes) == 1, [r.getMessage() for r in notes]


async def test_a_forged_config_map_prunes_no_real_revision(start: Started) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a", priority=0)]})
    async with start(kube, route_history_entries=3) as (client, app):
        for n in (1, 2, 3):
            assert (await client.put("/routes/a", json={"priority": n}, headers=AUTH)).is_success
        real = _ids((await client.get("/routes/a/history", headers=AUTH)).json())
        forged = [_old(n, actor="mallory") for n in (900, 901, 902)]
        _held(kube, _config_map(forged, created=AFTER_CRD))
        assert _ids((await client.get("/routes/a/history", headers=AUTH)).json()) == real
        await app.state.runtime.history.migrate()
        assert _ids((await client.get("/routes/a/history", headers=AUTH)).json()) == real


async def test_without_the_revision_crd_s_age_nothing_is_carried(start: Started) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a", priority=2)]})
    _held(kube, _config_map([_old(1)]))
    kube.crds.clear()  # may not read it (or gone): the ConfigMap's age proves nothing
    async with start(kube) as (client, app):
        assert (await client.get("/routes/a/history", headers=AUTH)).json()["items"] == []
        assert await app.state.runtime.history.migrate() == 0
        assert len(kube.config_maps) == 1


def test_a_placeholder_is_replaced_by_the_caller_a_config_map_names() -> None:
    async def scenario() -> None:
        # An old pod made the write during the rollout: this replica saw its change, waited
        # out its grace and left a placeholder; the old pod's ConfigMap names the caller.
        kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a", priority=1)]})
        replica = History(kube, [LLM], 20, grace=GRACE)  # type: ignore[arg-type]
        base = kube.objects[(PLURAL, "ns", "cr-1")]
        replica.observe(PLURAL, GROUP, NAME, base)
        changed = await kube.patch(LLM.resource, "ns", "cr-1", {"spec": {"priority": 2}})
        replica.observe(PLURAL, GROUP, NAME, changed)
        await replica.close()
        rv = changed["metadata"]["resourceVersion"]
        assert [(e["id"], _by(e)) for e in _revisions(kube, UID)] == [
            (rv, ("unknown", "slo-api", None, None))
        ]
        entry = {**_old(int(rv)), "actor": "alice", "requestId": "req-alice"}
        _held(kube, _config_map([entry]))
        assert await replica.migrate() == 1
        (carried,) = _revisions(kube, UID)
        assert (carried["id"], carried["actor"], carried["requestId"]) == (
            rv,
            "alice",
            "req-alice",
        )
        assert carried["migrated"] is True
        # What the watch saw stays: the change itself is not the ConfigMap's word.
        assert carried["changes"] == [{"field": "priority", "from": 1, "to": 2}]

    vtime.run(scenario())


def test_replacing_a_placeholder_loses_nothing_when_the_create_after_the_delete_fails() -> None:
    async def scenario() -> None:
        kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a", priority=1)]})
        slow, other = (History(kube, [LLM], 20, grace=GRACE) for _ in range(2))  # type: ignore[arg-type]
        base = kube.objects[(PLURAL, "ns", "cr-1")]
        for replica in (slow, other):
            replica.observe(PLURAL, GROUP, NAME, base)
        kube.watch_writes = False
        changed = await kube.patch(LLM.resource, "ns", "cr-1", {"spec": {"priority": 2}})
        other.observe(PLURAL, GROUP, NAME, changed)
        await other.close()  # its grace is over: a placeholder holds the change's name
        real = f"{UID}.{changed['metadata']['resourceVersion']}"
        assert (REVISIONS.plural, "ns", real) in kube.objects
        deleted: list[str] = []

        def crash(method: str, *args: Any) -> None:
            if method == "delete" and args[0] == REVISIONS:
                deleted.append(args[2])
            # Every create under the real name once the placeholder is gone fails for good.
            if method == "create" and args[2]["metadata"]["name"] == real and deleted:
                raise KubeError(422, "Invalid", "the process died here", is_status=True)

        kube.error_callback = crash
        token = writer.set(("alice", "own-1", None))
        slow.wrote(changed)
        writer.reset(token)
        slow.observe(PLURAL, GROUP, NAME, changed)
        await slow.close()
        assert real in deleted
        kube.error_callback = None
        # The change and its caller are still there to read.
        (entry,) = await slow.read(Target.of("a", LLM, changed))
        assert _by(entry) == ("alice", "slo-api", "own-1", None)
        assert entry["changes"] == [{"field": "priority", "from": 1, "to": 2}]

    vtime.run(scenario())


def test_a_placeholder_that_takes_the_name_again_is_replaced_too() -> None:
    async def scenario() -> None:
        kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a", priority=1)]})
        slow, other = (History(kube, [LLM], 20, grace=GRACE) for _ in range(2))  # type: ignore[arg-type]
        base = kube.objects[(PLURAL, "ns", "cr-1")]
        for replica in (slow, other):
            replica.observe(PLURAL, GROUP, NAME, base)
        kube.watch_writes = False
        changed = await kube.patch(LLM.resource, "ns", "cr-1", {"spec": {"priority": 2}})
        other.observe(PLURAL, GROUP, NAME, changed)
        await other.close()
        real = f"{UID}.{changed['metadata']['resourceVersion']}"
        placeholder = kube.objects[(REVISIONS.plural, "ns", real)]
        deleted: list[str] = []

        def late_placeholder(method: str, *args: Any) -> None:
            if method == "delete" and args[0] == REVISIONS and args[2] == real:
                deleted.append(real)
            # A third replica's grace ends between the delete and the create: its
            # placeholder takes the name again, once.
            if method == "create" and args[2]["metadata"]["name"] == real and len(deleted) == 1:
                again = {**placeholder, "metadata": {**placeholder["metadata"], "uid": "late"}}
                kube.objects[(REVISIONS.plural, "ns", real)] = again

        kube.error_callback = late_placeholder
        token = writer.set(("alice", "own-1", None))
        slow.wrote(changed)
        writer.reset(token)
        slow.observe(PLURAL, GROUP, NAME, changed)
        await slow.close()
        assert len(deleted) == 2
        # The caller under the change's own name, and no copy left beside it.
        names = [n for (p, _, n) in kube.objects if p == REVISIONS.plural]
        assert names == [real]
        (entry,) = _revisions(kube, UID)
        assert _by(entry) == ("alice", "slo-api", "own-1", None)

    vtime.run(scenario())


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=30), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_ids_are_compared_as_the_numbers_they_write_and_no_text_reaches_int(
    text: str, a: int, b: int
) -> None:
    # Anything at all: an order, never an exception (the read that sorts answers 200).
    assert sorted([order({"id": text}), order({"id": "7"})]) is not None
    # Decimal versions by their digits, whatever the clocks their times came from say.
    newer = {"id": str(max(a, b) + 1), "time": "2026-01-01T00:00:00Z"}
    older = {"id": str(max(a, b)), "time": "2026-01-01T00:00:01Z"}
    assert order(older) < order(newer)
    accepted = _decimal(text)
    assert accepted is None or (re.fullmatch(r"0|[1-9][0-9]{0,19}", text) and accepted == text)
    # resourceVersions as etcd writes them: compared without int(), as int() would.
    assert _decimal(str(a)) == str(a)
    assert _not_after(str(a), str(b)) == (a <= b)
