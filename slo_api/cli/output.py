"""Rendering: tables and key/value views for people, JSON and YAML for scripts."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import yaml

from slo_api.cli.keys import BOUND_FIELDS, METRIC_SECTIONS

FORMATS = ("table", "json", "yaml")
MISSING = "-"

# What a terminal may act on rather than show: C0 and C1 controls (escape sequences, bells,
# carriage returns), DEL, and the bidirectional overrides that reorder what is shown.
_OTHER_UNSAFE = "\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\x00-\x1f{_OTHER_UNSAFE}]")
# In a JSON or YAML document newlines are its layout; inside strings the encoders escape them.
_UNSAFE_IN_DOCUMENT = re.compile(f"[\x00-\x09\x0b-\x1f{_OTHER_UNSAFE}]")


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def printable(text: str) -> str:
    """`text` with everything a terminal would act on shown as an escape (`\\x1b`)."""
    return _UNSAFE.sub(lambda m: _escape(m.group()), text)


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    # Double quotes wherever a character needs escaping: YAML has escapes only there.
    style = '"' if _UNSAFE.search(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(data: Any, fmt: str) -> str:
    """JSON or YAML with every unsafe character escaped (both encoders leave some as is)."""
    if fmt == "yaml":
        text: str = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True)
        return _UNSAFE_IN_DOCUMENT.sub(_json_escape, text.rstrip("\n"))
    # In JSON output such characters can only be inside strings, where \\uXXXX is one.
    text = json.dumps(data, indent=2, ensure_ascii=False)
    return _UNSAFE_IN_DOCUMENT.sub(_json_escape, text)


def scalar(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def bound(value: Any) -> str:
    if isinstance(value, dict) and "value" in value:
        return f"{value.get('type') or 'replica'}:{scalar(value['value'])}"
    return MISSING if value is None else scalar(value)


# -- list ------------------------------------------------------------------------------------

# The column sloctl shows for each summary field it shows. Which fields a kind's summaries hold
# is the server's to say (`SloClient.summary_fields`); the kinds that hold the same fields share
# their columns.
COLUMNS = {
    "priority": "PRIORITY",
    "minimumDeployment": "MIN",
    "maximumDeployment": "MAX",
    "swapPolicy": "POLICY",
    "swapBudget": "BUDGET",
    "residentMember": "RESIDENT",
}
Shape = dict[str, list[str]]


def _shown(shape: Shape, kind: Any) -> tuple[str, ...]:
    return tuple(name for name in shape.get(kind, []) if name in COLUMNS) if kind else ()


def _groups(shape: Shape) -> list[tuple[tuple[str, ...], set[str]]]:
    """The column groups: each set of shown fields, and the kinds whose summaries hold it."""
    groups: dict[tuple[str, ...], set[str]] = {}
    for kind in shape:
        if fields := _shown(shape, kind):
            groups.setdefault(fields, set()).add(kind)
    return list(groups.items())


def _value(value: Any) -> str:
    return MISSING if value is None or value == "" else bound(value)


def summaries_table(items: Sequence[dict[str, Any]], shape: Shape) -> str:
    """One row per route; a column group appears only when some row's kind holds it."""
    kinds = {k for item in items for k in (item.get("kinds") or [item.get("kind")])}
    groups = [(fields, of) for fields, of in _groups(shape) if of & kinds]
    header = ["ROUTE", "KIND"] + [COLUMNS[name] for fields, _ in groups for name in fields]
    rows = [header]
    for item in items:
        row = [scalar(item.get("route", MISSING)), _kind_cell(item)]
        for fields, of in groups:
            mine = item.get("kind") in of
            row += [_value(item.get(name)) if mine else MISSING for name in fields]
        rows.append(row)
    return columns(rows)


def _kind_cell(item: dict[str, Any]) -> str:
    if item.get("ambiguous"):
        kinds = item.get("kinds") or []
        count = item.get("count")
        # No spaces, so the table still splits on whitespace.
        return f"ambiguous({count}:{','.join(map(str, kinds))})"
    return _cell(item.get("kind"))


def _cell(value: Any) -> str:
    return MISSING if value is None or value == "" else scalar(value)


