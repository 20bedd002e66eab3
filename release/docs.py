"""`make docs`: the settings table in docs/operating.md, generated from `Settings`.

The fields' descriptions in slo_api/settings.py are the one source of what each setting does;
the table between the two marker comments is rewritten from them, and a unit test fails when
the file differs from what this would write.
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path

from annotated_types import Ge, Gt, Le, Lt
from pydantic.fields import FieldInfo

from slo_api.settings import Settings

OPERATING = Path(__file__).resolve().parents[1] / "docs" / "operating.md"
BEGIN = (
    "<!-- settings: generated from slo_api/settings.py by `make docs`; "
    "edit the descriptions there -->"
)
END = "<!-- end of settings -->"


def _cell(text: str) -> str:
    # A `|` ends a table cell even inside a code span; GitHub takes `\|` as the character.
    return text.replace("|", "\\|").replace("\n", " ")


def _default(value: object) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, tuple | list | frozenset):
        # A list setting is written as the environment spells it: comma-separated.
        return _default(",".join(str(v) for v in value))
    return f"`{value}`"


def _accepts(field: FieldInfo) -> str:
    """What a value may be, from the field's type and bounds."""
    annotation = field.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is typing.Literal:
        return ", ".join(f"`{choice}`" for choice in typing.get_args(annotation))
    if annotation is bool:
        return "`true`, `false`"
    if annotation is Path:
        return "a path"
    if typing.get_origin(annotation) in (tuple, list, frozenset):
        return "a comma-separated list"
    if annotation is int:
        kind = "integer"
    elif annotation is float:
        kind = "number"
    else:
        return "text"
    bounds = []
    for bound in field.metadata:
        if isinstance(bound, Ge):
            bounds.append(f">= {bound.ge}")
        elif isinstance(bound, Gt):
            bounds.append(f"> {bound.gt}")
        elif isinstance(bound, Le):
            bounds.append(f"<= {bound.le}")
        elif isinstance(bound, Lt):
            bounds.append(f"< {bound.lt}")
    return " ".join([kind, ", ".join(bounds)]).strip()


def table() -> str:
    """The settings table, one row per field, in the order `Settings` declares them."""
    rows = ["| variable | default | accepts | |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        if not field.description:
            raise ValueError(f"Settings.{name} has no description: the settings table needs one")
        cells = [f"`{name.upper()}`", _default(field.default), _accepts(field), field.description]
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows) + "\n"


def update(text: str) -> str:
    """`text` with the block between the markers replaced by the current table."""
    before, begin, rest = text.partition(BEGIN + "\n")
    _, end, after = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"the markers {BEGIN!r} and {END!r} are missing")
    # Blank lines around the table, so it is not read as part of either comment's HTML block.
    return before + BEGIN + "\n\n" + table() + "\n" + END + after


def main() -> int:
    OPERATING.write_text(update(OPERATING.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
