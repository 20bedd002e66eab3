"""BoundedDict: the one bound every cache and bookkeeping map keeps; Shared: one object per
value, within a bound too."""

from __future__ import annotations

import pytest

from slo_api.bounded import BoundedDict, Shared


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


def _fresh(*parts: str) -> tuple[str, ...]:
    """A tuple equal to `parts` but not the same object (as each decoded event makes one)."""
    return tuple("".join(list(p)) for p in parts)


def test_equal_values_are_handed_back_as_the_first_one_held() -> None:
    shared: Shared[tuple[str, ...]] = Shared(4)
    first = shared.share(_fresh("argocd-controller", "Apply"))
    again = _fresh("argocd-controller", "Apply")
    assert again is not first
    assert shared.share(again) is first


def test_what_make_makes_of_a_new_value_is_held_and_handed_back() -> None:
    shared: Shared[tuple[str, ...]] = Shared(4)
    made = shared.share(_fresh("a", "b"), lambda v: tuple(p.upper().lower() for p in v))
    assert made == ("a", "b")
    assert shared.share(_fresh("a", "b"), lambda v: pytest.fail("made twice")) is made


def test_a_full_shared_holds_at_most_its_bound_and_still_shares_what_comes_after() -> None:
    shared: Shared[tuple[str, ...]] = Shared(3)
    for i in range(10):
        shared.share(_fresh(str(i)))
        assert len(shared) <= 3
    newest = shared.share(_fresh("x"))
    assert shared.share(_fresh("x")) is newest


def test_a_shared_of_no_room_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Shared(0)
