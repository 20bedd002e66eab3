"""BoundedDict: the one bound every cache and bookkeeping map keeps."""

from __future__ import annotations

import pytest

from slo_api.bounded import BoundedDict


def test_a_new_key_in_a_full_map_drops_the_oldest() -> None:
    d: BoundedDict[str, int] = BoundedDict(2)
    d["a"], d["b"] = 1, 2
    assert d.full
    d["c"] = 3
    assert d == {"b": 2, "c": 3}


def test_storing_a_held_key_keeps_its_place_and_drops_nothing() -> None:
    d: BoundedDict[str, int] = BoundedDict(2)
    d["a"], d["b"] = 1, 2
    d["a"] = 10
    assert list(d.items()) == [("a", 10), ("b", 2)]
    d["c"] = 3  # "a" is still the oldest
    assert list(d) == ["b", "c"]


def test_popped_and_stored_again_is_young() -> None:
    d: BoundedDict[str, int] = BoundedDict(2)
    d["a"], d["b"] = 1, 2
    d["a"] = d.pop("a")
    d["c"] = 3
    assert list(d) == ["a", "c"]


def test_setdefault_keeps_the_bound_and_update_is_refused() -> None:
    d: BoundedDict[str, int] = BoundedDict(1)
    assert d.setdefault("a", 1) == 1
    assert d.setdefault("a", 2) == 1
    assert d.setdefault("b", 3) == 3
    assert d == {"b": 3}
    with pytest.raises(TypeError):
        d.update({"c": 4})
    assert len(d) == 1


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        BoundedDict(0)


def test_touch_makes_an_entry_the_youngest() -> None:
    d: BoundedDict[str, int] = BoundedDict(2)
    d["a"], d["b"] = 1, 2
    d.touch("a")
    d["c"] = 3
    assert list(d) == ["a", "c"]
