"""The two ways retention acts on vLLM's block pool: by eviction order, or by reference.

Every touch point of vLLM's ``BlockPool`` is here (``blocks``,
``free_block_queue`` with ``remove`` / ``append`` / ``prepend_n`` /
``num_free_blocks``, ``touch``, ``free_blocks``, ``get_new_blocks``,
``get_num_free_blocks``, ``KVCacheBlock.ref_cnt`` / ``block_hash`` /
``is_null``, ``kv_cache_utils.get_block_hash``); the connector picks a port and
the engine-side retention (``_engine.EngineRetention``) drives it through the
``BlockPort`` interface.

- ``ShelfPort`` (the default) keeps a retained branch's blocks *free*, in
  their place in vLLM's LRU free queue; an allocation that reaches one sets it
  aside instead of evicting it. vLLM counts them as free, so no allocation,
  admission or preemption decision differs from plain vLLM's; only which free
  block an allocation evicts does. When nothing unprotected is left, the
  allocation asks the retention to give blocks up (its victim order). It also
  keeps the books of what this order gained and cost against plain LRU
  (``EvictionPayoff``).
- ``HoldPort`` takes a block reference per retained block (the pool never
  evicts it); the connector must then give references back before vLLM would
  preempt (``KVCacheManager.allocate_slots`` wrapped).
"""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .policy import MAX_ROOM_CALLS, Payoff

if TYPE_CHECKING:
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

__all__ = ["EvictionPayoff", "HoldPort", "ShelfPort", "allocate_after_room"]

_T = TypeVar("_T")


class HoldPort:
    """``BlockPort`` over vLLM's ``BlockPool``: hold = touch, release = free."""

    payoff: Payoff | None = None  # a held block's worth is not measured

    def __init__(self, pool: BlockPool) -> None:
        self._pool = pool

    def hold(self, block_ids: Sequence[int]) -> None:
        self._pool.touch([self._pool.blocks[i] for i in block_ids])

    def release(self, block_ids: Sequence[int], evict_first: bool = False) -> None:
        # Tail first, as vLLM frees a request: the shared prefix is evicted last
        # (freed blocks join the queue's end, whatever ``evict_first`` says).
        self._pool.free_blocks([self._pool.blocks[i] for i in reversed(block_ids)])

    def free_blocks(self) -> int:
        return self._pool.get_num_free_blocks()


def allocate_after_room(
    allocate: Callable[[], _T | None], make_room: Callable[[], bool]
) -> _T | None:
    """For an allocation that failed: ``allocate()`` again each time
    ``make_room()`` released held blocks (``HoldPort``), ``MAX_ROOM_CALLS``
    times at most, since retentions sharing the blocks free them only with the
    last and one allocation could otherwise release thousands. None: still
    short, it waits a step, as in plain vLLM."""
    for _ in range(MAX_ROOM_CALLS):
        if not make_room():
            break
        blocks = allocate()
        if blocks is not None:
            return blocks
    return None


