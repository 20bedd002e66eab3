"""`sloctl set` assignments: parse ``key=value`` and apply it to a route body.

Keys are dotted paths into the body as `sloctl get` shows it. Shortcuts:

- ``min``/``max`` stand for ``minimumDeployment``/``maximumDeployment``; a bound's value is ``N``
  (type replica) or ``TYPE:N``.
- Under ``ttft``/``otps``, a last segment naming a metric type (``ttft.default.p90``,
  ``ttft.ranges.0.p99``) sets that metric's threshold in the ``metrics`` list, adding it when
  absent; ``null`` removes it.
- A numeric segment indexes a list (``ttft.ranges.0``); the index one past the end appends.
  Missing objects and lists on the way are created.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from slo_api.cli.errors import usage

METRIC_TYPES = frozenset({"avg", "p50", "p80", "p90", "p95", "p99"})
METRIC_SECTIONS = frozenset({"ttft", "otps"})
BOUND_ALIASES = {"min": "minimumDeployment", "max": "maximumDeployment"}
BOUND_FIELDS = frozenset(BOUND_ALIASES.values())

# Fields a route shows that no write changes, and who changes them instead.
READ_ONLY = {
    "limits": "a platform admin sets the route's limits (its namespace's SLOLimits `default`)",
    "overLimits": "it lists the fields stored beyond the route's limits",
    "overLimitBounds": "it gives the bound of each value stored beyond the route's limits",
    "managed": "it names the GitOps tool that owns a field",
}
# Fields that are always strings: "pool.default=7" names a member called "7", not the number 7.
STRING_FIELDS = frozenset(
    {
        ("queue", "promql"),
        ("pool", "default"),
        ("pool", "swapPolicy"),
        ("pool", "swapBudget"),
        ("pool", "reclaimAfter"),
    }
)

# ASCII digits only (\d is any script's), and no more than an int64 has.
_BOUND = re.compile(r"(?P<type>[A-Za-z]+):(?P<value>-?[0-9]{1,19})")


@dataclass(frozen=True)
class Assignment:
    path: tuple[str, ...]
    value: Any
    text: str  # as typed, for error messages


def parse_assignment(text: str) -> Assignment:
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise usage(f"{text!r}: expected key=value")
    path = tuple(key.split("."))
    if not all(path):
        raise usage(f"{text!r}: empty segment in key {key!r}")
    path = (BOUND_ALIASES.get(path[0], path[0]), *path[1:])
    if path[0] in READ_ONLY:
        raise usage(f"{text!r}: {path[0]} is read-only: {READ_ONLY[path[0]]}")
    value = parse_string(raw) if path in STRING_FIELDS else parse_value(raw)
    if len(path) == 1 and path[0] in BOUND_FIELDS:
        value = parse_bound(value, text)
    return Assignment(path, value, text)


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON and the API refuses them; keep them as the text typed.
    raise ValueError(name)


def parse_value(raw: str) -> Any:
    """JSON where the text is JSON (numbers, true/false, null, "strings", [], {}), else text."""
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except ValueError:
        return raw


def parse_string(raw: str) -> str | None:
    if raw == "null":
        return None
    if raw.startswith('"'):
        value = parse_value(raw)
        if isinstance(value, str):
            return value
    return raw


def parse_bound(value: Any, text: str) -> Any:
    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return {"type": "replica", "value": value}
    if isinstance(value, str) and (match := _BOUND.fullmatch(value.strip())):
        return {"type": match["type"], "value": int(match["value"])}
    raise usage(f"{text!r}: a bound is N or TYPE:N, e.g. 2, replica:2, pdengine:1")


def apply_assignment(body: dict[str, Any], assignment: Assignment) -> None:
    """Apply one assignment to `body` in place."""
    path, value, text = assignment.path, assignment.value, assignment.text
    if path[0] in METRIC_SECTIONS and len(path) >= 3 and path[-1] in METRIC_TYPES:
        holder = _walk(body, path[:-1], path, text)
        if not isinstance(holder, dict):
            raise usage(f"{text!r}: {'.'.join(path[:-1])} does not hold metrics")
        _set_metric(holder, path[-1], value, text)
        return
    parent = _walk(body, path[:-1], path, text)
    if not isinstance(parent, dict | list):
        raise usage(f"{text!r}: {'.'.join(path[:-1])} is not an object")
    _put(parent, path[-1], value, text)


def _walk(node: Any, path: tuple[str, ...], full_path: tuple[str, ...], text: str) -> Any:
    """Follow `path`, creating what it names when missing or null (a list before an index)."""
    for depth, segment in enumerate(path):
        where = ".".join(path[: depth + 1])
        # What to create if `segment` is missing: a list when the next segment indexes it.
        following = full_path[depth + 1]
        if isinstance(node, dict):
            child = node.get(segment)
            if child is None:
                child = node[segment] = [] if _digits(following) else {}
            node = child
        elif isinstance(node, list):
            index = _index(node, segment, text, where, allow_append=True)
            if index == len(node):
                node.append({})
            node = node[index]
        else:
            raise usage(f"{text!r}: {'.'.join(path[:depth]) or 'the body'} is not an object")
    return node


def _put(parent: dict[str, Any] | list[Any], key: str, value: Any, text: str) -> None:
    if isinstance(parent, dict):
        parent[key] = value
        return
    index = _index(parent, key, text, key, allow_append=True)
    if index == len(parent):
        parent.append(value)
    else:
        parent[index] = value


def _digits(segment: str) -> bool:
    # isdigit() would take "²", which int() refuses, and isdecimal() alone Arabic-Indic digits.
    return segment.isascii() and segment.isdecimal()


def _index(items: list[Any], segment: str, text: str, where: str, *, allow_append: bool) -> int:
    limit = len(items) + (1 if allow_append else 0)
    # No int() of more digits than the limit has (int() refuses over 4300 of them).
    if not _digits(segment) or len(segment.lstrip("0")) > len(str(limit)) or int(segment) >= limit:
        raise usage(f"{text!r}: {where!r} needs a list index below {limit}")
    return int(segment)


def _set_metric(holder: dict[str, Any], metric: str, threshold: Any, text: str) -> None:
    metrics = holder.get("metrics")
    if metrics is None:
        metrics = holder["metrics"] = []
    if not isinstance(metrics, list):
        raise usage(f"{text!r}: metrics is not a list")
    for position, entry in enumerate(metrics):
        if isinstance(entry, dict) and entry.get("type") == metric:
            if threshold is None:
                del metrics[position]
            else:
                entry["threshold"] = threshold
            return
    if threshold is not None:
        metrics.append({"type": metric, "threshold": threshold})


def changed_fields(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Top-level fields whose JSON differs (1 and 1.0 and true are different to the API)."""
    return [
        key
        for key in after
        if key not in before or _canonical(before[key]) != _canonical(after[key])
    ]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=repr)
