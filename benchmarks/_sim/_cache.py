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
import operator
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence

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
        self._stamp: dict[int, int] = {}  # free resident key -> its queue entry's tick
        self._places: dict[int, float] = {}  # tick -> place, where not the tick itself
        self._held: dict[int, int] = {}  # retention holds
        # The free queue, (place, tick, key) entries, valid while the key's
        # stamp is their tick. LRU's entries are made in tick order, so they
        # queue in insertion order (``_fifo``: key -> tick, place = tick; a
        # block referenced again leaves it); entries placed otherwise
        # (Belady's order, a held block put back, an ended branch's first) in
        # a heap. Eviction takes the smaller head: the order one heap of all
        # entries would give.
        self._fifo: OrderedDict[int, int] = OrderedDict()
        self._queue: list[tuple[float, int, int]] = []
        self._aside: list[tuple[float, int, int]] = []
        self._ticks = 0  # the next entry's tick
        self._anon = 0  # slots of partial and decode blocks, no key
        self.evictions = 0

    # -- lookups

    def hit(self, keys: Sequence[int], limit: int) -> int:
        """Leading blocks of ``keys`` (at most ``limit``) cached and computed."""
        ref, pending = self._ref, self._pending
        ks = keys[:limit] if limit < len(keys) else keys
        cached: Iterator[bool] = map(ref.__contains__, ks)
        if pending:
            cached = map(operator.and_, cached, map(operator.not_, map(pending.__contains__, ks)))
        return next(itertools.compress(itertools.count(), map(operator.not_, cached)), len(ks))

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
        resident = list(filter(ref.__contains__, keys))
        fresh = list(itertools.filterfalse(ref.__contains__, keys)) if resident else list(keys)
        # Resident and free (in the free queue): in ``stamp``.
        unused = list(filter(stamp.__contains__, resident)) if stamp else []
        if len(fresh) + anon > self.free_blocks() - len(unused):
            return False
        # First reference what is resident, so nothing of it is evicted.
        ticks = list(map(stamp.pop, unused))
        if self._order is None:
            _consume(map(self._fifo.pop, unused, itertools.repeat(None)))
        if self._places:
            _consume(map(self._places.pop, ticks, itertools.repeat(None)))
        ref.update(zip(resident, map((1).__add__, map(ref.__getitem__, resident)), strict=True))
        # Each slot taken past the capacity evicts one free block.
        used, capacity, nf = len(ref) + self._anon, self.capacity, len(fresh)
        evict = max(0, min(nf, used + nf - capacity))
        used = min(used + nf, capacity) if used < capacity else used
        if anon and used >= capacity:
            evict += min(anon, used - capacity + 1)
        if evict:
            self._evict(evict)
        ref.update(dict.fromkeys(fresh, 1))
        self._pending.update(fresh)
        self._anon += anon
        return True

    def computed(self, keys: Sequence[int]) -> None:
        """The request computed (or loaded) ``keys``: others may hit them now."""
        if self._pending:
            self._pending.difference_update(keys)

    def release(self, keys: Sequence[int], anon: int) -> None:
        """A request is done with its blocks: freed tail first."""
        self._anon -= anon
        ref, pending = self._ref, self._pending
        tail_first = list(reversed(keys))
        if pending and not pending.isdisjoint(tail_first):
            self._release_one_by_one(tail_first)
            return
        counts = list(map(ref.__getitem__, tail_first))
        if counts and max(counts) > 1:  # others still use some: those stay
            shared = list(map((1).__lt__, counts))
            used = itertools.compress(tail_first, shared)
            less = map((-1).__add__, itertools.compress(counts, shared))
            ref.update(zip(used, less, strict=True))
            freed = list(itertools.compress(tail_first, map(operator.not_, shared)))
        else:
            freed = tail_first
        self._free(freed)

    def _release_one_by_one(self, tail_first: Sequence[int]) -> None:
        ref, pending = self._ref, self._pending
        freed: list[int] = []
        for key in tail_first:
            count = ref[key] - 1
            if count:
                ref[key] = count
            elif key in pending:  # never computed: nothing to keep
                pending.discard(key)
                del ref[key]
            else:
                freed.append(key)
        self._free(freed)

    def _free(self, freed: list[int]) -> None:
        """``freed`` (no reference left) join the free queue, in this order."""
        if not freed:
            return
        t0 = self._ticks
        self._ticks = t0 + len(freed)
        ticks = range(t0, self._ticks)
        self._ref.update(dict.fromkeys(freed, 0))
        self._stamp.update(zip(freed, ticks, strict=True))
        if self._order is None:
            self._fifo.update(zip(freed, ticks, strict=True))
            return
        order, places, queue = self._order, self._places, self._queue
        for key, t in zip(freed, ticks, strict=True):
            place = places[t] = order(key)
            heapq.heappush(queue, (place, t, key))

    def _evict(self, n: int) -> None:
        """Evict ``n`` free blocks: the free queue's first ones not held,
        then held ones (set aside on the way), oldest first."""
        self.evictions += n
        stamp, held, ref = self._stamp, self._held, self._ref
        fifo, queue, aside, places = self._fifo, self._queue, self._aside, self._places
        while n > 0:
            if queue and (not fifo or queue[0] < _head(fifo)):
                entry = heapq.heappop(queue)
                t, key = entry[1], entry[2]
            elif fifo:  # the common case: LRU's order
                key, t = fifo.popitem(last=False)
                entry = None
            else:
                break
            if stamp.get(key) != t:
                continue  # stale: re-referenced, re-freed or dropped since
            if held and held.get(key):
                heapq.heappush(aside, entry if entry is not None else (t, t, key))
                continue
            del stamp[key]
            if places:
                places.pop(t, None)
            del ref[key]
            n -= 1
        while n > 0 and aside:
            _, t, key = heapq.heappop(aside)
            if stamp.get(key) == t:
                self._drop(key)
                n -= 1
        if n > 0:
            raise RuntimeError("no free block to evict")  # acquire checked the room

    def _drop(self, key: int) -> None:
        t = self._stamp.pop(key)
        if self._places:
            self._places.pop(t, None)
        del self._ref[key]

    # -- BlockPort (``server_ext._holds``): retention's holds

    def hold(self, block_ids: Sequence[int]) -> None:
        held = self._held
        for b in block_ids:
            held[b] = held.get(b, 0) + 1

    def release_held(self, block_ids: Sequence[int], evict_first: bool) -> None:
        held, stamp, queue = self._held, self._stamp, self._queue
        for b in block_ids:
            n = held[b] - 1
            if n:
                held[b] = n
                continue
            del held[b]
            t = stamp.get(b)
            if t is None:
                continue
            if evict_first:  # an ended branch's blocks go first
                self._places.pop(t, None)
                self._fifo.pop(b, None)
                t = stamp[b] = self._ticks
                self._ticks += 1
                self._places[t] = float("-inf")
                heapq.heappush(queue, (float("-inf"), t, b))
            else:  # back in its place
                heapq.heappush(queue, (self._places.get(t, t), t, b))


def _head(fifo: OrderedDict[int, int]) -> tuple[float, int, int]:
    key, t = next(iter(fifo.items()))
    return (t, t, key)


def _consume(it: Iterable[object]) -> None:
    deque(it, maxlen=0)


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
