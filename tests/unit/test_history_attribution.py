"""Who a route's history names, across relists, restarts and replicas: a relist's gap is pinned
on nobody who did not make all of it, ownership memory never goes back, a read waits only for
this replica's own writes, a re-created CR leaves nothing of the old one behind."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
import pytest

from slo_api.history import History, writer
from slo_api.history.revisions import (
    REVISIONS,
    UID_LABEL,
    across_relist,
    order,
    revision_name,
)
from slo_api.index import CRIndex
from slo_api.kube import KubeError
from slo_api.ownership import ARGOCD_TRACKING_ANNOTATION
from slo_api.recovery import Recovery
from slo_api.service import Service, Target
from tests.unit import vtime
from tests.unit.conftest import until
from tests.unit.fakes import FakeKube, fail
from tests.unit.test_history import (
    CREATED,
    GRACE,
    GROUP,
    LLM,
    NAME,
    PLURAL,
    _by,
    _managed,
    _replica,
    _revisions,
    _settle,
    _state,
)

TTFT = {"default": {"metrics": [{"type": "p90", "threshold": 0.5}]}}
PATCHED = ("kubectl-patch", "2026-01-02T00:00:00Z", ["priority"])
MINE = ("slo-api", "2026-01-03T00:00:00Z", ["ttft"])
ARGO = ("argocd-controller", "2026-01-01T00:00:00Z", ["priority"])


def _write(replica: History, answer: dict[str, Any], before: dict[str, Any]) -> None:
    """`replica` made a write (conditional on `before`) that the API server answered."""
    token = writer.set(("alice", "own-1", None))
    replica.wrote(answer, before, LLM)
    writer.reset(token)


def _argo(rv: int, managed: list[dict[str, Any]], uid: str = "u1", **spec: Any) -> dict[str, Any]:
    obj = _state(rv, managed, uid=uid, **spec)
    obj["metadata"]["annotations"] = {ARGOCD_TRACKING_ANNOTATION: "app:group/Kind:ns/cr-1"}
    return obj


def _across(kube: FakeKube, uid: str = "u1") -> dict[str, bool]:
    """Each stored revision's id, and whether it says it was made across a relist's gap."""
    return {
        str(orjson.loads(o["data"])["id"]): across_relist(o)
        for (plural, _, _), o in kube.objects.items()
        if plural == REVISIONS.plural and o["metadata"]["labels"][UID_LABEL] == uid
    }


def _steps() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A CR created (10), kubectl's priority change (11), and a write through slo-api made on
    that (12: ttft)."""
    return (
        _state(10, _managed(CREATED), priority=1),
        _state(11, _managed(CREATED, PATCHED), priority=5),
        _state(12, _managed(CREATED, PATCHED, MINE), priority=5, ttft=TTFT),
    )


def _watching(replica: History, first: dict[str, Any]) -> CRIndex:
    """An index whose changes `replica` observes, holding `first`."""
    index = Service.index_for([LLM])
    index.on_observed(replica.observe)
    index.upsert(PLURAL, first)
    return index


def test_a_relist_gap_ending_at_a_write_is_split_at_the_state_the_write_was_made_on() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        replica = _replica(kube)
        base, edited, written = _steps()
        index = _watching(replica, base)
        # The watch breaks; kubectl changes priority, then this replica's write (conditional
        # on that fresh state) sets ttft; the relist shows only the write's version.
        _write(replica, written, edited)
        index.replace(PLURAL, [index.entry(PLURAL, written)], GROUP)
        await _settle(replica)
        before, mine = _revisions(kube)
        # Alice set ttft on version 11: that change is hers, made from consecutive states (the
        # write was conditional on 11). What came before it, across the gap, is nobody's.
        assert (mine["id"], _by(mine)) == ("12", ("alice", "slo-api", "own-1", None))
        assert mine["changes"] == [{"field": "ttft", "from": None, "to": TTFT}]
        assert (before["id"], _by(before)[0]) == ("11", "unknown")
        assert before["changes"] == [{"field": "priority", "from": 1, "to": 5}]
        assert (before["after"]["priority"], before["after"].get("ttft")) == (5, None)
        assert _across(kube) == {"11": True, "12": False}

    vtime.run(scenario())


