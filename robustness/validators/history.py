"""The route history: every change of a client-owned field exactly once, in order, with the
right actor; nothing for a change that never happened; one history per CR; the bound kept."""

from __future__ import annotations

import itertools

from robustness.model import (
    WRITES,
    Ground,
    Revision,
    State,
    acknowledged,
    answered_version,
    during_fault,
    fault_windows,
    item_owned,
    route_of_path,
)
from robustness.recording import KUBE, Recording, Request
from robustness.validators.base import Violation, around, describe_request, describe_state
from robustness.validators.writes import made_by

PROMISE = (
    "every change of a route's client-owned fields is exactly one revision, in order, with the "
    "right actor; no revision for a change that never happened; re-created CRs keep separate "
    "histories; the retention bound holds"
)
UNKNOWN = "unknown"
# How long after a write a fault on its replica may take the write's event with it (the writer
# died before recording: the others record it as `unknown` via slo-api).
DIED_WITHIN = 30.0
APISERVER = "apiserver"  # the target of the API server's faults


def _changes(
    before: dict[str, object], after: dict[str, object]
) -> dict[str, tuple[object, object]]:
    return {
        f: (before.get(f), after.get(f))
        for f in sorted(set(before) | set(after))
        if before.get(f) != after.get(f)
    }


def _recorded(rev: Revision) -> dict[str, tuple[object, object]]:
    return {
        str(c.get("field")): (c.get("from"), c.get("to"))
        for c in rev.data.get("changes") or []
        if isinstance(c, dict)
    }


def _writer(ground: Ground, writers: dict[int, list[Request]], state: State) -> Request | None:
    """The acknowledged write that made `state`, if any (its writer may have died unanswered;
    a write that changed nothing answers the version that stood: see made_by)."""
    before = ground.previous(state)
    candidates = writers.get(state.rv, [])
    if before is None:
        return candidates[0] if candidates else None
    return next((r for r in candidates if made_by(writers, r, before, state)), None)


def _expected_actor(recording: Recording, writer: Request) -> str:
    identity = recording.settings.get("identities", {}).get(writer.identity) or {}
    return str(identity.get("actor", writer.identity))


def _actor_problem(
    recording: Recording, rev: Revision, state: State, writer: Request | None
) -> str | None:
    actor, via = rev.data.get("actor"), rev.data.get("via")
    if rev.across and actor == UNKNOWN:
        return None  # a relist's gap holds other writers' changes: nobody is named
    if writer is None:
        if via == "slo-api" and actor != UNKNOWN:
            ids = {
                r.sent_header("X-Request-Id")
                for r in recording.requests
                if r.replica != KUBE and r.method in WRITES and answered_version(r) is None
            }
            if rev.data.get("clientRequestId") not in ids:
                return f"names slo-api caller {actor!r}, but no slo-api write made this change"
        return None
    if writer.replica == KUBE:
        manager = writer.identity
        if actor == via == manager:
            return None
        holds = any(m.get("manager") == manager for m in state.managers)
        if actor == UNKNOWN and not holds:
            return None
        return f"actor {actor!r} via {via!r}; the change was made by field manager {manager!r}"
    expected = _expected_actor(recording, writer)
    sent_id = writer.sent_header("X-Request-Id")
    if via == "slo-api" and actor == expected and rev.data.get("clientRequestId") == sent_id:
        return None
    if via == "slo-api" and actor == UNKNOWN:
        # The writer's replica died, or its watches broke (its own faults, or the API
        # server's: a relist), before it recorded its own change: the others record it
        # `unknown` (docs/api.md, the route history).
        died = any(
            f.target in (writer.replica, APISERVER)
            and writer.sent - DIED_WITHIN / 2 <= f.start <= writer.sent + DIED_WITHIN
            for f in recording.faults
        )
        if died:
            return None
    return (
        f"actor {actor!r} via {via!r} clientRequestId {rev.data.get('clientRequestId')!r}; "
        f"the change was made through slo-api by {expected!r} with X-Request-Id {sent_id!r}"
    )


