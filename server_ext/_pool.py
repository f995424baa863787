"""The two ways retention acts on vLLM's block pool: by eviction order, or by reference.

Every touch point of vLLM's ``BlockPool`` is here (``blocks``,
``free_block_queue`` with ``remove`` / ``append`` / ``prepend_n`` /
``num_free_blocks``, ``touch``, ``free_blocks``, ``get_new_blocks``,
``get_num_free_blocks``, ``KVCacheBlock.ref_cnt`` / ``block_hash`` /
``is_null``, ``kv_cache_utils.get_block_hash``); the connector picks a port and
the engine-side retention (``_engine.EngineRetention``) drives it through the
``BlockPort`` interface.

- ``ShelfPort`` (the default) keeps a retained branch's blocks *free*: when the
  pool frees them, they wait on a shelf beside the free queue instead of in it.
  vLLM counts them as free, so no allocation, admission or preemption decision
  differs from plain vLLM's; only which free block an allocation evicts does.
  An allocation takes the queue's blocks first and asks the retention to give
  up shelved ones (its victim order) only when the queue runs short. It also
  keeps the books of what this order gained and cost against plain LRU
  (``EvictionPayoff``).
- ``HoldPort`` takes a block reference per retained block (the pool never
  evicts it); the connector must then give references back before vLLM would
  preempt (``KVCacheManager.allocate_slots`` wrapped).
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .policy import Payoff

if TYPE_CHECKING:
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

__all__ = ["EvictionPayoff", "HoldPort", "ShelfPort"]

logger = logging.getLogger(__name__)


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

    Installs itself on ``pool`` (instance attributes over its methods); the
    retention sets ``on_short``, which ``get_new_blocks`` calls with the
    number of blocks the queue lacks, to release retentions in victim order.

    Invariants: a block is on ``_shelf`` iff it is protected (``_protected``
    count > 0), free (``ref_cnt == 0``) and not in the free queue;
    ``pool.get_num_free_blocks()`` is the queue's count plus the shelf's.
    """

    def __init__(self, pool: BlockPool) -> None:
        from vllm.v1.core.kv_cache_utils import get_block_hash

        self._pool = pool
        self._queue = pool.free_block_queue
        self._hash_of = get_block_hash
        self._protected: Counter[int] = Counter()
        self._shelf: dict[int, KVCacheBlock] = {}
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
        return len(self._shelf)

    # -- BlockPort

    def hold(self, block_ids: Sequence[int]) -> None:
        for i in block_ids:
            self._protected[i] += 1
            block = self._pool.blocks[i]
            if block.ref_cnt == 0 and i not in self._shelf and not block.is_null:
                self._queue.remove(block)
                self._put_on_shelf(block)

    def release(self, block_ids: Sequence[int], evict_first: bool = False) -> None:
        back: list[KVCacheBlock] = []
        for i in block_ids:
            if self._protected[i] <= 1:
                del self._protected[i]
                block = self._shelf.pop(i, None)
                if block is not None:
                    back.append(block)
            else:
                self._protected[i] -= 1
        # The chain's tail is evicted before its prefix: at the queue's head
        # (``evict_first``), or at its end, after the blocks free already.
        if evict_first:
            self._queue.prepend_n(back[::-1])
        else:
            self._queue.append_n(back[::-1])

    def free_blocks(self) -> int:
        """Blocks an allocation takes before it needs a shelved one."""
        return int(self._queue.num_free_blocks)

    # -- the pool's wrapped methods

    def _num_free(self) -> int:
        return int(self._queue.num_free_blocks) + len(self._shelf)

    def _on_free(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        blocks = list(ordered_blocks)
        self._free(blocks)
        for block in blocks:
            if block.ref_cnt != 0 or block.is_null or block.block_hash is None:
                continue
            self.accounting.freed(block.block_id)
            if block.block_id in self._protected and block.block_id not in self._shelf:
                self._queue.remove(block)
                self._put_on_shelf(block)

    def _on_touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        for block in blocks:
            if self._shelf.pop(block.block_id, None) is not None:
                self._queue.append(block)  # for the pool's own touch to take it off
            if block.ref_cnt == 0:
                self.accounting.hit(block.block_id)
        self._touch(blocks)

    def _on_get_new(self, num_blocks: int) -> list[KVCacheBlock]:
        short = num_blocks - self._queue.num_free_blocks
        while short > 0 and self._shelf and self.on_short(short):
            short = num_blocks - self._queue.num_free_blocks
        if short > 0 and self._shelf:
            # The retention had nothing left to give up (a fault dropped its
            # state): the pool must never fail for it.
            logger.warning("agent-hints: %d shelved blocks without a retention", len(self._shelf))
            self._queue.prepend_n(list(self._shelf.values()))
            self._shelf.clear()
            self._protected.clear()
        for block in self._head(num_blocks):
            if block.block_hash is not None:
                self.accounting.evicted(
                    block.block_id, self._hash_of(block.block_hash), self._shelf.__contains__
                )
        return self._get_new(num_blocks)

    def _head(self, n: int) -> list[KVCacheBlock]:
        """The first ``n`` blocks of the free queue: the next evicted."""
        out: list[KVCacheBlock] = []
        block = self._queue.fake_free_list_head.next_free_block
        tail = self._queue.fake_free_list_tail
        while len(out) < n and block is not None and block is not tail:
            out.append(block)
            block = block.next_free_block
        return out

    def _put_on_shelf(self, block: KVCacheBlock) -> None:
        self._shelf[block.block_id] = block
        self.accounting.shelved(block.block_id)

    def missed(self, block_hashes: Sequence[Any]) -> None:
        """A request's prefix past the cache (its block hashes, in order)."""
        self.accounting.missed(block_hashes)
