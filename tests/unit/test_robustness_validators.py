"""The robustness harness's validators: a clean recording passes each, and each planted
violation of a promise is caught by the validator of that promise (and reported readably)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from robustness.__main__ import main
from robustness.model import build
from robustness.recording import GAP, Request, Truth, load
from robustness.validators import VALIDATORS, Violation, report, validate
from tests.unit.robustness_builder import Builder, Session, item


def clean() -> Builder:
    """Every kind of traffic once, as a correct slo-api answers it."""
    b = Builder()
    b.create("chat", "llm", "a")
    b.create("render", "job", "b")
    b.create("slot", "pool", "a")
    b.limits("a", {"maxPriority": 8})
    seen = b.watch("w1")
    b.watch("w2", identity="team-a", replica="b")
    first = b.put("chat", {"priority": 3})
    b.put("chat", {"priority": 5}, if_match=first.header("ETag"), replica="b")
    b.change("render", {"priority": 2})
    b.put("render", {"maximumDeployment": {"type": "replica", "value": 4}}, identity="team-a")
    b.put("slot", {"pool": {"swapBudget": "90s"}})
    b.put("chat", {"priority": 7}, query="?dryRun=true")
    b.close(seen, "drop")
    seen = b.watch("w1", replica="b", since=True)
    b.change("chat", {"ttft": {"default": {"metrics": [{"type": "p90", "threshold": 1}]}}})
    b.fault("kill", "a")
    b.request(503)
    b.request(None, error="connection refused")
    b.put("chat", {"minimumDeployment": {"type": "replica", "value": 2}}, replica="b")
    return b


def caught(b: Builder, validator: str) -> list[Violation]:
    found = validate(b.finish())
    assert {v.validator for v in found} == {validator}, report(b.recording, found)
    return found


def test_a_clean_recording_passes_every_validator() -> None:
    b = clean()
    assert validate(b.finish()) == []
    assert "every validator passed" in report(b.recording, [])


def test_the_recording_survives_a_round_trip_through_json_lines(tmp_path: Path) -> None:
    b = clean()
    path = tmp_path / "run.jsonl"
    b.finish().save(path)
    again = load(path)
    assert list(again.records()) == list(b.recording.records())
    assert validate(again) == []


# -- acknowledged writes -----------------------------------------------------------------


def test_a_lost_write_is_caught() -> None:
    b = clean()
    lost = str(b.put("chat", {"priority": 1}).header("ETag")).strip('"')
    b.recording.truth = [
        t for t in b.recording.truth if t.object.get("metadata", {}).get("resourceVersion") != lost
    ]
    found = validate(b.finish(), ("acknowledged_writes",))
    assert [v.route for v in found] == ["chat"]
    assert "lost write" in found[0].message
    assert "PUT /routes/chat" in found[0].render()


def test_a_write_that_changed_a_field_it_did_not_send_is_caught() -> None:
    b = clean()
    b.put("chat", {"priority": 2}, spec={"priority": 2, "minimumDeployment": {"value": 3}})
    found = validate(b.finish(), ("acknowledged_writes",))
    assert len(found) == 1
    assert "changed fields it did not send" in found[0].message


def test_a_write_that_clobbered_a_field_outside_the_owned_ones_is_caught() -> None:
    b = clean()
    b.put("chat", {"priority": 2}, spec={"priority": 2, "model": "other"})
    found = validate(b.finish(), ("acknowledged_writes",))
    assert "spec.model" in found[0].message


def test_a_write_that_changed_nothing_is_not_blamed_for_the_change_before_it() -> None:
    b = clean()
    b.change("chat", {"minimumDeployment": {"type": "replica", "value": 3}})
    b.put("chat", {"priority": 5}, noop=True)
    b.put("chat", {"priority": 5}, noop=True, if_match=f'"{b.rv}"')
    assert validate(b.finish()) == []


# -- history -----------------------------------------------------------------------------


def _revisions(b: Builder) -> list[Truth]:
    return [t for t in b.recording.truth if t.resource == "routerevisions"]


def test_a_missing_revision_is_caught() -> None:
    b = clean()
    b.recording.truth.remove(_revisions(b)[0])
    found = caught(b, "history")
    assert "no revision for the change" in found[0].message


def test_a_doubled_revision_is_caught() -> None:
    b = clean()
    b.change("chat", {"model": "llama"}, manager="deployer")  # no client-owned field changed
    obj = b.crs["chat"]
    b.revision(obj, [{"field": "priority", "from": 5, "to": 5}], {"actor": "x", "via": "x"})
    found = caught(b, "history")
    assert "a change that never happened" in found[0].message


def test_a_revision_naming_the_wrong_actor_is_caught() -> None:
    b = clean()
    revision = _revisions(b)[0]
    revision.object["data"]["actor"] = "token:read"
    found = caught(b, "history")
    assert "wrong actor" in found[0].message
    assert "token:write" in found[0].message


def test_a_change_around_slo_api_credited_to_another_manager_is_caught() -> None:
    b = clean()
    for revision in _revisions(b):
        if revision.object["data"]["actor"] == "kubectl-edit":
            revision.object["data"]["actor"] = revision.object["data"]["via"] = "argocd-controller"
    found = caught(b, "history")
    assert all("field manager 'kubectl-edit'" in v.message for v in found)


def test_a_revision_at_a_version_the_cr_never_had_is_caught() -> None:
    b = clean()
    revision = copy.deepcopy(_revisions(b)[0])
    revision.object["data"]["id"] = "99999"
    b.recording.truth.append(revision)
    found = caught(b, "history")
    assert "never had" in found[0].message


def test_a_recreated_cr_sharing_its_history_is_caught() -> None:
    b = clean()
    old = b.crs["chat"]["metadata"]["resourceVersion"]
    b.delete_cr("chat")
    b.create("chat", "llm", "a")
    new = b.put("chat", {"priority": 6})
    b.recording.requests.append(
        dataclasses.replace(
            new,
            method="GET",
            path="/routes/chat/history",
            response_body={"items": [{"id": str(new.header("ETag")).strip('"')}, {"id": old}]},
        )
    )
    found = caught(b, "history")
    assert "mixes the revisions of 2 CRs" in found[0].message


def _read_history(b: Builder, *versions: str) -> None:
    """A history read of chat answered with entries at these versions, newest first."""
    request = b.put("chat", {"priority": 7})
    b.recording.requests.append(
        dataclasses.replace(
            request,
            method="GET",
            path="/routes/chat/history",
            response_body={"items": [{"id": v} for v in versions]},
        )
    )


def test_a_read_showing_one_change_twice_is_caught() -> None:
    # The change at `changed` read again at a later version where nothing client-owned
    # changed (a relist's revision named for a status update after it).
    b = clean()
    b.put("chat", {"priority": 6})
    changed = b.crs["chat"]["metadata"]["resourceVersion"]
    b.change("chat", {"model": "llama"}, manager="deployer")  # no client-owned field
    later = b.crs["chat"]["metadata"]["resourceVersion"]
    _read_history(b, later, changed)
    found = caught(b, "history")
    assert f"shows the change at rv {changed} again at rv {later}" in found[0].message


def test_a_read_of_a_change_and_the_change_back_passes() -> None:
    b = clean()
    b.put("chat", {"priority": 6})
    changed = b.crs["chat"]["metadata"]["resourceVersion"]
    b.change("chat", {"model": "llama"}, manager="deployer")
    b.put("chat", {"priority": 5})
    back = b.crs["chat"]["metadata"]["resourceVersion"]
    _read_history(b, back, changed)
    assert validate(b.finish(), ("history",)) == []


def test_a_revision_replaced_by_its_writer_is_kept() -> None:
    b = clean()
    b.put("chat", {"priority": 6})
    placeholder = _revisions(b)[-1]
    b.recording.add(Truth(b.tick(), "routerevisions", "DELETED", placeholder.object))
    b.recording.add(Truth(b.tick(), "routerevisions", "ADDED", placeholder.object))
    b.put("chat", {"priority": 7})
    assert validate(b.finish()) == []


def test_a_late_placeholder_for_a_deleted_cr_is_not_held_against_slo_api() -> None:
    b = clean()
    write = b.put("chat", {"priority": 6})
    obj = copy.deepcopy(b.crs["chat"])
    b.delete_cr("chat")
    [entry] = [
        t for t in _revisions(b) if t.object["data"]["id"] == str(write.header("ETag")).strip('"')
    ]
    b.recording.add(Truth(b.tick(), "routerevisions", "DELETED", entry.object))  # collected
    b.revision(obj, entry.object["data"]["changes"], {"actor": "unknown", "via": "slo-api"})
    assert validate(b.finish()) == []


def test_the_retention_bound_is_checked() -> None:
    b = clean()
    b.recording.meta.settings["history_entries"] = 5  # chat has 4 revisions by now
    b.tick(60)  # long after the fault: every replica prunes what it stores
    for priority in range(1, 3):
        b.put("chat", {"priority": priority})
    found = caught(b, "history")
    # One over the bound is caught, whoever stored it.
    assert "6 revisions kept, the bound is 5" in found[0].message


def _repeat_across_a_relist(b: Builder) -> dict[str, Any]:
    """A change, a status-like change of nothing client-owned, and a revision made across a
    relist at the latter that repeats the change (slo-api deletes such a one when found)."""
    b.put("chat", {"priority": 6})
    b.change("chat", {"model": "llama"}, manager="deployer")  # no client-owned field
    rev = b.revision(
        b.crs["chat"],
        [{"field": "priority", "from": 5, "to": 6}],
        {"actor": "unknown", "via": "unknown"},
    )
    b.recording.truth[-1].object["metadata"]["annotations"] = {
        "slo-api.modelsphere.dev/across-relist": "true"
    }
    return rev


def test_a_repeat_made_across_a_relist_deleted_before_older_revisions_passes() -> None:
    b = clean()
    repeat = _repeat_across_a_relist(b)
    b.recording.add(Truth(b.tick(), "routerevisions", "DELETED", repeat))
    assert validate(b.finish(), ("history",)) == []


def test_a_revision_pruned_before_older_ones_is_caught() -> None:
    b = clean()
    b.put("chat", {"priority": 6})
    newest = _revisions(b)[-1]
    b.recording.add(Truth(b.tick(), "routerevisions", "DELETED", newest.object))
    found = caught(b, "history")
    assert any("was pruned before older" in v.message for v in found)


def test_one_over_the_bound_stored_as_a_replica_stopped_is_not_held_against_slo_api() -> None:
    b = clean()
    b.recording.meta.settings["history_entries"] = 5
    b.tick(60)
    b.put("chat", {"priority": 1})
    b.fault("kill", "a")
    b.put("chat", {"priority": 2})  # stored, and its replica may have stopped before pruning
    assert validate(b.finish()) == []


def test_a_replacement_copied_aside_first_is_kept_with_its_writer() -> None:
    b = clean()
    write = b.put("chat", {"priority": 6})
    [entry] = [
        t for t in _revisions(b) if t.object["data"]["id"] == str(write.header("ETag")).strip('"')
    ]
    placeholder = copy.deepcopy(entry.object)
    placeholder["data"].update(actor="unknown", via="slo-api", clientRequestId=None)
    spare = copy.deepcopy(entry.object)
    spare["metadata"]["name"] += ".spare"
    b.recording.truth.remove(entry)
    # As slo-api replaces a placeholder: a copy aside, the placeholder out, the revision in,
    # the copy out.
    for event, obj in [
        ("ADDED", placeholder),
        ("ADDED", spare),
        ("DELETED", placeholder),
        ("ADDED", entry.object),
        ("DELETED", spare),
    ]:
        b.recording.add(Truth(b.tick(), "routerevisions", event, obj))
    assert validate(b.finish()) == []


def test_a_placeholder_made_across_a_relist_gives_way_to_one_from_consecutive_states() -> None:
    """As slo-api does (seed 5): a replica whose watch relisted folds two changes into one
    placeholder; another, which saw them one by one, replaces it with its own placeholder."""
    b = clean()
    b.change("chat", {"priority": 1})
    write = b.put("chat", {"priority": 6})
    [entry] = [
        t for t in _revisions(b) if t.object["data"]["id"] == str(write.header("ETag")).strip('"')
    ]
    b.recording.truth.remove(entry)
    precise = copy.deepcopy(entry.object)
    precise["data"].update(actor="unknown", via="slo-api", clientRequestId=None)
    folded = copy.deepcopy(precise)
    folded["data"].update(via="unknown", changes=[{"field": "priority", "from": 5, "to": 6}])
    folded["metadata"]["annotations"] = {"slo-api.modelsphere.dev/across-relist": "true"}
    spare = copy.deepcopy(precise)
    spare["metadata"]["name"] += ".spare"
    for event, obj in [
        ("ADDED", folded),
        ("ADDED", spare),
        ("DELETED", folded),
        ("ADDED", precise),
        ("DELETED", spare),
    ]:
        b.recording.add(Truth(b.tick(), "routerevisions", event, obj))
    b.fault("reset", "a")  # the writer's replica lost its connections right after its write
    assert validate(b.finish(), ("history",)) == []


def _across(b: Builder, to: int) -> None:
    """Two changes around slo-api that every replica's watch folded into one relist: the
    revision is the difference from the state before both, `unknown`, marked across."""
    b.tick(60)
    b.fault("restart", "apiserver", 5)
    b.auto = False
    b.change("chat", {"priority": 2})
    second = b.change("chat", {"priority": 4})
    b.auto = True
    obj = b.crs["chat"]
    rev = b.revision(
        obj,
        [{"field": "priority", "from": 5, "to": to}],
        {"actor": "unknown", "via": "unknown"},
    )
    b.recording.truth[-1].object["metadata"]["annotations"] = {
        "slo-api.modelsphere.dev/across-relist": "true"
    }
    assert second.status == 200
    assert rev["data"]["id"] == obj["metadata"]["resourceVersion"]


def test_a_revision_made_across_a_relist_may_fold_changes_and_name_nobody() -> None:
    b = clean()
    _across(b, to=4)
    assert validate(b.finish(), ("history",)) == []


def test_a_revision_made_across_a_relist_must_still_say_what_the_fields_became() -> None:
    b = clean()
    _across(b, to=3)
    found = validate(b.finish(), ("history",))
    assert [v.validator for v in found] == ["history"]
    assert "made across a relist" in found[0].message


def test_a_change_across_a_gap_in_the_harness_watch_is_not_held_against_slo_api() -> None:
    b = clean()
    b.recording.add(Truth(b.tick(), "llmslorequirements", GAP))
    b.auto = False
    b.change("chat", {"priority": 4})
    b.auto = True
    assert validate(b.finish(), ("history",)) == []


# -- streams -----------------------------------------------------------------------------


def test_a_state_the_harness_watch_missed_in_its_gap_is_not_held_against_a_stream() -> None:
    """Seed 11: the API server restarted; the harness's watch broke then and listed again
    only when it was back, so a state made meanwhile was never in its truth, though a stream
    showed it (rightly)."""
    b = clean()
    b.tick(60)
    broke = b.tick()
    b.put("chat", {"priority": 6})
    missed = [
        t for t in b.recording.truth if t.event == "MODIFIED" and t.resource == "llmslorequirements"
    ][-1]
    b.recording.truth.remove(missed)
    b.recording.add(Truth(b.tick(20), "llmslorequirements", GAP, {"since": broke}))
    b.put("chat", {"priority": 4})
    assert validate(b.finish(), ("streams",)) == []


def _send_chat(b: Builder, session: Session, priorities: tuple[int, ...]) -> None:
    """Lines a replica sends `session` by hand: chat as it is now, at each of `priorities`."""
    obj = copy.deepcopy(b.crs["chat"])
    for n, priority in enumerate(priorities):
        obj["spec"]["priority"] = priority
        line = {"type": "MODIFIED", "route": "chat", "object": item(obj)}
        b.line(session, {**line, "revision": f"{session.watcher}-{session.number}-{n}"})


def _replayed(b: Builder, fault: bool = False, caps_before: float | None = None) -> Builder:
    """A watcher that had chat's newest state resumes on another replica, which sends the
    route's two changes before it again, in order: its revision named a version from before
    a relist the first replica was recording (`fault`), or from before a change of the
    namespace's caps that the first replica's `SLOLimits` watch had not brought yet, made
    `caps_before` seconds before chat's newest state."""
    b.tick(60)
    if fault:
        b.fault("compaction", "apiserver", 0.1)  # the relist that made the revision imprecise
    b.put("chat", {"priority": 2})
    if caps_before is not None:
        b.limits("a", {"maxPriority": 9})
        b.tick(caps_before)
    third = b.put("chat", {"priority": 3})
    b.tick(1)
    first = next(s for s in b.sessions if s.watcher == "w1" and s.live)
    b.close(first, "drop")
    again = b.watch("w1", replica="a", since=True)
    _send_chat(b, again, (2, 3))
    assert third.status == 200
    return b