def columns(rows: Sequence[Sequence[str]]) -> str:
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def event_line(event: dict[str, Any], shape: Shape) -> str:
    """One change as a line: TYPE ROUTE KIND and the route's summary fields."""
    item = event.get("object") if isinstance(event.get("object"), dict) else {}
    assert isinstance(item, dict)
    cells = [f"{scalar(event.get('type', MISSING)):<8}", scalar(event.get("route", MISSING))]
    cells.append(_kind_cell(item))
    if not item.get("ambiguous"):
        cells += [
            f"{COLUMNS[name].lower()}={_value(item.get(name))}"
            for name in _shown(shape, item.get("kind"))
        ]
    return "  ".join(cells)


# -- get ---------------------------------------------------------------------------------------


def flatten(body: dict[str, Any]) -> list[tuple[str, str]]:
    """The body as (key, value) lines whose keys are the ones `sloctl set` accepts."""
    lines: list[tuple[str, str]] = []
    for key, value in body.items():
        _flatten(key, value, lines)
    return lines


def _flatten(key: str, value: Any, lines: list[tuple[str, str]]) -> None:
    section = key.split(".", 1)[0]
    if key in BOUND_FIELDS and (value is None or isinstance(value, dict)):
        lines.append((key, "null" if value is None else bound(value)))
    elif isinstance(value, dict) and value:
        for child, child_value in value.items():
            if section in METRIC_SECTIONS and child == "metrics" and _is_metric_list(child_value):
                lines.extend(
                    (f"{key}.{m['type']}", scalar(m.get("threshold"))) for m in child_value
                )
            else:
                _flatten(f"{key}.{child}", child_value, lines)
    elif isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        for index, item in enumerate(value):
            _flatten(f"{key}.{index}", item, lines)
    elif isinstance(value, list) and value:
        lines.append((key, ", ".join(map(scalar, value))))
    else:
        lines.append((key, "[]" if value == [] else "{}" if value == {} else scalar(value)))


def _is_metric_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and "type" in m for m in value)
    )


def key_values(pairs: Iterable[tuple[str, str]], indent: str = "") -> str:
    pairs = [(printable(key), printable(value)) for key, value in pairs]
    if not pairs:
        return ""
    width = max(len(key) for key, _ in pairs)
    return "\n".join(f"{indent}{key.ljust(width)}  {value}".rstrip() for key, value in pairs)


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """`key  old -> new` lines for what differs between two bodies, status aside.

    All fields, not only those sent: the server derives some (highPriority from priority).
    """
    old = {k: v for k, v in flatten(before) if not k.startswith("status.")}
    new = {k: v for k, v in flatten(after) if not k.startswith("status.")}
    keys = list(old) + [k for k in new if k not in old]
    pairs = [
        (key, f"{old.get(key, '(unset)')} -> {new.get(key, '(unset)')}")
        for key in keys
        if old.get(key) != new.get(key)
    ]
    return key_values(pairs, indent="  ").splitlines()


# -- history ---------------------------------------------------------------------------------


def _change(change: dict[str, Any]) -> str:
    field, old, new = str(change.get("field")), change.get("from"), change.get("to")
    if isinstance(old, dict | list) or isinstance(new, dict | list):
        word = "set" if old is None else "removed" if new is None else "changed"
        return f"{field} {word}"
    return f"{field} {_cell(old)}->{_cell(new)}"


def history_table(entries: Sequence[dict[str, Any]]) -> str:
    """One line per change, newest first: ID TIME ACTOR VIA CHANGES. An entry carried over
    from an earlier version's ConfigMap (a store namespace editors could write) says so
    beside its actor."""
    rows = [["ID", "TIME", "ACTOR", "VIA", "CHANGES"]]
    for entry in entries:
        changes = entry.get("changes") or []
        actor = _cell(entry.get("actor"))
        rows.append(
            [
                _cell(entry.get("id")),
                _cell(entry.get("time")),
                f"{actor} (migrated)" if entry.get("migrated") is True else actor,
                _cell(entry.get("via")),
                ", ".join(_change(c) for c in changes if isinstance(c, dict)) or MISSING,
            ]
        )
    return columns(rows)


# -- attainment --------------------------------------------------------------------------------