def test_a_write_a_relist_skipped_to_is_the_caller_s_though_another_replica_saw_each_step() -> None:
    """The API server restarts: the writer's relist skips from 10 to its write (12, made on
    kubectl's 11), another replica sees 11 and 12 and cannot tell whose 12 is."""

    async def scenario() -> None:
        kube = FakeKube()
        relisting, watching = _replica(kube), _replica(kube)
        steps = _steps()
        index = _watching(relisting, steps[0])
        _write(relisting, steps[2], steps[1])
        index.replace(PLURAL, [index.entry(PLURAL, steps[2])], GROUP)
        for state in steps:
            watching.observe(PLURAL, GROUP, NAME, state)
        await _settle(relisting, watching)
        entries = _revisions(kube)
        assert [(e["id"], _by(e)[:2]) for e in entries] == [
            ("11", ("kubectl-patch", "kubectl-patch")),
            ("12", ("alice", "slo-api")),
        ]
        assert [c["field"] for c in entries[1]["changes"]] == ["ttft"]
        assert _across(kube) == {"11": False, "12": False}

    vtime.run(scenario())


def _change_then_status() -> list[dict[str, Any]]:
    """A CR created (10), kubectl's priority change (11), then a status update (12): the
    version a relist across both shows is the status update's, not the change's."""
    steps = [_state(10, _managed(CREATED), priority=1)]
    steps.append(_state(11, _managed(CREATED, PATCHED), priority=5))
    status = _state(12, _managed(CREATED, PATCHED), priority=5)
    status["metadata"]["generation"] = 11  # a status update: the spec's generation stays
    status["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    steps.append(status)
    return steps


@pytest.mark.parametrize("relisted_first", [False, True])
def test_a_change_a_relist_folds_after_another_replica_saw_it_is_read_once(
    relisted_first: bool,
) -> None:
    """One replica's watch breaks across kubectl's change and a status update after it; the
    other sees each step and records the change at its version (11). The relist's revision
    is named for the version it shows (12), and repeats that change: a read shows it once,
    whichever replica stored first, and its replica's prune deletes it once the other's is in."""

    async def scenario() -> None:
        kube = FakeKube()
        relisting, watching = _replica(kube), _replica(kube)
        steps = _change_then_status()
        index = _watching(relisting, steps[0])
        for state in steps:
            watching.observe(PLURAL, GROUP, NAME, state)
        if relisted_first:
            index.replace(PLURAL, [index.entry(PLURAL, steps[2])], GROUP)
            await _settle(relisting)
            await _settle(watching)
        else:
            await _settle(watching)
            index.replace(PLURAL, [index.entry(PLURAL, steps[2])], GROUP)
            await _settle(relisting)
            assert _across(kube) == {"11": False}  # deleted by its own replica's prune
        for replica in (relisting, watching):
            read = await replica.read(Target.of("a", LLM, steps[2]))
            assert [(e["id"], _by(e)[0], e["changes"]) for e in read] == [
                ("11", "kubectl-patch", [{"field": "priority", "from": 1, "to": 5}])
            ]

    vtime.run(scenario())


def test_a_relist_that_folds_a_change_nobody_recorded_is_read() -> None:
    """The same relist with no replica that saw the steps: the revision made across the gap
    is the only record of the change, and is read."""

    async def scenario() -> None:
        kube = FakeKube()
        relisting = _replica(kube)
        steps = _change_then_status()
        index = _watching(relisting, steps[0])
        index.replace(PLURAL, [index.entry(PLURAL, steps[2])], GROUP)
        await _settle(relisting)
        read = await relisting.read(Target.of("a", LLM, steps[2]))
        assert [(e["id"], e["changes"]) for e in read] == [
            ("12", [{"field": "priority", "from": 1, "to": 5}])
        ]
        assert _across(kube) == {"12": True}

    vtime.run(scenario())


def test_a_relist_to_a_write_before_its_answer_is_split_once_the_answer_comes() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        replica = _replica(kube)
        base, edited, written = _steps()
        index = _watching(replica, base)
        # The relist brings the write's version while its answer is still on its way.
        index.replace(PLURAL, [index.entry(PLURAL, written)], GROUP)
        await asyncio.sleep(GRACE / 2)
        _write(replica, written, edited)
        await _settle(replica)
        assert [
            (e["id"], _by(e)[0], [c["field"] for c in e["changes"]]) for e in _revisions(kube)
        ] == [
            ("11", "unknown", ["priority"]),
            ("12", "alice", ["ttft"]),
        ]

    vtime.run(scenario())


def test_a_relist_gap_that_is_exactly_the_write_stays_the_caller_s() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        index = Service.index_for([LLM])
        replica = _replica(kube)
        index.on_observed(replica.observe)
        base = _state(10, _managed(CREATED), priority=1)
        index.upsert(PLURAL, base)
        written = _state(12, _managed(CREATED, MINE), priority=1, ttft=TTFT)
        _write(replica, written, base)
        index.replace(PLURAL, [index.entry(PLURAL, written)], GROUP)
        await _settle(replica)
        (entry,) = _revisions(kube)
        assert _by(entry) == ("alice", "slo-api", "own-1", None)

    vtime.run(scenario())


def test_a_gap_seen_by_one_replica_and_the_steps_by_another_are_recorded_once() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        relisting, watching = _replica(kube), _replica(kube)
        base = _state(10, _managed(CREATED), priority=1)
        edited = _state(11, _managed(CREATED, PATCHED), priority=5)
        later = _state(
            12,
            _managed(CREATED, PATCHED, ("kubectl-edit", "2026-01-03T00:00:00Z", ["ttft"])),
            priority=5,
            ttft=TTFT,
        )
        index = Service.index_for([LLM])
        index.on_observed(relisting.observe)
        index.upsert(PLURAL, base)
        index.replace(PLURAL, [index.entry(PLURAL, later)], GROUP)  # the gap 10..12
        await _settle(relisting)
        for state in (base, edited, later):  # each step
            watching.observe(PLURAL, GROUP, NAME, state)
        await _settle(watching)
        entries = _revisions(kube)
        # kubectl's priority change is in one revision only: the steps replace the gap.
        assert [(e["id"], [c["field"] for c in e["changes"]]) for e in entries] == [
            ("11", ["priority"]),
            ("12", ["ttft"]),
        ]
        assert _by(entries[1])[:2] == ("kubectl-edit", "kubectl-edit")

    vtime.run(scenario())


def test_a_read_on_a_replica_that_did_not_write_answers_at_once() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        writing, other = _replica(kube), _replica(kube)
        base = _state(10, _managed(CREATED), priority=1)
        mine = _state(11, _managed(CREATED, MINE), priority=1, ttft=TTFT)
        for replica in (writing, other):
            replica.observe(PLURAL, GROUP, NAME, base)
        _write(writing, mine, base)
        writing.observe(PLURAL, GROUP, NAME, mine)
        await until(lambda: bool(_revisions(kube)), "recorded")
        other.observe(PLURAL, GROUP, NAME, mine)  # not its write: it waits out its grace
        loop = asyncio.get_running_loop()
        started = loop.time()
        entries = await other.read(Target.of("a", LLM, mine))
        # Answered before the other replica's grace is over (virtual time: no load in it).
        assert loop.time() - started < GRACE
        assert [_by(e) for e in entries] == [("alice", "slo-api", "own-1", None)]
        await _settle(writing, other)

    vtime.run(scenario())


def test_a_cr_recreated_and_first_seen_in_a_relist_leaves_nothing_of_the_old_one() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        index = Service.index_for([LLM])
        replica = _replica(kube)
        index.on_observed(replica.observe)
        old = _argo(10, _managed(CREATED, ARGO), priority=1)
        index.upsert(PLURAL, old)
        kubectl = ("kubectl-edit", "2026-01-02T00:00:00Z", ["priority"])
        edited = _argo(11, _managed(CREATED, kubectl), priority=2)
        index.upsert(PLURAL, edited)
        _write(replica, _argo(13, _managed(CREATED, kubectl), priority=3), edited)
        assert replica.remembered(edited)
        # Deleted and created again under the same name while the watch was broken.
        new = _state(20, _managed(CREATED), uid="u2", priority=0)
        index.replace(PLURAL, [index.entry(PLURAL, new)], GROUP)
        await _settle(replica)
        assert replica.remembered(edited) == {}
        assert "u1" not in replica.tracked()

    vtime.run(scenario())


def test_a_seed_still_pending_records_no_owners_and_merges_what_was_seen_since() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        # The replica that watched: argocd applied priority, then kubectl edit took it.
        watched = _replica(kube)
        applied = _argo(10, _managed(CREATED, ARGO), priority=1)
        kubectl = ("kubectl-edit", "2026-01-02T00:00:00Z", ["priority"])
        edited = _argo(11, _managed(CREATED, kubectl), priority=2)
        watched.observe(PLURAL, GROUP, NAME, applied)
        await _settle(watched)  # its seed (nothing stored yet) is in
        watched.observe(PLURAL, GROUP, NAME, edited)
        await _settle(watched)
        # A replica started now: its seed (the list of revisions) is held back while a
        # change arrives.
        release = asyncio.Event()

        async def slow_list(method: str, *args: Any) -> None:
            if method == "list":
                await release.wait()

        kube.error_callback = slow_list
        started = _replica(kube)
        started.observe(PLURAL, GROUP, NAME, edited)
        bound = {"type": "replica", "value": 4}
        more = ("kubectl-patch", "2026-01-03T00:00:00Z", ["maximumDeployment"])
        changed = _argo(12, _managed(CREATED, kubectl, more), priority=2, maximumDeployment=bound)
        started.observe(PLURAL, GROUP, NAME, changed)
        watched.observe(PLURAL, GROUP, NAME, changed)
        # Before the seed: whatever this replica records says nothing of owners.
        await until(lambda: len(_revisions(kube)) == 2, "the change recorded")
        release.set()
        await _settle(started, watched)
        # Both replicas guard the write alike: argocd's claim on priority is remembered.
        for replica in (started, watched):
            assert set(replica.remembered(changed)) == {"priority"}
        # And no revision says that nobody owns anything: a later restart would forget it.
        assert all(e["owners"] != {} for e in _revisions(kube))

    vtime.run(scenario())


def test_a_cr_created_while_watched_records_its_owners_even_while_histories_are_slow() -> None:
    """A CR seen from its creation on (generation 1) has no history to read back: its first
    change names the GitOps owners at once, however slow a list of revisions is."""

    async def scenario() -> None:
        kube = FakeKube()
        release = asyncio.Event()

        async def slow_list(method: str, *args: Any) -> None:
            if method == "list":
                await release.wait()

        kube.error_callback = slow_list
        replica = _replica(kube)
        created = _argo(1, _managed(CREATED, ARGO), priority=1)
        replica.observe(PLURAL, GROUP, NAME, created)
        forced = ("slo-api", "2026-01-02T00:00:00Z", ["priority"])
        changed = _argo(2, _managed(CREATED, ARGO, forced), priority=9)
        replica.observe(PLURAL, GROUP, NAME, changed)
        await until(lambda: len(_revisions(kube)) == 1, "the change recorded")
        (entry,) = _revisions(kube)
        assert entry["owners"] is not None
        assert entry["owners"]["priority"]["manager"] == "argocd-controller"
        release.set()
        await _settle(replica)

    vtime.run(scenario())


def test_a_change_met_by_an_outage_is_recorded_as_soon_as_the_api_server_answers() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        loop = asyncio.get_running_loop()
        back_at = loop.time() + 200

        async def probe() -> bool:
            return loop.time() > back_at

        def outage(method: str, *args: Any) -> None:
            if loop.time() <= back_at:
                raise KubeError(0, message="cannot reach the API server")

        kube.error_callback = outage
        replica = _replica(kube, pause=Recovery(probe).pause)
        replica.observe(PLURAL, GROUP, NAME, _state(10, _managed(CREATED), priority=1))
        replica.observe(PLURAL, GROUP, NAME, _state(11, _managed(CREATED, PATCHED), priority=2))
        await until(lambda: bool(_revisions(kube)), "recorded", within=400)
        # Not after a backoff the outage grew (up to 30 s): woken with the API server.
        assert loop.time() - back_at < 5

    vtime.run(scenario())


def test_a_revision_kind_not_served_yet_after_a_restart_is_waited_for() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        replica = _replica(kube)
        kube.error_callback = fail(
            KubeError(404, "NotFound", "the server could not find the requested resource"),
            "create",
            times=3,
        )
        replica.observe(PLURAL, GROUP, NAME, _state(10, _managed(CREATED), priority=1))
        replica.observe(PLURAL, GROUP, NAME, _state(11, _managed(CREATED, PATCHED), priority=2))
        await until(lambda: bool(_revisions(kube)), "recorded", within=300)

    vtime.run(scenario())


def _opaque(rv: str, managed: list[dict[str, Any]], generation: int, **spec: Any) -> dict[str, Any]:
    """A state whose resourceVersion is no number (the API server promises only a string)."""
    obj = _state(0, managed, **spec)
    obj["metadata"].update(resourceVersion=rv, generation=generation)
    return obj


NAME_RULE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def test_opaque_resource_versions_are_named_ordered_and_attributed_without_numbers() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        replica = _replica(kube)
        replica.observe(PLURAL, GROUP, NAME, _opaque("Zz/9", _managed(CREATED), 1, priority=1))
        edit = ("kubectl-edit", "2026-01-02T00:00:00Z", ["priority"])
        replica.observe(
            PLURAL, GROUP, NAME, _opaque("Aa:1", _managed(CREATED, edit), 2, priority=2)
        )
        first = _opaque("Aa:1", _managed(CREATED, edit), 2, priority=2)
        written = _opaque("0b", _managed(CREATED, edit, MINE), 3, priority=2, ttft=TTFT)
        _write(replica, written, first)
        replica.observe(PLURAL, GROUP, NAME, written)
        # A late event, older than what was seen (its generation says so): nothing.
        replica.observe(PLURAL, GROUP, NAME, _opaque("Q", _managed(CREATED, edit), 2, priority=7))
        await _settle(replica)
        names = [n for (plural, _, n) in kube.objects if plural == "routerevisions"]
        assert len(names) == 2
        assert all(NAME_RULE.fullmatch(n) and len(n) <= 253 for n in names)
        entries = await replica.read(Target.of("a", LLM, written))
        # Newest first, though neither version is a number, nor in the order of their text.
        assert [(e["id"], _by(e)[0]) for e in entries] == [
            ("0b", "alice"),
            ("Aa:1", "kubectl-edit"),
        ]

    vtime.run(scenario())


def test_a_decimal_resource_version_keeps_the_name_stored_revisions_have() -> None:
    assert revision_name("u1", "48213") == "u1.48213"
    hashed = revision_name("u1", "48213/x")
    assert hashed != revision_name("u1", "48213/y")
    assert NAME_RULE.fullmatch(hashed)


@pytest.mark.parametrize(
    "rv",
    ["48213/x", "¹²", "\u0661\u0662", "A1", "a_b", "", "012", "9" * 300, "x" * 300, "1.2"],
)
def test_any_resource_version_yields_a_valid_revision_name(rv: str) -> None:
    uid = "0b6f3c2e-1111-4222-8333-444455556666"
    name = revision_name(uid, rv)
    # A Kubernetes object name (a DNS subdomain): the create is never refused for its name.
    assert NAME_RULE.fullmatch(name)
    assert len(name) <= 253
    assert name != revision_name(uid, rv + "1")


def test_ids_that_do_not_compare_are_ordered_by_time_after_those_that_do() -> None:
    entries = [
        {"id": "012", "time": "2026-01-01T00:00:01Z"},  # a leading zero: not KEP-5504's
        {"id": "100", "time": "2026-01-01T00:00:02Z"},
        {"id": "¹²", "time": "2026-01-01T00:00:00Z"},
        {"id": "99", "time": "2026-01-01T00:00:03Z"},
    ]
    assert [e["id"] for e in sorted(entries, key=order)] == ["99", "100", "¹²", "012"]


# A reset through slo-api: a merge patch of nulls on the only fields slo-api held, so its
# managedFields entry goes with them and no manager is stamped: the change names nobody.
OWNED_BY_SLO_API = _state(10, _managed(CREATED, MINE), priority=1, ttft=TTFT)
RESET = _state(11, _managed(CREATED), priority=1)


def test_a_reset_another_replica_recorded_first_as_unknown_is_the_caller_s() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        writing, other = _replica(kube), _replica(kube)
        for replica in (writing, other):
            replica.observe(PLURAL, GROUP, NAME, OWNED_BY_SLO_API)
        _write(writing, RESET, OWNED_BY_SLO_API)
        other.observe(PLURAL, GROUP, NAME, RESET)  # its event reaches the other replica first
        await _settle(other)
        writing.observe(PLURAL, GROUP, NAME, RESET)
        await _settle(writing)
        (entry,) = _revisions(kube)
        assert _by(entry) == ("alice", "slo-api", "own-1", None)
        assert entry["changes"] == [{"field": "ttft", "from": TTFT, "to": None}]

    vtime.run(scenario())


def test_a_reset_whose_event_comes_before_its_answer_is_the_caller_s() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        writing, other = _replica(kube), _replica(kube)
        for replica in (writing, other):
            replica.observe(PLURAL, GROUP, NAME, OWNED_BY_SLO_API)
            replica.observe(PLURAL, GROUP, NAME, RESET)  # on the writer, before the answer
        _write(writing, RESET, OWNED_BY_SLO_API)
        await _settle(writing, other)
        (entry,) = _revisions(kube)
        assert _by(entry) == ("alice", "slo-api", "own-1", None)

    vtime.run(scenario())