def test_a_resume_that_replays_changes_from_before_a_relist_passes() -> None:
    b = _replayed(clean(), fault=True)
    assert validate(b.finish(), ("streams",)) == []


def test_a_resume_that_goes_back_with_no_relist_to_explain_it_is_caught() -> None:
    b = _replayed(clean())
    found = validate(b.finish(), ("streams",))
    assert found
    assert "out of order" in found[0].message


def test_a_resume_that_replays_from_a_change_of_another_informer_passes() -> None:
    """Seed 4 (1800 s): a fault had reset a replica's connections, so its `SLOLimits` watch
    had not yet brought the namespace's new caps when a full-view watcher read chat's newest
    state there; resumed on another replica, which had recorded the caps change before that
    state, it was sent the route as it stood at the caps change, then the newest state again
    (docs/api.md: every change from a version the revision had not reached)."""
    b = _replayed(clean(), caps_before=0.5)
    assert validate(b.finish(), ("streams",)) == []


def test_a_resume_that_replays_from_a_change_of_another_informer_long_before_is_caught() -> None:
    """The other informer's change is older than any lag between two informers of a replica
    (and no fault explains it): going back that far is out of order."""
    b = _replayed(clean(), caps_before=30)
    found = validate(b.finish(), ("streams",))
    assert found
    assert "out of order" in found[0].message


