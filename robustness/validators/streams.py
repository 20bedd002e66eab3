"""The change stream: each watcher's sequence, across its resumes, is ordered, unique and
reliable against the ground truth it may see, shows nothing it may not, and ends current."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from robustness.model import (
    RESOURCES,
    REVISIONS,
    Ground,
    during_fault,
    fault_windows,
    item_owned,
    shown,
)
from robustness.recording import GAP, Recording, Stream
from robustness.validators.base import Violation

PROMISE = (
    "every watcher sees every change it may see, in order, once (a resume on another replica "
    "may repeat the change it resumes at), never what it may not, and resumes exactly after "
    "its last revision"
)
AMBIGUOUS = "ambiguous"
# Each kind's own resource (its informer's), as the truth names it.
_PLURALS = {kind: plural for plural, kind in RESOURCES.items()}


@dataclass(slots=True)
class Step:
    time: float
    value: Any  # the owned fields the view shows, None (no route) or AMBIGUOUS


def _visible(recording: Recording, identity: str, namespace: str) -> bool:
    spaces = (recording.settings.get("identities", {}).get(identity) or {}).get("namespaces")
    return spaces is None or namespace in spaces


def timelines(
    recording: Recording, ground: Ground, identity: str, view: str, kind: str | None
) -> dict[str, list[Step]]:
    """Each route's successive values as one watcher may see them."""
    states = sorted((s for h in ground.states.values() for s in h), key=lambda s: (s.rv, s.time))
    live: dict[str, Any] = {}
    out: dict[str, list[Step]] = defaultdict(list)
    touched_routes: set[str] = set()
    for s in states:
        if s.deleted:
            live.pop(s.uid, None)
        else:
            live[s.uid] = s
        touched_routes.add(s.route)
        for route in {s.route}:
            claim = [
                c
                for c in live.values()
                if c.route == route and _visible(recording, identity, c.namespace)
            ]
            if not route or not claim:
                value: Any = None
            elif len(claim) > 1:
                value = AMBIGUOUS
            elif kind is not None and claim[0].kind != kind:
                value = None
            else:
                value = shown(claim[0].kind, claim[0].owned, view)
            steps = out[route]
            if not steps or steps[-1].value != value:
                steps.append(Step(s.time, value))
    return out


def _sessions(recording: Recording) -> dict[str, dict[int, list[Stream]]]:
    by: dict[str, dict[int, list[Stream]]] = defaultdict(lambda: defaultdict(list))
    for record in recording.streams:
        by[record.watcher][record.session].append(record)
    return by


