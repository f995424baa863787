"""Indexes of the live retentions that keep every policy operation cheap.

The policy runs on vLLM's scheduler thread, between engine steps: sorting
every retention to find a victim, or scanning them all for one due back, would
grow with whatever tenants create. These indexes answer in O(log n) per
answer and are updated in O(log n) per change, with nothing stale to rebuild.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from ._heap import IndexedHeap
from ._keys import BranchKey
from ._retention import Retention

__all__ = ["DueIndex", "Rank", "Ranking", "VictimOrder", "victim_rank"]

Rank = tuple[int, float, int, float]
"""Victim order, smallest first (see ``victim_rank``)."""

_RERANKS_PER_CALL = 4
"""Branches re-ranked per call at most: a burst of them waits for later calls
(their ranks are a little stale meanwhile) rather than stall one."""


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


class Ranking:
    """Every live retention's place in victim order (over all tenants and in
    its tenant's), in its tenant's ``DueIndex`` while it is away, and when it
    is next re-ranked.

    A branch away ranks by its predicted next use, which grows while it stays
    away; keeping the orders current without re-sorting means re-ranking each
    branch at a few points of its gap, and those points are a heap of their
    own. This object keeps the four indexes in step, so the table and the
    evictions see one ranking.

    Invariants: each retention of ``retentions`` (the table's, shared) is in
    ``order`` and its tenant's order at its ``rank``, in its tenant's due
    index while it is away, and in ``_rerank`` while it is due to be
    re-ranked; a tenant without retentions has no order and no due index.
    """

    def __init__(self, retentions: Mapping[BranchKey, Retention]) -> None:
        self._retentions = retentions
        self.order = VictimOrder()
        self._tenant_orders: dict[str, VictimOrder] = {}
        self._due: dict[str, DueIndex] = {}
        self._rerank = IndexedHeap[BranchKey]()

    def order_of(self, tenant: str) -> VictimOrder:
        """``tenant``'s victim order."""
        order = self._tenant_orders.get(tenant)
        if order is None:
            order = self._tenant_orders[tenant] = VictimOrder()
        return order

    def index(self, r: Retention, now: float) -> None:
        """(Re-)rank ``r`` in the victim orders and the due index, and plan
        when it is next re-ranked: at its planned return, then each time the
        time it has been away doubles (its predicted next use grows)."""
        key = r.key
        r.rank = victim_rank(r, now)
        self.order.set(key, r.rank)
        self.order_of(key.tenant).set(key, r.rank)
        due = self._due.setdefault(key.tenant, DueIndex())
        due.discard(r)
        if r.arrived_at is not None:
            self._rerank.remove(key)
            return
        due.add(r)
        since = r.plan.since
        at = max(r.expected_return, since + 2 * (now - since))
        if at < r.effective_deadline:
            self._rerank.set(key, at)
        else:
            self._rerank.remove(key)

    def remove(self, r: Retention, last_of_tenant: bool) -> None:
        """Take ``r`` out of every index; with ``last_of_tenant``, its
        tenant's order and due index go too."""
        key = r.key
        self.order.remove(key)
        self._rerank.remove(key)
        if (order := self._tenant_orders.get(key.tenant)) is not None:
            order.remove(key)
        if (due := self._due.get(key.tenant)) is not None:
            due.discard(r)
        if last_of_tenant:
            self._tenant_orders.pop(key.tenant, None)
            self._due.pop(key.tenant, None)

    def rerank_due(self, now: float) -> None:
        """Re-rank (a bounded number of) the branches away whose time has come."""
        for _ in range(_RERANKS_PER_CALL):
            first = self._rerank.peek()
            if first is None or first[0] > now:
                return
            self.index(self._retentions[first[1]], now)

    def rank_back(self, key: BranchKey) -> Rank | None:
        """Where a scanned retention goes back to (None: it was released)."""
        r = self._retentions.get(key)
        return None if r is None else r.rank

    def return_due(self, low: float, high: float, other_than: BranchKey) -> bool:
        """Whether a branch of ``other_than``'s tenant (not ``other_than``
        itself, not yet arrived) is planned back in ``[low, high]``."""
        due = self._due.get(other_than.tenant)
        return due is not None and due.any_within(low, high, other_than)

    def clear(self) -> None:
        self.order = VictimOrder()
        self._tenant_orders.clear()
        self._due.clear()
        self._rerank.clear()
