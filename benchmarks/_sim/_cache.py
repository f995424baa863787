"""The device's paged KV pool: prefix caching by block key, vLLM's eviction order.

As vLLM's ``BlockPool``: a block a running request uses has a reference; a
block nobody references stays cached and *free*, in a queue an allocation
evicts from its head; a finished request frees its blocks tail first, so a
chain loses its end first. Keys are content (a block key names its whole
prefix), so the cache is a dict of keys, and the free queue a heap of
(order, key) entries made stale lazily: every operation is O(log n).

Retention acts through ``BlockPort`` as the extension's default port
(``server_ext._pool.ShelfPort``) does: a held block stays free and in its
place, and an allocation that reaches it sets it aside; only when nothing
else is free does it take the set-aside blocks, oldest first. (ShelfPort's
books, which apply the order only while it beats plain LRU, are not
modelled: here the order always applies.)

``order`` replaces LRU's place in the queue: Belady's rule gives each freed
block its next use, furthest first.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence

__all__ = ["DevicePool"]


class DevicePool:
    """``capacity`` blocks; ``order(key)``: the free queue's key for a block
    freed now (smaller is evicted first), default: when it was freed."""

    releases_for_room = False  # BlockPort: held blocks stay free (ShelfPort)

    def __init__(self, capacity: int, order: Callable[[int], float] | None = None) -> None:
        self.capacity = capacity
        self._order = order
        self._ref: dict[int, int] = {}  # resident key -> running references
        self._pending: set[int] = set()  # allocated, not yet computed
        self._stamp: dict[int, tuple[float, int]] = {}  # free resident key -> its queue entry
        self._held: dict[int, int] = {}  # retention holds
        self._queue: list[tuple[float, int, int]] = []
        self._aside: list[tuple[float, int, int]] = []
        self._tick = itertools.count()
        self._anon = 0  # slots of partial and decode blocks, no key
        self.evictions = 0

    # -- lookups

    def hit(self, keys: Sequence[int], limit: int) -> int:
        """Leading blocks of ``keys`` (at most ``limit``) cached and computed."""
        ref, pending = self._ref, self._pending
        n = 0
        for key in keys:
            if n == limit or key not in ref or key in pending:
                break
            n += 1
        return n

    def free_blocks(self) -> int:
        """Blocks an allocation may take: empty ones and cached free ones
        (held ones included, as vLLM counts them)."""
        return self.capacity - len(self._ref) - self._anon + len(self._stamp)

    # -- a request's blocks

    def acquire(self, keys: Sequence[int], anon: int) -> bool:
        """Reference ``keys``, allocating those not resident (to be computed
        or loaded) and ``anon`` keyless blocks; False (nothing changed) if
        they do not fit."""
        ref, stamp = self._ref, self._stamp
        fresh = [k for k in keys if k not in ref]
        if len(fresh) + anon > self.free_blocks() - sum(1 for k in keys if k in stamp):
            return False
        for key in keys:  # first reference what is resident, so nothing of it is evicted
            count = ref.get(key)
            if count is not None:
                if count == 0:
                    del stamp[key]
                ref[key] = count + 1
        for key in fresh:
            self._take_slot()
            ref[key] = 1
            self._pending.add(key)
        for _ in range(anon):
            self._take_slot()
        self._anon += anon
        return True

    def computed(self, keys: Sequence[int]) -> None:
        """The request computed (or loaded) ``keys``: others may hit them now."""
        self._pending.difference_update(keys)

    def release(self, keys: Sequence[int], anon: int) -> None:
        """A request is done with its blocks: freed tail first."""
        self._anon -= anon
        ref = self._ref
        for key in reversed(keys):
            count = ref[key] - 1
            ref[key] = count
            if count == 0:
                if key in self._pending:  # never computed: nothing to keep
                    self._pending.discard(key)
                    del ref[key]
                    continue
                self._free(key)

    def _free(self, key: int) -> None:
        place = next(self._tick) if self._order is None else self._order(key)
        entry = (place, next(self._tick), key)
        self._stamp[key] = (entry[0], entry[1])
        heapq.heappush(self._queue, entry)

    def _take_slot(self) -> None:
        if len(self._ref) + self._anon < self.capacity:
            return
        self._evict_one()

    def _evict_one(self) -> None:
        queue, stamp, held = self._queue, self._stamp, self._held
        while queue:
            place, tick, key = heapq.heappop(queue)
            if stamp.get(key) != (place, tick):
                continue
            if held.get(key):
                heapq.heappush(self._aside, (place, tick, key))
                continue
            self._drop(key)
            return
        while self._aside:
            place, tick, key = heapq.heappop(self._aside)
            if stamp.get(key) == (place, tick):
                self._drop(key)
                return
        raise RuntimeError("no free block to evict")  # acquire checked the room

    def _drop(self, key: int) -> None:
        del self._stamp[key]
        del self._ref[key]
        self.evictions += 1

    # -- BlockPort (``server_ext._holds``): retention's holds

    def hold(self, block_ids: Sequence[int]) -> None:
        held = self._held
        for b in block_ids:
            held[b] = held.get(b, 0) + 1

    def release_held(self, block_ids: Sequence[int], evict_first: bool) -> None:
        held = self._held
        for b in block_ids:
            n = held[b] - 1
            if n:
                held[b] = n
                continue
            del held[b]
            entry = self._stamp.get(b)
            if entry is None:
                continue
            if evict_first:  # an ended branch's blocks go first
                entry = (float("-inf"), next(self._tick))
                self._stamp[b] = entry
            heapq.heappush(self._queue, (entry[0], entry[1], b))


class PoolPort:
    """``server_ext._holds.BlockPort`` over a ``DevicePool``."""

    releases_for_room = False

    def __init__(self, pool: DevicePool) -> None:
        self._pool = pool

    def hold(self, block_ids: Sequence[int]) -> None:
        self._pool.hold(block_ids)

    def release(self, block_ids: Sequence[int], evict_first: bool = False) -> None:
        self._pool.release_held(block_ids, evict_first)

    def free_blocks(self) -> int:
        return self._pool.free_blocks()