def streams(recording: Recording, ground: Ground) -> list[Violation]:
    found: list[Violation] = []
    windows = fault_windows(recording)
    lag = float(recording.settings.get("truth_lag_seconds", 5.0))
    kinds = {s.route: s.kind for h in ground.states.values() for s in h}
    spaces: dict[str, set[str]] = defaultdict(set)
    for h in ground.states.values():
        for s in h:
            spaces[s.route].add(s.namespace)
    moved = _other_informers(recording)
    # Each (identity, view, kind)'s timelines, made once: a long run has thousands of sessions.
    known: dict[tuple[str, str, str | None], dict[str, list[Step]]] = {}
    for watcher, sessions in _sessions(recording).items():
        pointer: dict[str, int] = {}
        # Per route, older states like the one the pointer took a line for (the route went A,
        # B, A), newest first: a stream's first line of a route may have shown one of them (a
        # replica behind at the open, a resume's replay). The route's next line tells which.
        alike: dict[str, list[int]] = {}
        last_item: dict[str, Any] = {}
        recent: list[str] = []
        for number in sorted(sessions):
            records = sessions[number]
            opened = next((r for r in records if r.what == "open"), None)
            if opened is None or opened.status != 200:
                if opened is not None and opened.since is None:
                    pointer.clear()
                continue
            resumed = opened.since is not None
            alike.clear()
            if not resumed:
                pointer.clear()
                last_item.clear()
            key = (opened.identity, opened.view, opened.kind)
            tl = known.get(key)
            if tl is None:
                tl = known[key] = timelines(recording, ground, *key)
            initial = not resumed
            seen: set[tuple[str, str]] = set()
            first_here: set[str] = set()

            def flag(
                message: str,
                route: str | None,
                line: Stream,
                number: int = number,
                recent: list[str] = recent,
                tl: dict[str, list[Step]] = tl,
                pointer: dict[str, int] = pointer,
            ) -> None:
                # The route's truth around the state the watcher held, to tell a replica's
                # fault from one of this validator's reading.
                at = pointer.get(route or "")
                steps = tl.get(route or "", []) if at is not None else []
                truth = [
                    f"truth t={s.time:.3f} {'held ' if i == at else ''}{s.value}"
                    for i, s in enumerate(steps)
                    if at is not None and at - 3 <= i <= at + 3
                ]
                found.append(
                    Violation(
                        "streams",
                        PROMISE,
                        f"watcher {line.watcher} session {number} on {line.replica} "
                        f"({line.identity}): {message}",
                        route,
                        [*recent[-6:], f"t={line.time:.3f} {line.line}", *truth],
                    )
                )

            for record in records:
                if record.what == "close" and record.reason == "end":
                    found.extend(_ended(watcher, number, tl, pointer, record))
                if record.what != "line" or record.line is None:
                    continue
                line = record.line
                kind_of_line = line.get("type")
                if kind_of_line == "BOOKMARK":
                    if line.get("initial"):
                        initial = False
                    continue
                if kind_of_line not in ("ADDED", "MODIFIED", "DELETED"):
                    continue
                route = str(line.get("route"))
                obj = line.get("object") or {}
                recent.append(
                    f"t={record.time:.3f} {record.replica} {kind_of_line} {route} "
                    f"{line.get('revision')}"
                )
                if obj.get("ambiguous"):
                    continue
                if spaces.get(route) and not any(
                    _visible(recording, opened.identity, ns) for ns in spaces[route]
                ):
                    flag("shows a route of a namespace it may not see", route, record)
                    continue
                revision = line.get("revision")
                if not initial and revision is None:
                    flag("a change without a revision", route, record)
                if revision is not None:
                    if (route, revision) in seen:
                        flag(f"the change at revision {revision} came twice", route, record)
                    seen.add((route, str(revision)))
                kind = kinds.get(route) or str(obj.get("kind"))
                value = (
                    None
                    if kind_of_line == "DELETED"
                    else shown(kind, item_owned(kind, obj), opened.view)
                )
                steps = tl.get(route, [])
                at = pointer.get(route)
                if at is None:
                    candidates = [i for i, st in enumerate(steps) if st.value == value]
                    # The latest such state the harness had seen by then; else the first (the
                    # harness's watch may trail the replica's).
                    early = [i for i in candidates if steps[i].time <= record.time]
                    if not candidates:
                        if not ground.in_gap(float("-inf"), record.time + lag):
                            flag(f"shows {value}, a state the route never had", route, record)
                        continue
                    pointer[route] = early[-1] if early else candidates[0]
                    # Or an older like one, where the replica may not yet have seen the state
                    # after it (it came at most `lag` before, or during a fault).
                    alike[route] = [
                        i
                        for i in early[-2::-1]
                        if record.time - steps[i + 1].time <= lag
                        or during_fault(windows, steps[i + 1].time, record.time)
                    ]
                else:
                    later = [i for i in range(at, len(steps)) if steps[i].value == value]
                    older = alike.pop(route, [])
                    # (each before the state the pointer took, so one follows it)
                    follows = [i for i in older if steps[i + 1].value == value]
                    if follows and later[:1] not in ([at], [at + 1]):
                        # The route's last line showed the older like state: this follows it.
                        pointer[route] = follows[0] + 1
                        last_item[route] = obj
                        continue
                    if resumed and route not in first_here and later[:1] != [at + 1]:
                        elsewhere = [
                            t
                            for ns in spaces.get(route, ())
                            for t, resource in moved.get(ns, ())
                            if resource != _PLURALS.get(kind)
                        ]
                        back = _replayed(steps, at, value, windows, elsewhere, lag)
                        if back is not None and later[:1] == [at]:
                            # Like the state held: the same again, or an older one like it
                            # (the route went A, B, A) that a replay starts at.
                            alike[route] = [back]
                        elif back is not None:
                            # A resume elsewhere from a revision that stood before a relist,
                            # or before another informer's change, sends, in order, the
                            # changes from that version on again
                            # (docs/api.md): the route's place goes back to where it starts.
                            pointer[route] = back
                            last_item[route] = obj
                            first_here.add(route)
                            continue
                    if not later and ground.in_gap(steps[at].time, record.time + lag):
                        # A state made while the harness's watch was broken: not in its truth.
                        last_item[route] = obj
                        continue
                    if not later:
                        flag(
                            f"shows {value} after {steps[at].value if at < len(steps) else None}:"
                            " out of order, or a state that never followed",
                            route,
                            record,
                        )
                        continue
                    j = later[0]
                    repeat_ok = resumed and route not in first_here
                    if j == at and last_item.get(route) == obj and not repeat_ok:
                        flag("the same change twice", route, record)
                    elif j > at + 1 and not during_fault(windows, steps[at + 1].time, record.time):
                        skipped = [steps[i].value for i in range(at + 1, j)]
                        flag(f"a gap: never showed {skipped}", route, record)
                    pointer[route] = j
                last_item[route] = obj
                first_here.add(route)
    return found


