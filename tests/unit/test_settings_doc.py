"""docs/operating.md's settings table is generated from `Settings` and cannot drift from it."""

from __future__ import annotations

import pytest
from pydantic.fields import FieldInfo

from release.docs import BEGIN, END, OPERATING, _accepts, _default, table, update
from slo_api.settings import Settings


def test_the_settings_table_matches_settings() -> None:
    text = OPERATING.read_text()
    assert update(text) == text, "docs/operating.md's settings table drifted: run `make docs`"


def test_every_setting_has_one_row_with_its_default() -> None:
    rows = [line for line in table().splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [name.upper() for name in Settings.model_fields]
    port = next(row for row in rows if row.startswith("| `PORT`"))
    assert "| `8080` | integer >= 1, <= 65535 |" in port
    level = next(row for row in rows if row.startswith("| `LOG_LEVEL`"))
    assert "`debug`, `info`, `warning`, `error`" in level


def test_a_pipe_in_a_description_does_not_split_its_cell() -> None:
    row = next(line for line in table().splitlines() if line.startswith("| `SLO_API_TOKENS_FILE`"))
    assert "read\\|write" in row
    assert row.replace("\\|", "").count("|") == 5


def test_an_edited_table_is_put_back() -> None:
    text = OPERATING.read_text()
    edited = text.replace("| `PORT` | `8080`", "| `PORT` | `9090`")
    assert edited != text
    assert update(edited) == text


def test_without_the_markers_nothing_is_written() -> None:
    with pytest.raises(ValueError, match="markers"):
        update(OPERATING.read_text().replace(BEGIN, ""))
    with pytest.raises(ValueError, match="markers"):
        update(OPERATING.read_text().replace(END, ""))


def test_a_list_setting_is_shown_as_the_environment_spells_it() -> None:
    assert _default(("argocd-controller", "helm")) == "`argocd-controller,helm`"
    assert _default(()) == "—"
    assert _accepts(FieldInfo(annotation=tuple[str, ...], default=())) == "a comma-separated list"
