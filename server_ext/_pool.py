"""The two ways retention acts on vLLM's block pool: by eviction order, or by reference.

Every touch point of vLLM's ``BlockPool`` is here (``blocks``,
``free_block_queue`` with ``remove`` / ``append`` / ``prepend_n`` /
``num_free_blocks``, ``touch``, ``free_blocks``, ``get_new_blocks``,
``get_cached_block``,
``get_num_free_blocks``, ``KVCacheBlock.ref_cnt`` / ``block_hash`` /
``is_null``, ``kv_cache_utils.get_block_hash``); the connector picks a port and
the engine-side retention (``_engine.EngineRetention``) drives it through the
``BlockPort`` interface.

- ``ShelfPort`` (the default) keeps a retained branch's blocks *free*, in
  their place in vLLM's LRU free queue; an allocation that reaches one sets it
  aside instead of evicting it. vLLM counts them as free, so no allocation,
  admission or preemption decision differs from plain vLLM's; only which free
  block an allocation evicts does. When nothing unprotected is left, the
  allocation takes the set-aside blocks in LRU order, as plain vLLM would:
  the order only picks among blocks it can spare, the one choice its books
  can judge. It keeps the books of what this order gains and costs against
  plain LRU (``EvictionPayoff``) and applies it only while it pays: until
  then, and whenever it stops paying, eviction is plain LRU's.
- ``HoldPort`` takes a block reference per retained block (the pool never
  evicts it); the connector must then give references back before vLLM would
  preempt (``KVCacheManager.allocate_slots`` wrapped).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from .policy import MAX_ROOM_CALLS, Payoff

if TYPE_CHECKING:
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

__all__ = ["EvictionPayoff", "HoldPort", "ShelfPort", "allocate_after_room"]

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


ORDER_MARGIN = 4.0
"""Blocks of net gain, recent hits counted, that the books must show for the
retention's order before it replaces plain LRU (it starts following LRU)."""

ORDER_SIGMAS = 3.0
"""How far beyond chance, in spreads of the requests' outcomes, the order's
lead must be before it replaces LRU: the books are looked at after every
request, and a lead that chance gives now and then must not switch it on."""

ORDER_BACKOFF = 2.0
"""A stint of the order in force that ends behind plain LRU (it cost more
than it gained while in force) multiplies the lead the next stint needs by
this; one that ends ahead resets it. The books of an order not in force are
a model, and a model that was wrong once under this workload must be more
right before it is trusted again: losing stints grow rarer geometrically."""

STINT_SIGMAS = 1.0
"""How far behind LRU, in spreads of its own outcomes (``ORDER_MARGIN``
added), a stint in force may fall before it gives way, whatever the books
from before it say: those were the shadow's, a model; the stint's outcomes are
measured. One request that loses its whole prompt stays within the spread; a
run of losses does not, and the stint ends before it costs the lead the
shadow had shown."""

BACKOFF_MEMORY = 4
"""Per this many ``Payoff.memory`` spans of booked outcomes (LRU in force
throughout), a backed-off lead halves again: the books forget, and so does
the backoff, on a longer scale, as a long-lived server's workload changes."""

DOOM_WALK = 64
"""Queue blocks looked at, past those wanted and those already doomed, to
find the blocks the retention's order would have evicted in place of
protected ones."""