def _replayed_back_to_a_like_state(b: Builder, caps_before: float | None) -> Builder:
    """chat goes 4, 8, 4; a watcher that held the newest 4 resumes on another replica, which
    sends 4, 8, 4 again: its revision had not reached a change of the namespace's caps made
    `caps_before` seconds before the 8, while the first 4 stood (None: no caps change)."""
    b.tick(60)
    b.put("chat", {"priority": 4})
    if caps_before is not None:
        b.limits("a", {"maxPriority": 9})
        b.tick(caps_before)
    b.put("chat", {"priority": 8})
    b.put("chat", {"priority": 4})
    b.tick(1)
    first = next(s for s in b.sessions if s.watcher == "w1" and s.live)
    b.close(first, "drop")
    again = b.watch("w1", replica="a", since=True)
    _send_chat(b, again, (4, 8, 4))
    return b


def test_a_resume_that_replays_from_a_state_like_the_one_held_passes() -> None:
    """The CI pass, seed 2026: the first state a resume sends again looks like the one the
    watcher held (the route went 4, 8, 4) but is the older one, as the route stood at the
    caps change the other replica's revision had not reached; the 8 and the 4 after it
    follow it, in order."""
    b = _replayed_back_to_a_like_state(clean(), caps_before=0.5)
    assert validate(b.finish(), ("streams",)) == []


