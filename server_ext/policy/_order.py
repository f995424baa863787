"""Indexes of the live retentions that keep every policy operation cheap.

The policy runs on vLLM's scheduler thread, between engine steps: sorting
every retention to find a victim, or scanning them all for one due back, would
grow with whatever tenants create. These indexes answer in O(log n) per
answer and are updated in O(log n) per change, with nothing stale to rebuild.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ._heap import IndexedHeap
from ._keys import BranchKey
from ._retention import Retention

__all__ = ["DueIndex", "Rank", "VictimOrder", "victim_rank"]

Rank = tuple[int, float, int, float]
"""Victim order, smallest first (see ``victim_rank``)."""


def victim_rank(r: Retention, now: float) -> Rank:
    """Where ``r`` stands in victim order at ``now``: branches away first,
    furthest predicted next use first (Belady with predictions), then higher
    ``prio`` number, then oldest; then branches whose request has arrived and
    waits, latest arrival first (the queue serves the earliest first)."""
    if r.arrived_at is None:
        return (0, -r.next_use(now), -r.prio, r.retained_at)
    return (1, -r.arrived_at, -r.prio, r.retained_at)


class VictimOrder:
    """Retentions of one scope (all, or one tenant's) in victim order.

    A branch away is ranked by its predicted next use when it was last
    ``set``; that only grows while the branch stays away, so the policy sets
    it again at a few points of each gap.

    Invariants: each live retention of the scope is in the heap once, at the
    rank it was last set to.
    """

    def __init__(self) -> None:
        self._heap = IndexedHeap[BranchKey]()

    def __len__(self) -> int:
        return len(self._heap)

    def set(self, key: BranchKey, rank: Rank) -> None:
        self._heap.set(key, rank)

    def remove(self, key: BranchKey) -> None:
        self._heap.remove(key)

    @contextmanager
    def scan(self, rank_of: Callable[[BranchKey], Rank | None]) -> Iterator[Iterator[BranchKey]]:
        """The scope's retentions in victim order, for as long as the caller
        reads; afterwards each one read is back at ``rank_of(key)`` unless
        that is None (the caller released it)."""
        with self._heap.scan(rank_of) as keys:
            yield keys


class DueIndex:
    """One tenant's branches away, by planned return: is one due back near a
    given time? (Warm-first admission asks per waiting request per step.)

    Invariants: ``_entries`` is sorted and holds ``(expected return, key)``
    for exactly the tenant's retentions whose ``due_at`` is set.
    """

    def __init__(self) -> None:
        self._entries: list[tuple[float, BranchKey]] = []

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, r: Retention) -> None:
        r.due_at = r.expected_return
        bisect.insort(self._entries, (r.due_at, r.key))

    def discard(self, r: Retention) -> None:
        if r.due_at is None:
            return
        entry = (r.due_at, r.key)
        i = bisect.bisect_left(self._entries, entry)
        if i < len(self._entries) and self._entries[i] == entry:
            del self._entries[i]
        r.due_at = None

    def any_within(self, low: float, high: float, other_than: BranchKey) -> bool:
        """Whether a branch other than ``other_than`` is planned back in
        ``[low, high]`` (at most two entries are looked at)."""
        entries = self._entries
        i = bisect.bisect_left(entries, (low,))
        for expected, key in entries[i : i + 2]:
            if expected > high:
                return False
            if key != other_than:
                return True
        return False
