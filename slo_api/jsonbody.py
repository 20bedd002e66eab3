"""Parse a request body as strict JSON: one object, no duplicate keys, NaN, oversized numbers
or lone surrogates."""

from __future__ import annotations

import json
from typing import Any

from slo_api.errors import ApiError, invalid

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_DEPTH = 32
MAX_ITEMS = 1024


def _has_lone_surrogate(text: str) -> bool:
    # JSON's \uXXXX escapes can name half of a surrogate pair, which is no character: nothing
    # downstream (orjson, the API server, a log line) can encode it.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _surrogate(where: str) -> ApiError:
    return invalid(f"{where} holds a lone surrogate (\\ud800-\\udfff): send whole characters")


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if _has_lone_surrogate(key):
            raise _surrogate("a key of the JSON body")
        if key in obj:
            raise invalid(f"duplicate key {key!r} in the JSON body", field=key)
        obj[key] = value
    return obj


def _constant(name: str) -> Any:
    raise invalid(f"{name} is not a JSON number")


class _TooLarge:
    """An integer outside int64, kept as text until its place in the body is known."""

    def __init__(self, text: str) -> None:
        self.text = text


def _int(text: str) -> int | _TooLarge:
    # Checked by length first: int() of a text past 4300 digits raises ValueError.
    if len(text.lstrip("-")) > 19:
        return _TooLarge(text)
    value = int(text)
    return value if INT64_MIN <= value <= INT64_MAX else _TooLarge(text)


def _path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def _check_shape(value: Any, depth: int = 0, path: str = "") -> None:
    if isinstance(value, _TooLarge):
        raise invalid(f"the number {value.text[:30]} is too large", field=path or None)
    if isinstance(value, str):
        if _has_lone_surrogate(value):
            raise _surrogate(f"the string at {path}" if path else "a string of the JSON body")
        return
    if depth > MAX_DEPTH:
        raise invalid(f"the JSON body is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        items: list[tuple[str | int, Any]] = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return
    if len(value) > MAX_ITEMS:
        raise invalid(f"the JSON body has a list or object of more than {MAX_ITEMS} items")
    for key, item in items:
        _check_shape(item, depth + 1, _path(path, key))


def parse_object(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise invalid("the request body is empty: send a JSON object")
    try:
        text = raw.decode("utf-8")
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant, parse_int=_int)
    except UnicodeDecodeError:
        raise invalid("the request body is not UTF-8") from None
    except RecursionError:
        raise invalid(f"the JSON body is nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise invalid(
            f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if not isinstance(value, dict):
        raise invalid("the request body must be a JSON object")
    _check_shape(value)
    return value