def history(recording: Recording, ground: Ground) -> list[Violation]:
    found: list[Violation] = []
    windows = fault_windows(recording)
    writers = acknowledged(recording)

    def violation(message: str, state: State, extra: list[str] | None = None) -> None:
        found.append(
            Violation(
                "history", PROMISE, message, state.route, (extra or []) + around(ground, state)
            )
        )

    revisions_of: dict[str, dict[int, Revision]] = {}
    for each in ground.revisions.values():
        revisions_of.setdefault(each.uid, {})[each.id] = each
    for uid, states in ground.states.items():
        by_id = revisions_of.get(uid, {})
        versions = {s.rv for s in states}
        for held in by_id.values():
            if held.id not in versions and not _gapped(states, held.id):
                found.append(
                    Violation(
                        "history",
                        PROMISE,
                        f"revision {held.id} of uid {uid[:8]} names a version that CR never had",
                        states[0].route,
                        [f"revision {held.data}", *(describe_state(s) for s in states[-3:])],
                    )
                )
        if not states:
            continue
        last = states[0].owned
        missing: State | None = None
        # A revision created once its CR is gone is nobody's to read (the garbage collector
        # removes it): a late placeholder for a deleted CR is not held against its actor.
        gone = states[-1].time if states[-1].deleted else None
        for s in states[1:]:
            if s.deleted:
                break
            rev = by_id.get(s.rv)
            if rev is not None:
                after = item_owned(s.kind, rev.data.get("after") or {})
                if after != s.owned:
                    violation(f"revision {rev.id} says the fields became {after}", s)
            if s.after_gap:
                last, missing = s.owned, None
                continue
            if rev is None:
                if s.owned != last and missing is None:
                    missing = s
                continue
            expected, recorded = _changes(last, s.owned), _recorded(rev)
            if rev.across:
                # Made across a relist's gap: the difference from the last state its replica
                # observed, which may be older than the previous revision (docs/api.md); what
                # it says the fields became must be so.
                wrong = {f: to for f, (_, to) in recorded.items() if to != s.owned.get(f)}
                if wrong or not recorded:
                    violation(f"revision {rev.id}, made across a relist, records {recorded}", s)
            elif not expected:
                violation(f"revision {rev.id} records {recorded}: a change that never happened", s)
            elif recorded != expected:
                folded = missing is not None and during_fault(windows, missing.time, s.time)
                if missing is not None and not folded:
                    violation(
                        f"no revision for the change at rv {missing.rv}: "
                        f"revision {rev.id} records {recorded}, expected {expected}",
                        missing,
                    )
                elif missing is None:
                    violation(f"revision {rev.id} records {recorded}, expected {expected}", s)
            writer = _writer(ground, writers, s)
            problem = _actor_problem(recording, rev, s, writer)
            if problem is not None and not (gone is not None and rev.time >= gone):
                violation(
                    f"wrong actor in revision {rev.id}: {problem}",
                    s,
                    [describe_request(writer)] if writer else [],
                )
            last, missing = s.owned, None
        if missing is not None:
            violation(f"no revision for the change at rv {missing.rv}", missing)
    found += _reads(recording, ground)
    found += _retention(recording, ground, revisions_of)
    return found


def _gapped(states: list[State], rv: int) -> bool:
    return any(
        states[i].after_gap and states[i - 1].rv < rv < states[i].rv for i in range(1, len(states))
    )


def _repeats(rev: Revision, revs: dict[int, Revision], ground: Ground) -> bool:
    before = max((i for i in revs if i < rev.id), default=None)
    if not rev.across or before is None:
        return False
    state, previous = ground.by_rv.get(rev.id), ground.by_rv.get(before)
    return state is not None and previous is not None and state.owned == previous.owned


def _reads(recording: Recording, ground: Ground) -> list[Violation]:
    """Each history read shows one CR's revisions only (a re-created CR starts over), and
    each change once: no entry at a state the CR reached without leaving the fields of the
    entry before it (a relist's revision that folds changes another replica recorded one
    by one)."""
    found: list[Violation] = []
    for r in recording.requests:
        bare = r.path.split("?", 1)[0]
        if r.method != "GET" or not bare.endswith("/history") or r.status != 200:
            continue
        items = (r.response_body or {}).get("items") or []
        read: list[State] = []
        for item in items:
            ident = str(item.get("id", ""))
            state = ground.by_rv.get(int(ident)) if ident.isdigit() else None
            if state is not None:
                read.append(state)
        route = route_of_path(bare.removesuffix("/history"))
        uids = {s.uid for s in read}
        if len(uids) > 1:
            found.append(
                Violation(
                    "history",
                    PROMISE,
                    f"one history read mixes the revisions of {len(uids)} CRs",
                    route,
                    [describe_request(r)],
                )
            )
            continue
        read.sort(key=lambda s: s.rv)
        for older, newer in itertools.pairwise(read):
            between = [s for s in ground.states.get(older.uid, []) if older.rv < s.rv <= newer.rv]
            if all(s.owned == older.owned and not s.after_gap for s in between):
                found.append(
                    Violation(
                        "history",
                        PROMISE,
                        f"one history read shows the change at rv {older.rv} again at rv "
                        f"{newer.rv}, where nothing client-owned changed",
                        route,
                        [describe_request(r), describe_state(older), describe_state(newer)],
                    )
                )
    return found


def _retention(
    recording: Recording, ground: Ground, revisions_of: dict[str, dict[int, Revision]]
) -> list[Violation]:
    limit = int(recording.settings.get("history_entries", 20))
    # A revision stored of a CR whose generation may have passed the bound is followed by a
    # prune to it from a list of all the CR's revisions (slo_api/history/revisions.py): once
    # the run has settled, a CR holds more only if its newest revision's replica may have
    # stopped before pruning (a fault under way then).
    windows = fault_windows(recording)
    found: list[Violation] = []
    for uid, revs in revisions_of.items():
        states = ground.states.get(uid) or []
        if not states or states[-1].deleted:
            continue
        kept = sorted(r.id for r in revs.values() if r.deleted is None)
        # A revision made across a relist's gap that repeats the one before it (the CR's
        # fields the same at both) is deleted whenever it is found, not pruned by age.
        dropped = [
            r.id for r in revs.values() if r.deleted is not None and not _repeats(r, revs, ground)
        ]
        problems = []
        newest = max((r.time for r in revs.values()), default=0.0)
        if len(kept) > limit and not during_fault(windows, newest, newest):
            problems.append(f"{len(kept)} revisions kept, the bound is {limit}")
        if kept and dropped and max(dropped) > kept[0]:
            problems.append(f"revision {max(dropped)} was pruned before older {kept[0]}")
        for problem in problems:
            found.append(
                Violation("history", PROMISE, problem, states[-1].route, [states[-1].where()])
            )
    return found