def test_a_resume_that_goes_back_to_a_like_state_with_nothing_to_explain_it_is_caught() -> None:
    b = _replayed_back_to_a_like_state(clean(), caps_before=None)
    found = validate(b.finish(), ("streams",))
    assert found
    assert "out of order" in found[0].message


def _opened_behind(b: Builder, first: int | None, after: float = 1.0) -> Builder:
    """chat goes (`first`,) 8, 4; `after` seconds later a new stream opens on a replica whose
    informer still stood at chat's `first`: its initial state shows chat as the replica held
    it, then the replica catches up: 8, 4 (each a change after the initial state)."""
    b.tick(60)
    if first is not None:
        b.put("chat", {"priority": first})
    b.put("chat", {"priority": 8})
    b.put("chat", {"priority": 4})
    b.tick(after)
    session = b.watch("w3")  # its initial chat: priority 4, as chat is now, and as at `first`
    _send_chat(b, session, (8, 4))
    return b


def test_a_stream_opened_on_a_replica_behind_a_state_like_the_newest_passes() -> None:
    """The initial state may be as the replica held it: an older state like the newest one
    (the route went 4, 8, 4), which the changes after it follow in order."""
    b = _opened_behind(clean(), first=4)
    assert validate(b.finish(), ("streams",)) == []


