"""What is stored and what each replica serves: convergence, guardrails, liveness."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from robustness.model import (
    Ground,
    State,
    during_fault,
    etag_version,
    fault_windows,
    item_owned,
    query,
)
from robustness.recording import KUBE, Obj, Recording
from robustness.validators.base import Violation, around, describe_request

CONVERGENCE = (
    "each replica's index equals the API server within seconds of the last fault ending "
    "(every route, every client-owned field, the resourceVersion)"
)
GUARDRAILS = (
    "no stored CR beyond its namespace's caps, except where the ratchet or an exemption allows"
)
LIVENESS = (
    "every request is answered; no 5xx except the documented 502/503/504 while the API server "
    "or the replica is failing"
)
READS = "a read never shows a route its caller may not see (a namespace outside its grants)"
READINESS = (
    "readiness never claims a replica is ready while its index is incomplete: the view it "
    "serves once /readyz says 200 holds every route the API server held throughout its start, "
    "with its namespace's limits"
)
# The phases of the requests around a replica's (re)start: its /readyz polled until 200, then
# its full view read.
STARTING, READY = "starting", "ready"
# The 5xx a request may get while a fault is under way: not_ready/unavailable, upstream
# errors and timeouts (docs/api.md, Errors).
DURING_FAULTS = (502, 503, 504)


def convergence(recording: Recording, ground: Ground) -> list[Violation]:
    """The final `/config?view=full` pages of each replica against the last ground truth, and
    the ETag of each final route read (the version the replica's index holds) against the
    last stored resourceVersion."""
    found: list[Violation] = []
    pages: dict[str, dict[str, Any]] = defaultdict(dict)
    versions: dict[str, dict[str, int | None]] = defaultdict(dict)
    for r in recording.requests:
        if r.phase != "final" or r.method != "GET" or r.status != 200:
            continue
        if r.path.startswith("/routes/") and "?" not in r.path and r.path.count("/") == 2:
            versions[r.replica][r.path.split("/")[2]] = etag_version(r.header("ETag"))
            continue
        if not r.path.startswith("/config?") or query(r.path).get("view") != "full":
            continue
        for item in (r.response_body or {}).get("items") or []:
            pages[r.replica][str(item.get("route"))] = item
    if not pages:
        return []
    live: dict[str, list[State]] = defaultdict(list)
    for s in ground.last_states():
        if s.route:
            live[s.route].append(s)
    last_fault = max((f.end or f.start for f in recording.faults), default=None)
    for replica, items in sorted(pages.items()):
        when = max(
            r.sent for r in recording.requests if r.phase == "final" and r.replica == replica
        )
        since = f"{when - last_fault:.1f} s after the last fault ended" if last_fault else ""
        for route in sorted(set(items) | set(live)):
            claim, item = live.get(route, []), items.get(route)
            if item is None:
                problem = "missing from its /config" if claim else None
            elif not claim:
                problem = "listed, but no CR claims it"
            elif len(claim) > 1:
                problem = None if item.get("ambiguous") else "not shown as ambiguous"
            elif item.get("ambiguous"):
                problem = "shown as ambiguous, one CR claims it"
            else:
                shows = item_owned(claim[0].kind, item)
                problem = None if shows == claim[0].owned else f"shows {shows}"
                version = versions[replica].get(route, claim[0].rv)
                if problem is None and version != claim[0].rv:
                    problem = f"serves resourceVersion {version}, stored {claim[0].rv}"
            if problem is not None:
                context = [describe_state(s) for s in claim] if claim else []
                found.append(
                    Violation(
                        "convergence",
                        CONVERGENCE,
                        f"replica {replica} {since}: {problem}",
                        route,
                        context or [f"item {item}"],
                    )
                )
    return found


def describe_state(s: State) -> str:
    return f"truth {s.where()}: {s.owned}"


def _values(cap: str, spec: dict[str, Any]) -> list[float]:
    if cap == "maxPriority":
        return [spec.get("priority", 0)]
    if cap in ("maxReplicas", "maxPDEngines"):
        bound = spec.get("maximumDeployment")
        wanted = "replica" if cap == "maxReplicas" else "pdengine"
        if isinstance(bound, dict) and bound.get("type", "replica") == wanted:
            return [bound.get("value", 0)]
        return []
    if cap == "maxQueueDepth":
        queue = spec.get("queue")
        return [queue.get("maxDepth", 0)] if isinstance(queue, dict) else []
    section = spec.get("ttft" if cap == "minTTFTSeconds" else "otps")
    if not isinstance(section, dict):
        return []
    sets = [section.get("default") or {}, *(section.get("ranges") or [])]
    return [m["threshold"] for s in sets for m in s.get("metrics") or [] if "threshold" in m]


CAPS_OF = {
    "llm": ("maxPriority", "maxReplicas", "maxPDEngines", "minTTFTSeconds", "maxOTPS"),
    "job": ("maxPriority", "maxReplicas", "maxQueueDepth"),
}


def _within(cap: str, limit: float, new: list[float], old: list[float]) -> bool:
    """The policy's rule (config/guardrails/policy.yaml), ratchet included."""
    if cap == "minTTFTSeconds":
        return all(t >= limit or any(o <= t for o in old) for t in new)
    if cap == "maxOTPS":
        return all(t <= limit or any(o >= t for o in old) for t in new)
    stored = old[0] if old else 0
    return all(t <= limit or t <= stored for t in new)


def guardrails(recording: Recording, ground: Ground) -> list[Violation]:
    found: list[Violation] = []
    exempt = set(recording.settings.get("exempt_namespaces", []))
    lag = float(recording.settings.get("admission_lag_seconds", 2.0))
    for history in ground.states.values():
        for at, s in enumerate(history):
            if s.deleted or s.kind not in CAPS_OF or s.namespace in exempt:
                continue
            before = history[at - 1] if at > 0 else None
            if before is not None and before.spec == s.spec:
                continue  # admission never rechecks what is stored
            versions = ground.limits.get(s.namespace, [])
            # The caps in effect when it was written, and those of moments before (the API
            # server's admission reads its parameters from a cache that may trail).
            current = [c for rv, _, c in versions if rv < s.rv][-1:]
            recent = [c for rv, t, c in versions if rv < s.rv and t >= s.time - lag]
            # And those in force when the lag began (the caps a trailing cache still held).
            then = [c for rv, t, c in versions if rv < s.rv and t < s.time - lag][-1:]
            options = [c or {} for c in current + recent + then] or [{}]
            old_spec = before.spec if before is not None and not before.after_gap else None
            if old_spec is None and before is not None:
                continue  # the change across a gap cannot be judged
            broken: list[str] = []
            for caps in options:
                broken = [
                    cap
                    for cap in CAPS_OF[s.kind]
                    if isinstance(caps.get(cap), int | float)
                    and not _within(
                        cap, caps[cap], _values(cap, s.spec), _values(cap, old_spec or {})
                    )
                ]
                if not broken:
                    break
            if broken:
                found.append(
                    Violation(
                        "guardrails",
                        GUARDRAILS,
                        f"stored beyond {broken} of {options[0]}",
                        s.route,
                        around(ground, s),
                    )
                )
    return found


def liveness(recording: Recording, ground: Ground) -> list[Violation]:
    found: list[Violation] = []
    windows = fault_windows(recording)
    for r in recording.requests:
        if r.replica == KUBE or r.phase == STARTING:
            continue  # a replica starting refuses connections, then answers 503: its due
        end = r.answered or r.sent
        faulty = during_fault(windows, r.sent, end)
        if r.status is None:
            if not faulty:
                found.append(
                    Violation("liveness", LIVENESS, "no answer", None, [describe_request(r)])
                )
        elif r.status >= 500 and not (faulty and r.status in DURING_FAULTS):
            found.append(
                Violation("liveness", LIVENESS, f"answered {r.status}", None, [describe_request(r)])
            )
    for record in recording.streams:
        failed = record.what == "open" and record.status is not None and record.status >= 500
        if failed and not (
            during_fault(windows, record.time, record.time) and record.status in DURING_FAULTS
        ):
            found.append(
                Violation(
                    "liveness",
                    LIVENESS,
                    f"watcher {record.watcher} opened a stream: {record.status}",
                    None,
                    [f"t={record.time:.3f} {record.replica} since={record.since}"],
                )
            )
    return found


def readiness(recording: Recording, ground: Ground) -> list[Violation]:
    """Each replica's full view read once its /readyz said 200 after a (re)start, against
    the routes every CR claimed throughout, from the first poll of that start to the read
    (the truth's lag either side), and the limits its namespace had throughout."""
    lag = float(recording.settings.get("truth_lag_seconds", 5.0))
    found: list[Violation] = []
    starts: dict[str, list[tuple[float, float, dict[str, Any]]]] = defaultdict(list)
    for r in sorted(recording.requests, key=lambda r: r.sent):
        if r.phase == STARTING:
            held = starts[r.replica]
            if not held or held[-1][2]:  # the first poll of a new start
                held.append((r.sent, r.sent, {}))
        elif r.phase == READY and r.status == 200 and starts[r.replica]:
            start, _, items = starts[r.replica][-1]
            for item in (r.response_body or {}).get("items") or []:
                items[str(item.get("route"))] = item
            starts[r.replica][-1] = (start, r.answered or r.sent, items)
    for replica, held in sorted(starts.items()):
        for start, end, items in held:
            if not items:
                continue
            low, high = start - lag, end + lag
            if any(low <= gap <= high for gap in ground.gaps):
                continue  # the truth's own watch broke: what stood is not known
            when = f"replica {replica} ready at t={end:.3f} (starting from t={start:.3f})"
            for s in _throughout(ground, low, high):
                item = items.get(s.route)
                problem = None
                if item is None:
                    problem = "missing from the view it served"
                elif s.kind in CAPS_OF and not item.get("ambiguous"):
                    caps = _limits_throughout(ground, s.namespace, low, high) or {}
                    wanted = {k: v for k, v in caps.items() if k in CAPS_OF[s.kind]}
                    shown = item.get("limits") or {}
                    if any(shown.get(k) != v for k, v in wanted.items()):
                        problem = f"shows limits {shown or None}, its namespace had {wanted}"
                if problem is not None:
                    found.append(
                        Violation(
                            "readiness",
                            READINESS,
                            f"{when}: {problem}",
                            s.route,
                            around(ground, s),
                        )
                    )
    return found


def _throughout(ground: Ground, low: float, high: float) -> list[State]:
    """The state of each CR that stood, unchanged in route and undeleted, from `low` to
    `high`."""
    stood = []
    for history in ground.states.values():
        before = [s for s in history if s.time <= low]
        if not before or before[-1].deleted or not before[-1].route:
            continue
        during = [s for s in history if low < s.time <= high]
        if all(not s.deleted and s.route == before[-1].route for s in during):
            stood.append(before[-1])
    return stood


def _limits_throughout(ground: Ground, namespace: str, low: float, high: float) -> Obj | None:
    """The namespace's caps where they stood unchanged from `low` to `high`, else None."""
    versions = ground.limits.get(namespace, [])
    before = [c for _, t, c in versions if t <= low]
    if not before or not before[-1] or any(low < t <= high for _, t, _ in versions):
        return None
    return before[-1]


def reads(recording: Recording, ground: Ground) -> list[Violation]:
    """Every 2xx read by an identity limited to namespaces (a route, its history, a /config
    page) against the namespaces of the CRs that ever claimed the routes it shows."""
    found: list[Violation] = []
    identities = recording.settings.get("identities") or {}
    for r in recording.requests:
        allowed = (identities.get(r.identity) or {}).get("namespaces")
        if r.replica == KUBE or r.method != "GET" or allowed is None or r.status != 200:
            continue
        bare = r.path.split("?", 1)[0]
        if bare.startswith("/routes/"):
            routes = [bare.split("/")[2]]
        elif bare == "/config":
            routes = [str(i.get("route")) for i in (r.response_body or {}).get("items") or []]
        else:
            continue
        for route in routes:
            places = {s.namespace for s in ground.claimants(route)}
            if places and not places & set(allowed):
                found.append(
                    Violation(
                        "reads",
                        READS,
                        f"{r.identity} (namespaces {allowed}) was shown it, of {sorted(places)}",
                        route,
                        [describe_request(r)],
                    )
                )
    return found