# How each metric's threshold reads: TTFT at most T seconds, OTPS at least T tokens a second,
# a job's queue at most maxDepth.
_SIGN = {"ttft": ("<=", "s"), "otps": (">=", "/s"), "queue": ("<=", "")}


def _figure(value: Any, unit: str) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return MISSING
    return f"{value:.3g}{unit}"


def _target(objective: dict[str, Any]) -> str:
    sign, unit = _SIGN.get(str(objective.get("metric")), ("", ""))
    kind = objective.get("type")
    name = "" if kind == "maxDepth" else _cell(kind)
    return f"{name}{sign}{_figure(objective.get('threshold'), unit)}"


def _budget(value: Any) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return MISSING
    return f"{value * 100:.1f}%"


def _range(value: Any) -> str:
    if isinstance(value, dict):
        low = value.get("contextLengthRangeLow", value.get("low"))
        high = value.get("contextLengthRangeHigh", value.get("high"))
        return f"[{_cell(low)},{'' if high is None else scalar(high)})"
    return _cell(value)


def _status(objective: dict[str, Any]) -> str:
    """The status, with why when there is no data (`no_data(no_series)`)."""
    status = _cell(objective.get("status"))
    reason = objective.get("reason")
    return f"{status}({reason})" if isinstance(reason, str) and reason else status


def _exhausts(value: Any) -> str:
    """The sooner forecast of when the budget runs out, with the burn rate's window."""
    if not isinstance(value, dict):
        return MISSING
    found = sorted((at, window) for window, at in value.items() if isinstance(at, str))
    return f"{found[0][0]}({found[0][1]})" if found else MISSING


def attainment_rows(item: dict[str, Any]) -> list[list[str]]:
    """One route's table rows: each objective, then each target that cannot be measured.

    A route with nothing to show is one row: with the source's status when it could not be
    asked (not configured, or unavailable before any good answer).
    """
    route = _cell(item.get("route"))
    source = item.get("source") if isinstance(item.get("source"), dict) else {}
    assert isinstance(source, dict)
    rows: list[list[str]] = []
    for obj in item.get("objectives") or []:
        if not isinstance(obj, dict):
            continue
        _, unit = _SIGN.get(str(obj.get("metric")), ("", ""))
        observed = _figure(obj.get("observed"), unit)
        if obj.get("estimated") and observed != MISSING:
            observed = "~" + observed
        rows.append(
            [
                route,
                _cell(obj.get("metric")),
                _target(obj),
                observed,
                _budget(obj.get("budgetRemaining")),
                _status(obj),
                _exhausts(obj.get("exhaustsAt")),
            ]
        )
    for gap in item.get("unmeasured") or []:
        if isinstance(gap, dict):
            where = _range(gap.get("range"))
            rows.append(
                [route, _cell(gap.get("metric")), where, MISSING, MISSING, "unmeasured", MISSING]
            )
    if not rows:
        # Nothing to measure says nothing; a source that could not be asked says why.
        said = _cell(None if source.get("status") == "ok" else source.get("status"))
        rows.append([route, MISSING, MISSING, MISSING, MISSING, said, MISSING])
    return rows


def attainment_table(items: Sequence[dict[str, Any]]) -> str:
    rows = [["ROUTE", "METRIC", "TARGET", "OBSERVED", "BUDGET", "STATUS", "EXHAUSTS"]]
    for item in items:
        rows.extend(attainment_rows(item))
    return columns(rows)


def source_notes(items: Sequence[dict[str, Any]]) -> list[str]:
    """What to say of the figures' source when stale or unavailable: why, and how old they are.

    Once per distinct reason: every route reads the same Prometheus.
    """
    routes: dict[str, list[str]] = {}
    for item in items:
        source = item.get("source")
        if not isinstance(source, dict) or source.get("status") not in ("unavailable", "stale"):
            continue
        as_of = source.get("asOf")
        kept = f"figures as of {scalar(as_of)}" if as_of else "no figures yet"
        said = "stale" if source["status"] == "stale" else "Prometheus unavailable"
        note = f"{said} ({_cell(source.get('reason'))}); {kept}"
        routes.setdefault(note, []).append(_cell(item.get("route")))
    return [
        f"{names[0]}: {note}" if len(names) == 1 else f"{note} ({len(names)} routes)"
        for note, names in routes.items()
    ]