def test_a_stream_that_shows_a_change_back_to_a_state_it_never_left_is_caught() -> None:
    """Without an older 4 for the initial state to have been, the 8 after it goes back."""
    b = _opened_behind(clean(), first=None)
    found = validate(b.finish(), ("streams",))
    assert found
    assert "out of order" in found[0].message


def test_a_stream_opened_on_a_replica_far_behind_with_no_fault_to_explain_it_is_caught() -> None:
    """An initial state older than any lag between the harness's watch and a replica's (and
    no fault under way) is not taken for the older like state."""
    b = _opened_behind(clean(), first=4, after=30)
    found = validate(b.finish(), ("streams",))
    assert found
    assert "out of order" in found[0].message


def test_a_state_no_gap_explains_is_still_caught() -> None:
    b = clean()
    b.tick(60)
    b.put("chat", {"priority": 6})
    missed = [
        t for t in b.recording.truth if t.event == "MODIFIED" and t.resource == "llmslorequirements"
    ][-1]
    b.recording.truth.remove(missed)
    b.recording.add(Truth(b.tick(20), "llmslorequirements", GAP, {"since": b.now}))
    b.put("chat", {"priority": 4})
    found = validate(b.finish(), ("streams",))
    assert found
    assert "never followed" in found[0].message


def _lines(b: Builder, watcher: str) -> list[int]:
    return [
        i
        for i, s in enumerate(b.recording.streams)
        if s.watcher == watcher and s.what == "line" and s.line and s.line["type"] == "MODIFIED"
    ]