class EvictionPayoff:
    """What eviction by the retention's order gained and cost against plain LRU.

    A shadow of plain vLLM's order: each block that becomes free gets a stamp
    (its place in LRU order). When an allocation evicts a queue block while an
    older shelved block survives, plain LRU would have evicted the older one:
    that block is *saved* (LRU would have lost it) and the evicted one a
    *ghost* (LRU would still have it). A hit on a saved block is a gain; a
    request that misses on ghosts is a cost, one per ghost block its prefix
    needed. When plain LRU would evict a ghost (the oldest ghost is older than
    the block evicted now), both orders have lost it and it is dropped.

    Invariants: ``saved`` holds block ids, ``ghosts`` block hashes (oldest
    first), at most ``capacity`` each; ``payoff`` gains and costs are blocks.
    """

    def __init__(self, capacity: int, payoff: Payoff | None = None) -> None:
        self.capacity = max(capacity, 1)
        self.payoff = payoff or Payoff()
        self._clock = 0
        self._stamps: dict[int, int] = {}
        self._shelf: list[tuple[int, int]] = []  # (stamp, block id), lazily pruned
        self.saved: set[int] = set()
        self.ghosts: OrderedDict[bytes, int] = OrderedDict()

    def freed(self, block_id: int) -> None:
        """``block_id`` (with a hash) joined the free blocks: the youngest."""
        self._clock += 1
        self._stamps[block_id] = self._clock

    def stamp(self, block_id: int) -> int:
        """``block_id``'s place in LRU order (larger: freed later; 0: unknown)."""
        return self._stamps.get(block_id, 0)

    def shelved(self, block_id: int) -> None:
        stamp = self._stamps.get(block_id)
        if stamp is not None:
            heapq.heappush(self._shelf, (stamp, block_id))

    def evicted(self, block_id: int, block_hash: bytes, on_shelf: Callable[[int], bool]) -> None:
        """An allocation evicts ``block_id`` (cached as ``block_hash``) from the
        queue; ``on_shelf`` says whether a block is shelved now."""
        stamp = self._stamps.pop(block_id, None)
        self.saved.discard(block_id)
        if stamp is None:
            return
        shelf = self._shelf
        while shelf and (not on_shelf(shelf[0][1]) or self._stamps.get(shelf[0][1]) != shelf[0][0]):
            heapq.heappop(shelf)
        oldest_ghost = next(iter(self.ghosts.values()), None)
        if shelf and shelf[0][0] < stamp and (oldest_ghost is None or shelf[0][0] < oldest_ghost):
            _, kept = heapq.heappop(shelf)
            self.saved.add(kept)
            self._remember(block_hash, stamp)
        elif oldest_ghost is not None and oldest_ghost < stamp:
            self.ghosts.popitem(last=False)
            self._remember(block_hash, stamp)

    def hit(self, block_id: int) -> None:
        """A request reuses ``block_id``: a gain if plain LRU had lost it."""
        self._stamps.pop(block_id, None)
        if block_id in self.saved:
            self.saved.discard(block_id)
            self.payoff.add(gained=1.0)

    def missed(self, block_hashes: Iterable[bytes]) -> None:
        """A request computes the blocks ``block_hashes`` (its prefix past the
        cache, in order): each leading ghost among them is a block plain LRU
        would have served."""
        lost = 0
        for h in block_hashes:
            if self.ghosts.pop(h, None) is None:
                break
            lost += 1
        if lost:
            self.payoff.add(cost=float(lost))

    def _remember(self, block_hash: bytes, stamp: int) -> None:
        self.ghosts[block_hash] = stamp
        if len(self.ghosts) > self.capacity:
            self.ghosts.popitem(last=False)
        if len(self.saved) > self.capacity:  # a saved block that was never seen again
            self.saved.pop()


