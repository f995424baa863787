"""The block references retention takes from the pool, and gives back.

No vLLM import: ``BlockPort`` is retention's view of the block pool
(``_pool.HoldPort`` and ``_pool.ShelfPort`` over vLLM's, ``FakeBlockPool`` in
``server_ext.testing``, the simulator's own), and ``HeldBlocks`` applies the
policy's ``Hold``/``Release`` actions to one, counting what it took.
"""

from __future__ import annotations

import itertools
import operator
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from .policy import Action, Hold, Release, ReleaseReason

__all__ = ["BlockPort", "HeldBlocks"]


class BlockPort(Protocol):
    """The block-pool operations retention needs.

    ``hold`` protects each block (a held block is not evicted while the hold
    lasts, unless the pool asks the retention for room); ``release`` ends
    one protection, tail first, so the prefix stays cached longest; with
    ``evict_first`` (an ended branch) its blocks are the first a later
    allocation evicts, else they keep their place in LRU order;
    ``free_blocks`` counts blocks an allocation may take without touching a
    held or running one (cached but unreferenced blocks included).
    ``releases_for_room``: an allocation short of free blocks asks the
    retention to release some (``EngineRetention.make_room``, in its victim
    order); else it takes protected blocks in the pool's own order.
    """

    releases_for_room: bool

    def hold(self, block_ids: Sequence[int]) -> None: ...

    def release(self, block_ids: Sequence[int], evict_first: bool = False) -> None: ...

    def free_blocks(self) -> int: ...


class HeldBlocks:
    """Applies the policy's actions to ``pool``, keeping count of the block
    references taken with ``pool.hold`` and not yet released.

    Invariant: every reference taken is given back with ``pool.release``
    exactly once: after the policy's matching ``Release``, or at
    ``release_everything``. The policy guarantees the pairing, and this
    object checks it against its own count: a batch of actions that would
    release a reference it does not hold is a policy fault, refused before
    the pool is touched. Within one batch all holds are applied before any
    release, so a block shared by a replaced retention and its replacement
    never drops to refcount 0 in between.
    """

    def __init__(self, pool: BlockPort) -> None:
        self.pool = pool
        self._held: Counter[int] = Counter()

    def apply(self, actions: list[Action]) -> None:
        holds = [a.block_ids for a in actions if isinstance(a, Hold)]
        releases = [a for a in actions if isinstance(a, Release)]
        held = self._held
        if releases:
            # Counted and compared in C (a retention is hundreds of blocks).
            released: Counter[int] = Counter()
            for a in releases:
                released.update(a.block_ids)
            taken: Counter[int] = Counter()
            for ids in holds:
                taken.update(ids)
            blocks, zeros = list(released), itertools.repeat(0)
            have = map(operator.add, map(held.get, blocks, zeros), map(taken.get, blocks, zeros))
            if any(map(operator.lt, have, released.values())):
                raise RuntimeError("the policy released a block reference it never held")
        for block_ids in holds:
            self.pool.hold(block_ids)
            held.update(block_ids)
        for release in releases:
            block_ids = release.block_ids
            # An ended branch's blocks go first (those no later request reused:
            # the port knows); any other's keep their place.
            self.pool.release(block_ids, evict_first=release.reason is ReleaseReason.END)
            for b in block_ids:
                n = held[b]
                if n == 1:
                    del held[b]
                else:
                    held[b] = n - 1

    def release_everything(self) -> None:
        """Give the pool back every reference taken (from this object's own
        count, not from the policy's state, which a fault may have left
        half-updated)."""
        held, self._held = self._held, Counter()
        if held:
            self.pool.release(list(held.elements()))