def test_a_gap_in_a_stream_is_caught() -> None:
    b = clean()
    del b.recording.streams[_lines(b, "w1")[0]]
    found = caught(b, "streams")
    assert "gap" in found[0].message


def test_a_change_that_comes_twice_is_caught() -> None:
    b = clean()
    at = _lines(b, "w1")[0]
    b.recording.streams.insert(at + 1, copy.deepcopy(b.recording.streams[at]))
    found = caught(b, "streams")
    assert "came twice" in found[0].message


def test_a_reorder_in_a_stream_is_caught() -> None:
    b = clean()
    first, second = _lines(b, "w1")[:2]
    streams = b.recording.streams
    streams[first].line, streams[second].line = streams[second].line, streams[first].line
    found = caught(b, "streams")
    assert any("out of order" in v.message for v in found)


def test_a_resume_that_skips_a_change_is_caught() -> None:
    b = clean()
    b.tick(60)  # past the fault, when a relist may fold changes together
    b.put("chat", {"priority": 6})
    b.put("chat", {"priority": 4})
    resumed = [i for i in _lines(b, "w1") if b.recording.streams[i].session == 2]
    del b.recording.streams[resumed[-2]]
    assert "gap" in caught(b, "streams")[0].message


def test_a_gap_while_a_fault_is_under_way_is_not_held_against_slo_api() -> None:
    b = clean()
    resumed = [i for i in _lines(b, "w1") if b.recording.streams[i].session == 2]
    del b.recording.streams[resumed[0]]
    b.put("chat", {"priority": 6})
    assert validate(b.finish()) == []


def test_a_route_recreated_as_it_was_right_after_a_stream_opened_is_followed() -> None:
    b = clean()
    b.tick(60)
    b.create("fresh", "llm", "a")
    b.watch("w3")
    b.delete_cr("fresh")
    b.create("fresh", "llm", "a")  # the same values under a new uid, a second later
    assert validate(b.finish()) == []


def test_a_stream_showing_a_namespace_it_may_not_see_is_caught() -> None:
    b = clean()
    session = next(s for s in b.sessions if s.identity == "team-a")
    session.live = True
    obj = b.crs["render"]
    b.line(session, {"type": "MODIFIED", "route": "render", "object": item(obj), "revision": "x"})
    found = caught(b, "streams")
    assert "may not see" in found[0].message


def test_a_stream_ending_behind_the_truth_is_caught() -> None:
    b = clean()
    stale = b.watch("w3")
    b.change("chat", {"priority": 1})
    assert b.recording.streams[-1].watcher == "w3"
    del b.recording.streams[-1]
    b.close(stale)
    found = caught(b, "streams")
    assert "ended holding" in found[0].message


# -- conditional writes --------------------------------------------------------------------


def test_two_successful_writes_from_one_etag_are_caught() -> None:
    b = clean()
    read = b.put("chat", {"priority": 1})
    b.put("chat", {"priority": 2}, if_match=read.header("ETag"))
    b.put("chat", {"priority": 3}, if_match=read.header("ETag"), replica="b")
    found = caught(b, "conditional_writes")
    assert "2 writes conditional on ETag" in found[0].message


def test_a_412_with_the_current_etag_is_caught() -> None:
    b = clean()
    read = b.put("chat", {"priority": 1})
    b.put("chat", {"priority": 2}, if_match=read.header("ETag"), status=412)
    found = caught(b, "conditional_writes")
    assert "412" in found[0].message


