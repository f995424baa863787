"""The books of retention by eviction order: what its order gains and costs
against plain LRU, kept by ``ShelfPort`` (``server_ext._pool``), which applies
the order only while these books show it pays.

No vLLM import: the port reports frees, evictions, reuses and admissions here.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from .policy import Payoff

__all__ = [
    "BACKOFF_MEMORY",
    "DOOM_WALK",
    "ORDER_BACKOFF",
    "ORDER_MARGIN",
    "ORDER_SIGMAS",
    "STINT_SIGMAS",
    "EvictionPayoff",
]

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


def _stint() -> Payoff:
    """The books of one stint in force: every outcome, undecayed."""
    return Payoff(memory=math.inf, prior=0.0)