class ShelfPort:
    """``BlockPort`` that retains by eviction order (see the module docstring).

    A protected block keeps its place in vLLM's free queue (LRU order) while
    it waits there; only when an allocation reaches it at the queue's head is
    it set aside, onto the shelf, instead of evicted. The shelf is thus the
    oldest end of LRU order: a shelf block whose protection ends goes before
    anything in the queue, as plain LRU would have it, and each block that
    leaves the queue for the shelf is what plain LRU would have evicted
    (``EvictionPayoff`` keeps those books).

    Installs itself on ``pool`` (instance attributes over its methods); the
    retention sets ``on_short``, which ``get_new_blocks`` calls with the
    number of blocks still missing, to release retentions in victim order.

    Invariants: shelf blocks (``_kept``: protected; ``_loose``: no longer,
    oldest first) are free (``ref_cnt == 0``) and not in the free queue;
    ``pool.get_num_free_blocks()`` is the queue's count plus the shelf's; a
    block is protected while ``_protected`` counts it, and a protected shelf
    block is in ``_kept``; ``_reused`` holds the blocks a request touched (hit)
    since they were last allocated.
    """

    def __init__(self, pool: BlockPool) -> None:
        from vllm.v1.core.kv_cache_utils import get_block_hash

        self._pool = pool
        self._queue = pool.free_block_queue
        self._hash_of = get_block_hash
        self._protected: Counter[int] = Counter()
        self._kept: dict[int, KVCacheBlock] = {}
        self._loose: OrderedDict[int, KVCacheBlock] = OrderedDict()
        self._reused: set[int] = set()  # touched by a request since allocated
        self.on_short: Callable[[int], bool] = lambda blocks: False
        self.accounting = EvictionPayoff(pool.num_gpu_blocks)
        self._free = pool.free_blocks
        self._touch = pool.touch
        self._get_new = pool.get_new_blocks
        pool.free_blocks = self._on_free  # type: ignore[method-assign]
        pool.touch = self._on_touch  # type: ignore[method-assign]
        pool.get_new_blocks = self._on_get_new  # type: ignore[method-assign]
        pool.get_num_free_blocks = self._num_free  # type: ignore[method-assign]

    @property
    def payoff(self) -> Payoff:
        return self.accounting.payoff

    @property
    def shelved(self) -> int:
        """Protected blocks set aside at the queue's head."""
        return len(self._kept)

    # -- BlockPort

    def hold(self, block_ids: Sequence[int]) -> None:
        for i in block_ids:
            self._protected[i] += 1
            block = self._loose.pop(i, None)
            if block is not None:
                self._kept[i] = block

    def release(self, block_ids: Sequence[int], evict_first: bool = False) -> None:
        freed: list[KVCacheBlock] = []
        for i in block_ids:
            count = self._protected.get(i)
            if count is None:
                continue  # revoked for an allocation (see ``_choose``)
            if count > 1:
                self._protected[i] = count - 1
                continue
            del self._protected[i]
            block = self._kept.pop(i, None)
            if block is not None:
                freed.append(block)
        for block in sorted(freed, key=lambda b: self.accounting.stamp(b.block_id)):
            self._loose[block.block_id] = block  # oldest first, as they were freed
        if not evict_first:
            return
        # Ended: the blocks no retention holds any more and no later request
        # reused go before all others, the chain's tail first. A reused block
        # may be a prefix other sessions share (a system prompt, a sub-agent's
        # parent's): it keeps its LRU place, as its users' next requests need
        # it whole (one evicted head block makes vLLM recompute the prompt).
        for i in block_ids:
            block = self._pool.blocks[i]
            if i in self._protected or i in self._reused or block.ref_cnt != 0 or block.is_null:
                continue
            if i not in self._loose:
                self._queue.remove(block)
                self._loose[i] = block
            self._loose.move_to_end(i, last=False)

    def free_blocks(self) -> int:
        """Blocks an allocation takes before it needs a protected one."""
        return int(self._queue.num_free_blocks) + len(self._loose)

    def flush(self) -> None:
        """Put every shelf block back into the free queue (before a reset)."""
        self._queue.prepend_n([*self._loose.values(), *self._kept.values()])
        self._loose.clear()
        self._kept.clear()
        self._reused.clear()

    # -- the pool's wrapped methods

    def _num_free(self) -> int:
        return int(self._queue.num_free_blocks) + len(self._loose) + len(self._kept)

    def _on_free(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        blocks = list(ordered_blocks)
        self._free(blocks)
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null and block.block_hash is not None:
                self.accounting.freed(block.block_id)

    def _on_touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        for block in blocks:
            i = block.block_id
            if self._kept.pop(i, None) is not None or self._loose.pop(i, None) is not None:
                self._queue.append(block)  # for the pool's own touch to take it off
            if block.ref_cnt == 0:
                self.accounting.hit(i)
            self._reused.add(i)
        self._touch(blocks)

    def _on_get_new(self, num_blocks: int) -> list[KVCacheBlock]:
        chosen = self._choose(num_blocks)
        for block in chosen:
            if block.block_hash is not None:
                self.accounting.evicted(
                    block.block_id, self._hash_of(block.block_hash), self._kept.__contains__
                )
        self._queue.prepend_n(chosen)
        fresh = self._get_new(num_blocks)
        self._reused.difference_update(b.block_id for b in fresh)
        return fresh

    def _choose(self, n: int) -> list[KVCacheBlock]:
        """Take off the queue and the shelf the blocks an allocation of ``n``
        evicts, but for the queue's leading uncached blocks (they stay first
        in line): the shelf's loose blocks (the oldest), then the queue's in
        LRU order, setting protected ones aside, then, for what is still
        missing, blocks the retention gives up."""
        queue = self._queue
        block = queue.fake_free_list_head.next_free_block
        tail = queue.fake_free_list_tail
        while n > 0 and block is not tail and block is not None and block.block_hash is None:
            n -= 1
            block = block.next_free_block
        chosen = self._take_loose(n)
        while len(chosen) < n and block is not tail and block is not None:
            following = block.next_free_block
            queue.remove(block)
            if block.block_id in self._protected:
                self._kept[block.block_id] = block
                self.accounting.shelved(block.block_id)
            else:
                chosen.append(block)
            block = following
        for _ in range(MAX_ROOM_CALLS):
            if len(chosen) >= n or not self._kept or not self.on_short(n - len(chosen)):
                break
            chosen += self._take_loose(n - len(chosen))
        # What the retention did not give up (it releases a bounded number of
        # branches per call, and blocks many of them share) is taken anyway,
        # the oldest protected blocks first: the pool never fails for it.
        while len(chosen) < n and self._kept:
            i, block = next(iter(self._kept.items()))
            del self._kept[i]
            self._protected.pop(i, None)
            chosen.append(block)
        return chosen

    def _take_loose(self, n: int) -> list[KVCacheBlock]:
        """Up to ``n`` loose shelf blocks, oldest first, off the shelf."""
        return [self._loose.popitem(last=False)[1] for _ in range(min(n, len(self._loose)))]

    def missed(self, block_hashes: Sequence[Any]) -> None:
        """A request's prefix past the cache (its block hashes, in order)."""
        self.accounting.missed(block_hashes)
