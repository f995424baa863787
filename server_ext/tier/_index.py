"""Which keys a tier holds: LRU order, a byte budget and soft TTL pins."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = ["KeyIndex"]


@dataclass(slots=True)
class _Entry:
    nbytes: int
    pinned_until: float


class KeyIndex:
    """An LRU set of keys with sizes, bounded by ``budget_bytes`` (None: unbounded).

    A pin (from a hint's ttl) is soft: pinned keys are evicted only when every
    unpinned key is gone, least recently used first either way.
    """

    def __init__(
        self, budget_bytes: int | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.budget_bytes = budget_bytes
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.bytes_used = 0

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def leading(self, keys: Sequence[str]) -> int:
        """How many of ``keys``, from the first, are present."""
        for i, key in enumerate(keys):
            if key not in self._entries:
                return i
        return len(keys)

    def touch(self, keys: Iterable[str]) -> None:
        for key in keys:
            if key in self._entries:
                self._entries.move_to_end(key)

    def add(self, key: str, nbytes: int, pin_s: float = 0.0) -> list[str]:
        """Insert (or refresh) ``key``; return the keys evicted to stay in budget.

        The result contains ``key`` itself when it alone exceeds the budget.
        """
        until = self._clock() + pin_s if pin_s > 0 else 0.0
        entry = self._entries.get(key)
        if entry is not None:
            entry.pinned_until = max(entry.pinned_until, until)
            self._entries.move_to_end(key)
            return []
        if self.budget_bytes is not None and nbytes > self.budget_bytes:
            return [key]
        self._entries[key] = _Entry(nbytes, until)
        self.bytes_used += nbytes
        evicted: list[str] = []
        budget = self.budget_bytes
        while budget is not None and self.bytes_used > budget:
            victim = self._victim(key)
            self.remove([victim])
            evicted.append(victim)
        return evicted

    def remove(self, keys: Iterable[str]) -> None:
        for key in keys:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self.bytes_used -= entry.nbytes

    def _victim(self, newest: str) -> str:  # never ``newest``: it fits alone
        now = self._clock()
        pinned: str | None = None
        for key, entry in self._entries.items():
            if key == newest:
                continue
            if entry.pinned_until <= now:
                return key
            pinned = pinned or key
        assert pinned is not None
        return pinned