class EvictionPayoff:
    """The books of the retention's eviction order against plain LRU, and the
    choice of which of the two is in force (``enforcing``).

    They follow, besides the real cache, the one the order not in force would
    have now, as marks on the difference:

    - while the retention's order is in force, plain LRU is the shadow: each
      block that becomes free gets a stamp (its place in LRU order); when an
      allocation evicts a block while an older free one survives, LRU would
      have evicted that one: it is *saved* (LRU lacks it) and the evicted one
      a *ghost* (only LRU has it). When LRU would evict a ghost (the oldest
      ghost is older than the block evicted now), both have lost it and it is
      dropped;
    - while plain LRU is in force, the retention's order is the shadow: each
      protected block LRU evicts is a *phantom* (only the order has it), and
      the next unprotected block in LRU order is *doomed* in its place (the
      order lacks it). A phantom lasts as long as the protection LRU overrode
      would have (``unprotected``), and only while a doomed block stands for
      it (``forgo``: else the order would have had to give it up for room).

    Each admitted request is one outcome: how much longer (a gain) or
    shorter (a cost) its cached prefix is in the order's cache than in LRU's
    (``judge``). They go into one ``Payoff``: what the order is worth against
    LRU, whichever is in force. LRU is in force at first; the order takes over
    once its net gain reaches ``ORDER_MARGIN`` blocks beyond chance
    (``ORDER_SIGMAS``, ``Payoff.clears``: a trade of some requests' whole
    prompts for others' is no gain), and gives way again as soon as its recent
    costs exceed its recent gains, or its stint in force (``stint``, its own
    outcomes) trails LRU beyond chance (``STINT_SIGMAS``). A stint that ended
    behind LRU raises the lead the next one needs (``backoff``,
    ``ORDER_BACKOFF``): the shadow that let it in was wrong here once.
    Requests without hints are never protected, so the order can only take
    from them: their own books (``unhinted``) must stay even, ``ORDER_MARGIN``
    allowed, or LRU is in force (they must not pay for the sessions that
    hint). ``fixed`` (True or False) keeps one of them in force whatever the
    books say.

    Invariants: ``saved`` and ``doomed`` hold block ids of free cached blocks,
    ``ghosts`` and ``phantoms`` block hashes (oldest first), at most
    ``capacity`` each; ``payoff`` and ``unhinted`` count blocks and decay
    together (every outcome is recorded in both, as nothing in ``unhinted``
    for a hinted request); ``stint`` holds the undecayed outcomes of the
    current stint in force (none while LRU is); ``backoff >= 1``.
    """

    def __init__(self, capacity: int, fixed: bool | None = None) -> None:
        self.capacity = max(capacity, 1)
        self.payoff = Payoff(prior=0.0)
        self.unhinted = Payoff(prior=0.0)
        self.enforcing = bool(fixed)
        self._fixed = fixed
        self.stint = _stint()
        self.backoff = 1.0
        self._since_backoff = 0  # outcomes booked since ``backoff`` last changed
        self._clock = 0  # blocks freed
        self._stamps: dict[int, int] = {}
        self._free: list[tuple[int, int]] = []  # (stamp, block id), lazily pruned
        self.saved: set[int] = set()
        self.ghosts: OrderedDict[bytes, int] = OrderedDict()  # hash -> stamp
        self.doomed: set[int] = set()
        self.phantoms: OrderedDict[bytes, int] = OrderedDict()  # hash -> block id
        self._phantom_of: dict[int, bytes] = {}

    def freed(self, block_id: int) -> None:
        """``block_id`` (with a hash) joined the free blocks: the youngest."""
        self._clock += 1
        self._stamps[block_id] = self._clock
        heapq.heappush(self._free, (self._clock, block_id))
        if len(self._free) > 2 * len(self._stamps) + 64:  # stale entries of hit blocks
            self._free = [(s, i) for i, s in self._stamps.items() if i not in self.saved]
            heapq.heapify(self._free)

    def stamp(self, block_id: int) -> int:
        """``block_id``'s place in LRU order (larger: freed later; 0: unknown)."""
        return self._stamps.get(block_id, 0)

    def evicted(self, block_id: int, block_hash: bytes, protected: bool = False) -> None:
        """An allocation evicts ``block_id`` (cached as ``block_hash``; under
        the retention's protection if ``protected``)."""
        stamp = self._stamps.pop(block_id, None)
        was_saved = block_id in self.saved
        self.saved.discard(block_id)
        self.doomed.discard(block_id)
        if stamp is None:
            return
        if protected and not self.enforcing:
            self.phantoms[block_hash] = block_id
            self.phantoms.move_to_end(block_hash)
            self._phantom_of[block_id] = block_hash
            if len(self.phantoms) > self.capacity:
                _, oldest = self.phantoms.popitem(last=False)
                self._phantom_of.pop(oldest, None)
        # Which block LRU evicts now: its oldest, of the free blocks it still
        # has (this one unless saved: LRU lost it already) and its ghosts.
        free = self._free
        while free and (self._stamps.get(free[0][1]) != free[0][0] or free[0][1] in self.saved):
            heapq.heappop(free)
        own = math.inf if was_saved else stamp
        oldest_free = free[0][0] if free else math.inf
        oldest_ghost = next(iter(self.ghosts.values()), math.inf)
        victim = min(own, oldest_free, oldest_ghost)
        if victim in (own, math.inf):
            return  # LRU evicts the same block (or had already lost it)
        if victim == oldest_free:
            self.saved.add(heapq.heappop(free)[1])
            if len(self.saved) > self.capacity:  # a saved block never seen again
                self.saved.pop()
        else:
            self.ghosts.popitem(last=False)
        if not was_saved:
            self.ghosts[block_hash] = stamp
            if len(self.ghosts) > self.capacity:
                self.ghosts.popitem(last=False)

    def unprotected(self, block_id: int) -> None:
        """The protections of ``block_id`` that an allocation overrode have
        ended: the retention's order would no longer keep its phantom."""
        block_hash = self._phantom_of.pop(block_id, None)
        if block_hash is not None and self.phantoms.get(block_hash) == block_id:
            del self.phantoms[block_hash]

    def doom(self, block_id: int) -> None:
        """LRU in force: the retention's order would have evicted ``block_id``."""
        self.doomed.add(block_id)
        if len(self.doomed) > self.capacity:
            self.doomed.pop()

    def forgo(self, count: int) -> None:
        """LRU in force: the retention's order could not have kept ``count``
        of its phantoms (nothing unprotected was left to evict in their
        place): the oldest go, as if it had released them for room."""
        for _ in range(min(count, len(self.phantoms))):
            block_hash, block_id = self.phantoms.popitem(last=False)
            if self._phantom_of.get(block_id) == block_hash:
                del self._phantom_of[block_id]

    def reused(self, block_id: int) -> None:
        """A request takes the free block ``block_id`` (a hit): it is no longer
        free, in either cache (``judge`` counted what the hit was worth)."""
        self._stamps.pop(block_id, None)
        self.saved.discard(block_id)
        self.doomed.discard(block_id)

    def judge(
        self, block_hashes: Sequence[bytes], cached: Callable[[int], int | None], hit: int
    ) -> int:
        """What the retention's order is worth, in blocks, to a request whose
        prompt's full blocks are ``block_hashes`` (in order), of which the
        cache serves the first ``hit``; ``cached(i)`` is the id of the block
        that holds the ``i``-th (None: none). vLLM serves a prompt from the
        cache up to its first missing block, so the worth is the difference
        between the two caches' prefixes: one lost head block costs the whole
        prompt. Changes nothing (the scheduler may ask again)."""
        lacks = self.saved if self.enforcing else self.doomed  # free, the shadow lost it
        extra = self.ghosts if self.enforcing else self.phantoms  # only the shadow has it
        shadow = 0
        for i, h in enumerate(block_hashes):
            if h not in extra and (i >= hit or lacks):
                block_id = cached(i)
                if block_id is None or block_id in lacks:
                    break
            shadow += 1
        return hit - shadow if self.enforcing else shadow - hit

    def book(self, worth: int, hinted: bool, computed: Iterable[bytes]) -> None:
        """A request (with hints if ``hinted``) that ``judge`` found the order
        worth ``worth`` blocks to is admitted: it computes the blocks
        ``computed``, which both caches then hold."""
        for h in computed:
            self.ghosts.pop(h, None)
            self.phantoms.pop(h, None)
        self._add(max(worth, 0), max(-worth, 0), hinted)

    def _add(self, gained: int, cost: int, hinted: bool) -> None:
        if not (gained or cost):
            return
        payoff, unhinted = self.payoff, self.unhinted
        payoff.add(gained=gained, cost=cost)
        unhinted.add(gained=0 if hinted else gained, cost=0 if hinted else cost)
        if self._fixed is not None:
            return
        fair = unhinted.cost <= unhinted.gained + ORDER_MARGIN
        if self.enforcing:
            stint = self.stint
            stint.add(gained=gained, cost=cost)
            self.enforcing = fair and payoff.pays and not stint.trails(ORDER_MARGIN, STINT_SIGMAS)
            if not self.enforcing:
                behind = stint.cost > stint.gained
                self._set_backoff(self.backoff * ORDER_BACKOFF if behind else 1.0)
                self.stint = _stint()
            return
        self._since_backoff += 1
        if self._since_backoff >= BACKOFF_MEMORY * payoff.memory:
            self._set_backoff(max(self.backoff / ORDER_BACKOFF, 1.0))
        lead = self.backoff
        self.enforcing = fair and payoff.clears(ORDER_MARGIN * lead, ORDER_SIGMAS * lead)

    def _set_backoff(self, backoff: float) -> None:
        self.backoff = backoff
        self._since_backoff = 0


def _take(shelf: dict[int, KVCacheBlock], n: int) -> list[KVCacheBlock]:
    """Up to ``n`` blocks off ``shelf``, oldest (first inserted) first."""
    return [shelf.pop(i) for i in list(itertools.islice(shelf, max(n, 0)))]


def _stint() -> Payoff:
    """The books of one stint in force: every outcome, undecayed."""
    return Payoff(memory=math.inf, prior=0.0)


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