def test_a_412_after_a_real_change_passes() -> None:
    b = clean()
    read = b.put("chat", {"priority": 1})
    b.change("chat", {"priority": 2})
    b.put("chat", {"priority": 3}, if_match=read.header("ETag"), status=412)
    assert validate(b.finish()) == []


def test_a_write_that_changed_nothing_after_a_gitops_field_changed_is_not_blamed() -> None:
    b = clean()
    _argo_managed(b)
    b.change("gitops", {"priority": 2})  # kubectl-edit over Argo CD's field
    b.tick(2)
    b.put("gitops", {"highPriority": False}, noop=True)  # keeps a stored 1..9: no change
    assert validate(b.finish()) == []


# -- GitOps -----------------------------------------------------------------------------


def _argo_managed(b: Builder) -> None:
    b.create(
        "gitops",
        "llm",
        "a",
        managers=[{"manager": "argocd-controller", "operation": "Apply", "fields": ["priority"]}],
        annotations={"argocd.argoproj.io/tracking-id": "app:inference/x"},
    )


def test_an_unforced_write_of_a_gitops_field_is_caught() -> None:
    b = clean()
    _argo_managed(b)
    b.put("gitops", {"priority": 4})
    found = caught(b, "gitops")
    assert "managed by argocd-controller" in found[0].message


def test_a_forced_write_of_a_gitops_field_passes() -> None:
    b = clean()
    _argo_managed(b)
    b.put("gitops", {"priority": 4}, query="?force=true")
    assert validate(b.finish()) == []


# -- guardrails ----------------------------------------------------------------------------


def test_a_cr_stored_beyond_its_cap_is_caught() -> None:
    b = clean()
    b.change("chat", {"priority": 9})
    found = caught(b, "guardrails")
    assert "maxPriority" in found[0].message


def _ratchet(*priorities: int) -> Builder:
    b = clean()
    b.create("legacy", "job", "c", spec={"priority": 10})
    b.limits("c", {"maxPriority": 3})
    b.change("legacy", {"queue": {"maxDepth": 9, "promql": "sum(q)"}})
    for priority in priorities:
        b.change("legacy", {"priority": priority})
    return b


def test_the_ratchet_lets_a_value_set_before_the_cap_stay_and_move_toward_it() -> None:
    assert validate(_ratchet(6).finish()) == []
    assert "maxPriority" in caught(_ratchet(6, 8), "guardrails")[0].message


def _lowered(seconds: float) -> Builder:
    """Namespace a's cap lowered long after it was set, then a write `seconds` later stored
    within the old cap and beyond the new one."""
    b = clean()
    b.tick(60)
    b.limits("a", {"maxPriority": 5})
    b.tick(seconds)
    b.change("chat", {"priority": 7})
    return b


def test_a_write_admitted_by_the_cap_in_force_moments_before_passes() -> None:
    """Seed 11 in CI: the API server's admission read the previous SLOLimits 10 ms after a
    change lowered it (its parameters come from a cache that may trail)."""
    assert validate(_lowered(0.01).finish(), ("guardrails",)) == []


def test_a_write_beyond_a_cap_lowered_well_before_is_caught() -> None:
    assert "maxPriority" in caught(_lowered(10), "guardrails")[0].message


# -- liveness and convergence --------------------------------------------------------------


def test_a_500_is_caught() -> None:
    b = clean()
    b.request(500)
    assert "answered 500" in caught(b, "liveness")[0].message


def test_a_503_outside_any_fault_and_an_unanswered_request_are_caught() -> None:
    b = clean()
    b.tick(60)
    b.request(503)
    b.request(None, error="timed out")
    assert len(caught(b, "liveness")) == 2


def test_a_replica_whose_index_misses_a_change_is_caught() -> None:
    b = clean()
    b.finish()
    final = next(r for r in b.recording.requests if r.phase == "final" and r.replica == "b")
    final.response_body["items"][0]["priority"] = 0
    found = caught(b, "convergence")
    assert "replica b" in found[0].message


def test_a_replica_serving_an_older_resource_version_of_the_same_fields_is_caught() -> None:
    """A change that left the client-owned fields as they were (a label, another section's
    no-op) still moves the version a conditional write must name."""
    b = clean()
    b.finish()
    final = next(
        r
        for r in b.recording.requests
        if r.phase == "final" and r.replica == "a" and r.path.startswith("/routes/")
    )
    rv = int(str(final.header("ETag")).strip('"'))
    final.response_headers["ETag"] = f'"{rv - 1}"'
    found = caught(b, "convergence")
    assert f"serves resourceVersion {rv - 1}, stored {rv}" in found[0].message


