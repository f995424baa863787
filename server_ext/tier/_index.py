"""Which keys a tier holds: LRU order, a byte budget, shares per owner, soft TTL pins."""

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
    owner: str | None


class KeyIndex:
    """An LRU set of keys with sizes, bounded by ``budget_bytes`` (None: unbounded).

    A pin (from a hint's ttl) is soft: pinned keys are evicted only when every
    unpinned key is gone, least recently used first either way. With
    ``owner_budget_bytes``, the keys of one owner (a tenant) together stay
    within that share: its own keys make room for its new ones (``shed``), so
    one tenant cannot push the others' keys out.
    """

    def __init__(
        self,
        budget_bytes: int | None,
        clock: Callable[[], float] = time.monotonic,
        owner_budget_bytes: int | None = None,
    ) -> None:
        self.budget_bytes = budget_bytes
        self.owner_budget_bytes = owner_budget_bytes
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._owned: dict[str, OrderedDict[str, None]] = {}
        self._owner_bytes: dict[str, int] = {}
        self.bytes_used = 0

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def owner_bytes(self, owner: str) -> int:
        return self._owner_bytes.get(owner, 0)

    def leading(self, keys: Sequence[str]) -> int:
        """How many of ``keys``, from the first, are present."""
        for i, key in enumerate(keys):
            if key not in self._entries:
                return i
        return len(keys)

    def touch(self, keys: Iterable[str]) -> None:
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                if entry.owner is not None:
                    self._owned[entry.owner].move_to_end(key)

    def shed(self, owner: str, nbytes: int) -> list[str]:
        """Evict ``owner``'s own keys, least recently used (unpinned) first,
        until ``nbytes`` more fit in its share; the evicted keys."""
        share = self.owner_budget_bytes
        if share is None:
            return []
        evicted: list[str] = []
        while self._owned.get(owner) and self._owner_bytes[owner] + nbytes > share:
            victim = self._victim(self._owned[owner], None)
            self.remove([victim])
            evicted.append(victim)
        return evicted

    def add(self, key: str, nbytes: int, pin_s: float = 0.0, owner: str | None = None) -> list[str]:
        """Insert (or refresh) ``key``; return the keys evicted to stay in budget
        (call ``shed`` first for the owner's share).

        The result contains ``key`` itself when it alone exceeds the budget or
        its owner's share.
        """
        until = self._clock() + pin_s if pin_s > 0 else 0.0
        entry = self._entries.get(key)
        if entry is not None:
            entry.pinned_until = max(entry.pinned_until, until)
            self.touch([key])
            return []
        share = self.owner_budget_bytes if owner is not None else None
        if (self.budget_bytes is not None and nbytes > self.budget_bytes) or (
            share is not None and self.owner_bytes(owner or "") + nbytes > share
        ):
            return [key]
        self._entries[key] = _Entry(nbytes, until, owner)
        if owner is not None:
            self._owned.setdefault(owner, OrderedDict())[key] = None
            self._owner_bytes[owner] = self._owner_bytes.get(owner, 0) + nbytes
        self.bytes_used += nbytes
        evicted: list[str] = []
        budget = self.budget_bytes
        while budget is not None and self.bytes_used > budget:
            victim = self._victim(self._entries, key)
            self.remove([victim])
            evicted.append(victim)
        return evicted

    def remove(self, keys: Iterable[str]) -> None:
        for key in keys:
            entry = self._entries.pop(key, None)
            if entry is None:
                continue
            self.bytes_used -= entry.nbytes
            if entry.owner is not None:
                owned = self._owned[entry.owner]
                del owned[key]
                self._owner_bytes[entry.owner] -= entry.nbytes
                if not owned:
                    del self._owned[entry.owner], self._owner_bytes[entry.owner]

    def _victim(self, order: Iterable[str], newest: str | None) -> str:
        """The first unpinned key of ``order``, else its first key; never
        ``newest`` (it fits alone)."""
        now = self._clock()
        pinned: str | None = None
        for key in order:
            if key == newest:
                continue
            if self._entries[key].pinned_until <= now:
                return key
            pinned = pinned or key
        assert pinned is not None
        return pinned
