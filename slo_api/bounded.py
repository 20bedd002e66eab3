"""`BoundedDict`: a dict that holds at most `maxsize` entries, dropping the oldest first;
`Shared`: one object for each value among those recently seen.

The caches and bookkeeping maps that must not grow with traffic (rendered pages, Event budgets,
reviews, who made a change) are all this: insertion order is the age, and storing a new key
into a full map drops the one stored longest ago. Storing an existing key keeps its place; to
make an entry young again, `touch` it (or pop it and store it anew).

An OrderedDict, so that dropping the oldest is O(1) however many were dropped before (a plain
dict finds its first key by skipping the slots its deletions left, until it next resizes): a
full map costs a store what an empty one does, whatever the traffic.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
H = TypeVar("H", bound=Hashable)


class BoundedDict(OrderedDict[K, V]):
    """Only `d[key] = value` and `setdefault` store: both keep the bound (`update` is refused,
    so nothing can pass it by)."""

    __slots__ = ("maxsize",)

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        super().__init__()
        self.maxsize = maxsize

    def __setitem__(self, key: K, value: V) -> None:
        if len(self) >= self.maxsize and key not in self:
            self.popitem(last=False)
        super().__setitem__(key, value)

    def touch(self, key: K) -> None:
        """Make a held entry the youngest (the last to be dropped)."""
        self.move_to_end(key)

    def setdefault(self, key: K, default: V) -> V:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: object, **kwargs: object) -> None:
        raise TypeError("BoundedDict stores one key at a time (d[key] = value)")

    @property
    def full(self) -> bool:
        return len(self) >= self.maxsize


class Shared(Generic[H]):
    """Hands back, for a value, the one equal object it holds: what many CRs hold alike (the
    tuples of managedFields facts, owners, who made a change) is then held once.

    A plain dict, emptied when it reaches `maxsize`: an entry costs half what it costs an
    OrderedDict (~50 bytes, not ~100, held for each of up to `maxsize` values), and what it
    loses when emptied is only that the next equal value is held once more.
    """

    __slots__ = ("_held", "maxsize")

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self._held: dict[H, H] = {}
        self.maxsize = maxsize

    def __len__(self) -> int:
        return len(self._held)

    def share(self, value: H, make: Callable[[H], H] | None = None) -> H:
        """The object held equal to `value`; else `value` (or what `make` makes of it, equal
        to it: copies of its parts that are shared too), held from now on."""
        held = self._held.get(value)
        if held is None:
            if len(self._held) >= self.maxsize:
                self._held.clear()
            held = value if make is None else make(value)
            self._held[held] = held
        return held
