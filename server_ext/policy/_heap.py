"""An addressable binary heap: a priority queue whose entries can be re-ranked and removed."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

__all__ = ["IndexedHeap"]

K = TypeVar("K", bound=Hashable)


class IndexedHeap(Generic[K]):
    """Keys ordered by a priority (any comparable tuple), the smallest first.

    Unlike ``heapq`` with lazy deletion, re-ranking and removing a key are
    O(log n) and leave nothing stale behind, so no operation ever pays for a
    rebuild: the policy's per-step work stays bounded whatever the load.

    Invariants: ``_items`` is a binary min-heap of ``(priority, key)``;
    ``_pos[key]`` is the index of that key's item; each key appears once.
    """

    def __init__(self) -> None:
        self._items: list[tuple[Any, K]] = []
        self._pos: dict[K, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._pos

    def set(self, key: K, priority: Any) -> None:
        """Insert ``key``, or move it to ``priority``."""
        i = self._pos.get(key)
        if i is None:
            self._items.append((priority, key))
            self._pos[key] = len(self._items) - 1
            self._up(len(self._items) - 1)
            return
        old = self._items[i][0]
        self._items[i] = (priority, key)
        if priority < old:
            self._up(i)
        else:
            self._down(i)

    def remove(self, key: K) -> None:
        """Drop ``key`` if present."""
        i = self._pos.pop(key, None)
        if i is None:
            return
        last = self._items.pop()
        if i < len(self._items):
            self._items[i] = last
            self._pos[last[1]] = i
            if i > 0 and last[0] < self._items[(i - 1) >> 1][0]:
                self._up(i)
            else:
                self._down(i)

    def peek(self) -> tuple[Any, K] | None:
        """The smallest ``(priority, key)``, or None when empty."""
        return self._items[0] if self._items else None

    def smallest_other(self, key: K) -> Any:
        """The smallest priority of a key other than ``key`` (None if none)."""
        items = self._items
        if not items:
            return None
        if items[0][1] != key:
            return items[0][0]
        rest = [items[c][0] for c in (1, 2) if c < len(items)]
        return min(rest) if rest else None

    def clear(self) -> None:
        self._items.clear()
        self._pos.clear()

    def pop(self) -> tuple[Any, K]:
        """Remove and return the smallest ``(priority, key)`` (IndexError if empty)."""
        item = self._items[0]
        self.remove(item[1])
        return item

    @contextmanager
    def scan(self, back: Callable[[K], Any]) -> Iterator[Iterator[K]]:
        """The keys in priority order, taken off the heap one by one as the
        caller reads them (O(log n) each); when the scan ends, each key read
        goes back at the priority ``back(key)`` gives, unless that is None
        (the caller dropped it)."""
        read: list[K] = []

        def keys() -> Iterator[K]:
            while self._items:
                key = self.pop()[1]
                read.append(key)
                yield key

        try:
            yield keys()
        finally:
            for key in read:
                priority = back(key)
                if priority is not None:
                    self.set(key, priority)

    def _up(self, i: int) -> None:
        items, pos = self._items, self._pos
        item = items[i]
        while i > 0:
            parent = (i - 1) >> 1
            if not item[0] < items[parent][0]:
                break
            items[i] = items[parent]
            pos[items[i][1]] = i
            i = parent
        items[i] = item
        pos[item[1]] = i

    def _down(self, i: int) -> None:
        items, pos = self._items, self._pos
        n = len(items)
        item = items[i]
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            if child + 1 < n and items[child + 1][0] < items[child][0]:
                child += 1
            if not items[child][0] < item[0]:
                break
            items[i] = items[child]
            pos[items[i][1]] = i
            i = child
        items[i] = item
        pos[item[1]] = i