def _other_informers(recording: Recording) -> dict[str, list[tuple[float, str]]]:
    """Per namespace, when each change the truth shows came and through which resource: the
    informers beside a route's own kind whose changes move its line (its `SLOLimits`, a pool,
    the other kind or API group)."""
    out: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for t in recording.truth:
        if t.resource == REVISIONS or t.event == GAP:
            continue
        namespace = (t.object.get("metadata") or {}).get("namespace")
        if namespace:
            out[str(namespace)].append((t.time, t.resource))
    return out


def _replayed(
    steps: list[Step],
    at: int,
    value: Any,
    windows: list[tuple[float, float]],
    elsewhere: list[float],
    lag: float,
) -> int | None:
    """The state a resumed stream's replay starts at: an earlier state of the route with
    `value`, sent again by a replica resuming from a revision that had not reached a version
    (docs/api.md): within the fault (a relist) that the state the watcher held falls in; or
    the state that stood when another informer's change (`elsewhere`: the namespace's caps,
    a pool...) came, which the revision's replica had not brought yet, an informer lagging
    another by at most `lag` or through a fault."""
    held = steps[at].time
    for i in range(at - 1, -1, -1):
        if steps[i].value != value:
            continue
        if any(s <= steps[i].time and held <= e for s, e in windows):
            return i
        end = steps[i + 1].time
        if any(
            steps[i].time <= t < end and (held - t <= lag or during_fault(windows, t, held))
            for t in elsewhere
        ):
            return i
        return None
    return None


def _ended(
    watcher: str, number: int, tl: dict[str, list[Step]], pointer: dict[str, int], end: Stream
) -> list[Violation]:
    """A stream open until after the settle period holds every route as it finally is."""
    found = []
    for route, steps in sorted(tl.items()):
        final = steps[-1].value
        if final == AMBIGUOUS:
            continue
        at = pointer.get(route)
        held = steps[at].value if at is not None else None
        if held != final:
            found.append(
                Violation(
                    "streams",
                    PROMISE,
                    f"watcher {watcher} session {number} on {end.replica} ended holding {held}; "
                    f"the route is {final}",
                    route,
                    [f"t={s.time:.3f} truth {s.value}" for s in steps[-3:]],
                )
            )
    return found
