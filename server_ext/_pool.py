"""The two ways retention acts on vLLM's block pool: by eviction order, or by reference.

Every touch point of vLLM's ``BlockPool`` is here (``blocks``,
``free_block_queue`` with ``remove`` / ``append`` / ``prepend_n`` /
``num_free_blocks``, ``touch``, ``free_blocks``, ``get_new_blocks``,
``get_cached_block``,
``get_num_free_blocks``, ``KVCacheBlock.ref_cnt`` / ``block_hash`` /
``is_null``, ``kv_cache_utils.get_block_hash``); the connector picks a port and
the engine-side retention (``_engine.EngineRetention``) drives it through the
``BlockPort`` interface (``_holds``).

- ``ShelfPort`` (the default) keeps a retained branch's blocks *free*, in
  their place in vLLM's LRU free queue; an allocation that reaches one sets it
  aside instead of evicting it. vLLM counts them as free, so no allocation,
  admission or preemption decision differs from plain vLLM's; only which free
  block an allocation evicts does. When nothing unprotected is left, the
  allocation takes the set-aside blocks in LRU order, as plain vLLM would:
  the order only picks among blocks it can spare, the one choice its books
  can judge. It keeps the books of what this order gains and costs against
  plain LRU (``_eviction.EvictionPayoff``) and applies it only while it pays: until
  then, and whenever it stops paying, eviction is plain LRU's.
- ``HoldPort`` takes a block reference per retained block (the pool never
  evicts it); the connector must then give references back before vLLM would
  preempt (``KVCacheManager.allocate_slots`` wrapped).
"""

from __future__ import annotations

import itertools
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ._eviction import DOOM_WALK, EvictionPayoff
from .policy import MAX_ROOM_CALLS, Payoff

if TYPE_CHECKING:
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

__all__ = ["HoldPort", "ShelfPort", "allocate_after_room"]

_T = TypeVar("_T")


class HoldPort:
    """``BlockPort`` over vLLM's ``BlockPool``: hold = touch, release = free."""

    releases_for_room = True

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


def _take(shelf: dict[int, KVCacheBlock], n: int) -> list[KVCacheBlock]:
    """Up to ``n`` blocks off ``shelf``, oldest (first inserted) first."""
    return [shelf.pop(i) for i in list(itertools.islice(shelf, max(n, 0)))]


class _Admission(NamedTuple):
    """A request the scheduler is admitting, and what the order is worth to it."""

    request_id: str
    hinted: bool
    worth: int
    computed: Sequence[Any]  # the hashes of the blocks it computes