def started_later() -> Builder:
    """The clean recording, then a replica restarted well after every CR was made."""
    b = clean()
    b.tick(30)
    return b


def test_a_replica_started_and_ready_as_slo_api_does_passes() -> None:
    b = started_later()
    b.started("c")
    # Its start's refused connections and 503s are not held against it.
    assert validate(b.finish()) == []


def test_a_replica_ready_before_its_index_holds_every_route_is_caught() -> None:
    b = started_later()
    b.started("c", missing=("render",))
    (found,) = caught(b, "readiness")
    assert found.route == "render"
    assert "replica c" in found.message


def test_a_replica_ready_before_it_knows_its_namespaces_limits_is_caught() -> None:
    b = started_later()
    b.started("c", without_limits=True)
    (found,) = caught(b, "readiness")
    assert found.route == "chat"
    assert "maxPriority" in found.message


def test_a_route_made_while_a_replica_started_is_not_required_of_it() -> None:
    b = started_later()
    b.create("late", "llm", "b")
    b.started("c", missing=("late",))
    assert [v for v in validate(b.finish()) if v.validator == "readiness"] == []


def read_as(b: Builder, identity: str, path: str, items: list[str] | None = None) -> None:
    body = {"items": [{"route": r} for r in items]} if items is not None else {"route": "x"}
    sent = b.tick(0.01)
    b.recording.add(
        Request(
            id=f"read-{sent}",
            replica="a",
            identity=identity,
            method="GET",
            path=path,
            sent=sent,
            answered=sent + 0.01,
            status=200,
            response_body=body,
        )
    )


def test_reads_within_the_callers_namespaces_pass() -> None:
    b = clean()
    read_as(b, "team-a", "/routes/chat")
    read_as(b, "team-a", "/routes/slot/history")
    read_as(b, "team-a", "/config?view=full", ["chat", "slot"])
    read_as(b, "writer", "/config?view=summary", ["chat", "render", "slot"])
    assert validate(b.finish()) == []


@pytest.mark.parametrize(
    ("path", "items"),
    [
        ("/routes/render", None),
        ("/routes/render/history", None),
        ("/config?view=summary&page=1", ["chat", "render"]),
    ],
)
def test_a_read_showing_a_route_outside_the_callers_namespaces_is_caught(
    path: str, items: list[str] | None
) -> None:
    b = clean()
    read_as(b, "team-a", path, items)
    (found,) = caught(b, "reads")
    assert found.route == "render"
    assert "team-a" in found.message


def test_every_validator_is_named_and_tested_here() -> None:
    source = Path(__file__).read_text()
    assert all(f'"{name}"' in source for name in VALIDATORS)


# -- the command ---------------------------------------------------------------------------


def test_check_exits_non_zero_with_the_report_and_the_replay_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = clean()
    b.request(500)
    path = tmp_path / "run.jsonl"
    b.finish().save(path)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "seed 7: 1 violation(s)" in out
    assert "replay: python -m robustness run --seed 7" in out
    assert "liveness: answered 500" in out


def test_check_passes_a_clean_recording_and_refuses_a_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.jsonl"
    clean().finish().save(path)
    assert main(["check", str(path)]) == 0
    path.write_text('{"type": "request", "bogus": 1}\n')
    assert main(["check", str(path)]) == 2
    assert "line 1" in capsys.readouterr().err


def test_the_ground_truth_indexes_each_cr_by_uid() -> None:
    b = clean()
    b.delete_cr("chat")
    b.create("chat", "llm", "a")
    ground = build(b.recording)
    assert len([uid for uid, h in ground.states.items() if h[0].route == "chat"]) == 2


def test_a_write_that_changed_nothing_is_not_taken_for_the_writer_of_a_placeholder() -> None:
    b = clean()
    # A write through slo-api whose replica was killed before it answered: recorded by the
    # others as `unknown` via slo-api; then a write conditional on that version changed nothing.
    lost = b.change("chat", {"priority": 2}, manager="slo-api")
    b.recording.requests.remove(lost)
    _revisions(b)[-1].object["data"].update(actor="unknown", via="slo-api")
    b.put("chat", {"priority": 2}, noop=True, if_match=f'"{b.rv}"')
    assert validate(b.finish()) == []