class ShelfPort:
    """``BlockPort`` that retains by eviction order (see the module docstring).

    A protected block keeps its place in vLLM's free queue (LRU order) while
    it waits there; only when an allocation reaches it at the queue's head is
    it set aside, onto the shelf, instead of evicted. The shelf is thus the
    oldest end of LRU order: a shelf block whose protection ends goes before
    anything in the queue, as plain LRU would have it, and each block that
    leaves the queue for the shelf is what plain LRU would have evicted.

    The order applies only while it pays (``EvictionPayoff``, which keeps the
    books): until then, and whenever it stops paying, allocations evict in
    plain LRU order, protected blocks included, and the books count what the
    order would have done instead.

    Installs itself on ``pool`` (instance attributes over its methods).

    Invariants: shelf blocks (``_kept``: protected; ``_loose``: no longer,
    oldest first) are free (``ref_cnt == 0``) and not in the free queue;
    ``pool.get_num_free_blocks()`` is the queue's count plus the shelf's; a
    block is protected while ``_protected`` counts it, and a protected shelf
    block is in ``_kept``; a protected block an allocation takes anyway is
    no longer protected, and ``_revoked`` counts the releases of it still to
    come (ignored, so a later protection of the reused block stands);
    ``_reused`` holds the blocks a request touched (hit) since they were
    last allocated; ``_admitting`` is the request the scheduler considered
    last (``admit``), until it allocates it (``admitted``): vLLM allocates a
    request right after asking the connector about it, or passes over it.
    (One slot, not a field of the request's record: it is the allocation in
    progress, with the block hashes it would evict, which only the port reads.)
    """

    releases_for_room = False

    def __init__(self, pool: BlockPool, enforce: bool | None = None) -> None:
        from vllm.v1.core.kv_cache_utils import get_block_hash

        self._pool = pool
        self._queue = pool.free_block_queue
        self._hash_of = get_block_hash
        self._protected: Counter[int] = Counter()
        self._revoked: Counter[int] = Counter()
        self._kept: dict[int, KVCacheBlock] = {}
        self._loose: OrderedDict[int, KVCacheBlock] = OrderedDict()
        self._reused: set[int] = set()  # touched by a request since allocated
        self._admitting: _Admission | None = None
        self.accounting = EvictionPayoff(pool.num_gpu_blocks, fixed=enforce)
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
    def enforcing(self) -> bool:
        """Whether the retention's order is in force (else plain LRU's)."""
        return self.accounting.enforcing

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
            if self._revoked[i]:  # taken by an allocation (``_revoke``)
                self._revoked[i] -= 1
                if not self._revoked[i]:
                    del self._revoked[i]
                    self.accounting.unprotected(i)
                continue
            count = self._protected.get(i)
            if count is None:
                continue
            if count > 1:
                self._protected[i] = count - 1
                continue
            del self._protected[i]
            block = self._kept.pop(i, None)
            if block is not None:
                freed.append(block)
        for block in sorted(freed, key=lambda b: self.accounting.stamp(b.block_id)):
            self._loose[block.block_id] = block  # oldest first, as they were freed
        if not evict_first or not self.enforcing:
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
        if not self.enforcing:
            return self._num_free()
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
                self.accounting.reused(i)
            self._reused.add(i)
        self._touch(blocks)

    def _on_get_new(self, num_blocks: int) -> list[KVCacheBlock]:
        chosen = self._choose(num_blocks)
        for block in chosen:
            protected = self._revoke(block.block_id)
            if block.block_hash is not None:
                self.accounting.evicted(block.block_id, self._hash_of(block.block_hash), protected)
        self._queue.prepend_n(chosen)
        fresh = self._get_new(num_blocks)
        self._reused.difference_update(b.block_id for b in fresh)
        if not self.enforcing:
            self._doom()
        return fresh

    def _revoke(self, block_id: int) -> bool:
        """An allocation takes ``block_id``: its protections end (their
        releases are still to come). Whether it was protected."""
        count = self._protected.pop(block_id, 0)
        if count:
            self._revoked[block_id] += count
        return count > 0

    def _choose(self, n: int) -> list[KVCacheBlock]:
        """Take off the queue and the shelf the blocks an allocation of ``n``
        evicts, but for the queue's leading uncached blocks (they stay first
        in line): the shelf's loose blocks (the oldest), then, with LRU in
        force, its protected ones and the queue's in LRU order. With the
        retention's order in force the queue's protected blocks are set aside
        instead, and only when the queue has no other block left are the
        shelf's protected ones taken, the oldest first, as LRU takes them."""
        queue = self._queue
        block = queue.fake_free_list_head.next_free_block
        tail = queue.fake_free_list_tail
        while n > 0 and block is not tail and block is not None and block.block_hash is None:
            n -= 1
            block = block.next_free_block
        chosen = _take(self._loose, n)
        enforcing = self.enforcing
        if not enforcing:
            chosen += _take(self._kept, n - len(chosen))
        while len(chosen) < n and block is not tail and block is not None:
            following = block.next_free_block
            queue.remove(block)
            if enforcing and block.block_id in self._protected:
                self._kept[block.block_id] = block
            else:
                chosen.append(block)
            block = following
        return chosen + _take(self._kept, n - len(chosen))

    def _doom(self) -> None:
        """LRU in force: for each block only the retention's order still has
        (a phantom), it would have evicted another, unprotected one; the
        next ones in LRU order are those (``doomed``). One that leaves the
        free queue (evicted by LRU too, or reused) is replaced by the next,
        as the order would then have evicted that one as well. Where the
        queue has no such block left, the order would have had to give up
        protections for room: it keeps no more phantoms than it has doomed
        blocks (``EvictionPayoff.forgo``)."""
        accounting = self.accounting
        count = len(accounting.phantoms) - len(accounting.doomed)
        if count <= 0:
            return
        block = self._queue.fake_free_list_head.next_free_block
        tail = self._queue.fake_free_list_tail
        for _ in range(count + len(accounting.doomed) + DOOM_WALK):
            if block is None or block is tail:
                accounting.forgo(count)
                return
            i = block.block_id
            if (
                block.block_hash is not None
                and i not in self._protected
                and i not in accounting.doomed
            ):
                accounting.doom(i)
                count -= 1
                if count == 0:
                    return
            block = block.next_free_block

    def admit(self, request_id: str, hinted: bool, block_hashes: Sequence[Any], hit: int) -> None:
        """The scheduler considers ``request_id`` for admission (with hints
        if ``hinted``): the full blocks of its prompt that a cache could serve
        (their hashes, in order), of which the cache serves the first ``hit``.
        Booked only once it is admitted (``admitted``)."""

        def cached(i: int) -> int | None:
            blocks = self._pool.get_cached_block(block_hashes[i], [0])
            return blocks[0].block_id if blocks else None

        worth = self.accounting.judge(block_hashes, cached, hit)
        self._admitting = _Admission(request_id, hinted, worth, block_hashes[hit:])

    def admitted(self, request_id: str) -> None:
        """The scheduler allocated ``request_id``'s blocks: book what the
        order was worth to it (as ``admit`` found it)."""
        admission, self._admitting = self._admitting, None
        if admission is not None and admission.request_id == request_id:
            self.accounting.book(admission.worth, admission.hinted, admission.computed)
