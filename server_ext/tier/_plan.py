"""Scheduler-side tier bookkeeping: what to load, save and drop each engine step.

No vLLM import: ``server_ext.connector`` feeds it block hashes, block ids
and token counts. The tier itself lives in the worker; the planner keeps a
``KeyIndex`` of the keys the worker holds, is told of every key the worker
failed to store or load, and drops a tenant's keys beyond its share. The store
(Mooncake) evicts on its own and also holds blocks this engine never stored:
a ``shared`` probe asks the store for the blocks the index lacks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ._index import KeyIndex
from ._keys import block_key
from ._payoff import TierPayoff

__all__ = ["BlockProgress", "TierCounters", "TierOps", "TierPlanner"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TierOps:
    """One step's work for the worker: drops, then loads (before the forward),
    then saves (after it). Loads and saves are (key, block id). ``failed``:
    block ids vLLM was promised from the tier whose loads could not be planned;
    the worker reports them as load errors, so vLLM recomputes them."""

    loads: list[tuple[str, int]] = field(default_factory=list)
    saves: list[tuple[str, int, float]] = field(default_factory=list)  # + soft pin seconds
    drops: list[str] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.loads or self.saves or self.drops or self.failed)


@dataclass(frozen=True, slots=True)
class BlockProgress:
    """A scheduled request of this step: its hashes, its blocks, and how many of
    its tokens will have KV once the step ran."""

    request_id: str
    block_hashes: Sequence[bytes]
    block_ids: Sequence[int]
    computed_tokens: int


@dataclass(slots=True)
class TierCounters:
    """Cumulative tier telemetry, in blocks and bytes."""

    # Every counter only grows (Prometheus counters): a failed load stays a hit
    # and counts in load_failures too, so blocks served = hits - load_failures.
    hits: int = 0  # blocks planned to load from the tier instead of recomputed
    misses: int = 0  # blocks looked up past the device cache that the tier lacked
    load_failures: int = 0  # planned loads the worker could not serve (recomputed)
    save_failures: int = 0
    shared_blocks: int = 0  # blocks the index lacked and the shared store held
    bytes_saved: int = 0
    bytes_loaded: int = 0
    unsaved: int = 0  # full blocks not saved because the tier did not pay (``TierPayoff``)


@dataclass(slots=True)
class _Tracked:
    tenant: str
    pin_s: float
    keys: list[str] = field(default_factory=list)
    saved: int = 0  # leading blocks already in the tier (or being saved)
    lookup: tuple[int, int, int] | None = None  # (first block, blocks queried, blocks found)
    probed: int = 0  # blocks up to which the shared store was asked
    saving: bool | None = None  # whether its blocks go to the tier (decided at its first step)


class TierPlanner:
    """Plans tier transfers for tracked (hinted) requests.

    Each tracked request's tier state (its keys, the blocks saved, a pending
    lookup) is the planner's own, not a field of the scheduler's record of
    the request: a cache reset replaces the planner, and every request it
    tracked leaves the tier with it at once.

    Args:
        index: the keys the store holds, a bookkeeping bound: the store
            evicts on its own (and other engines may still use a key); a
            tenant's keys beyond its share of the index
            (``KeyIndex.owner_budget_bytes``) are dropped.
        namespace: model + KV layout fingerprint mixed into every key.
        block_size: tokens per vLLM block.
        block_bytes: bytes of one packed block (all layers).
        shared: for a shared store, how many of the given keys, from the first,
            the store holds (keys as the planner names them). Asked at most
            once per request for the blocks past the index's leading hits;
            the blocks it reports join the index.
        secret: the deployment's tier secret, keying every key (``block_key``).
        payoff: the tier's books (default: a ``TierPayoff`` on trial).

    The planner keeps the tier's books (``payoff``): a request's blocks are
    saved only if the tier paid for its own time when the request was first
    scheduled (``TierPayoff.saving``). Deciding per request, not per step,
    keeps what a tier that stepped back still saves loadable: whole prompts,
    not scattered blocks past a prefix the tier lacks.

    Once ``lookup`` promised vLLM tokens from the tier, the blocks are loaded
    or reported failed, whatever goes wrong in between: a promise that
    ``allocated`` could not plan (or was never told of, because the hook
    failed first) fails its blocks at the next ``step``, and ``abandon``
    fails every planned load when the step's metadata cannot be built.
    """

    def __init__(
        self,
        index: KeyIndex,
        namespace: str,
        block_size: int,
        block_bytes: int,
        *,
        shared: Callable[[Sequence[str]], int] | None = None,
        secret: bytes | None = None,
        payoff: TierPayoff | None = None,
    ) -> None:
        self.index = index
        self._namespace = namespace
        self._block_size = block_size
        self._block_bytes = block_bytes
        self._shared = shared
        self._secret = secret
        self._tracked: dict[str, _Tracked] = {}
        self._ops = TierOps()
        self.counters = TierCounters()
        self.payoff = payoff if payoff is not None else TierPayoff()
        self._seconds_per_token: float | None = None

    def engine_step(self, busy_s: float, seconds_per_token: float | None) -> None:
        """The engine ran its last step for ``busy_s`` (0 after an idle gap);
        a prefill token costs it ``seconds_per_token`` (None: not timed yet)."""
        self.payoff.busy(busy_s)
        if seconds_per_token is not None:
            self._seconds_per_token = seconds_per_token

    def _prefill_seconds(self, blocks: int) -> float:
        spt = self._seconds_per_token
        return 0.0 if spt is None else blocks * self._block_size * spt

    def track(self, request_id: str, tenant: str, pin_s: float) -> None:
        self._tracked[request_id] = _Tracked(tenant, pin_s)

    def finished(self, request_id: str) -> None:
        self._tracked.pop(request_id, None)

    def _keys(self, entry: _Tracked, block_hashes: Sequence[bytes]) -> list[str]:
        for h in block_hashes[len(entry.keys) :]:
            entry.keys.append(block_key(self._namespace, entry.tenant, h, self._secret))
        return entry.keys

    def lookup(
        self, request_id: str, block_hashes: Sequence[bytes], num_tokens: int, num_computed: int
    ) -> int:
        """Tokens past ``num_computed`` (block aligned) the tier can supply.

        Like vLLM's example connector, the last prompt token is always left to
        compute, so a full hit still produces logits.
        """
        entry = self._tracked.get(request_id)
        if entry is None:
            return 0
        first = num_computed // self._block_size
        last = min((num_tokens - 1) // self._block_size, len(block_hashes))
        if last <= first:
            entry.lookup = None
            return 0
        keys = self._keys(entry, block_hashes)[first:last]
        found = self.index.leading(keys)
        if self._shared is not None and found < len(keys) and first + found >= entry.probed:
            # Blocks another engine stored (or this index forgot); asked once
            # per range, since a waiting request is looked up every step.
            held = self._shared(keys[found:])
            entry.probed = last
            for key in keys[found : found + held]:
                self.index.add(key, self._block_bytes, owner=entry.tenant)
            found = self.index.leading(keys)
            self.counters.shared_blocks += held
        entry.lookup = (first, len(keys), found)
        return found * self._block_size

    def allocated(self, request_id: str, block_ids: Sequence[int], external_tokens: int) -> None:
        """After vLLM allocated blocks: plan the loads it accepted."""
        entry = self._tracked.get(request_id)
        if entry is None or entry.lookup is None:
            return
        first, queried, found = entry.lookup
        entry.lookup = None
        loaded = min(external_tokens // self._block_size, found)
        try:
            keys = entry.keys[first : first + loaded]
            planned = list(zip(keys, block_ids[first : first + loaded], strict=True))
            self.index.touch(keys)
        except Exception:
            logger.exception("agent-hints tier: load planning failed; recomputing")
            self._ops.failed.extend(block_ids[first : first + loaded])
            return
        self._ops.loads.extend(planned)
        self.payoff.spared(self._prefill_seconds(loaded))
        entry.saved = max(entry.saved, first + loaded)
        self.counters.hits += loaded
        self.counters.misses += queried - loaded

    def abandon(self) -> TierOps:
        """This step's ops when its metadata cannot be built: no saves, and
        every planned load reported failed (vLLM recomputes those blocks)."""
        ops, self._ops = self._ops, TierOps()
        return TierOps(failed=[*ops.failed, *(block for _, block in ops.loads)])

    def step(self, progress: Iterable[BlockProgress]) -> TierOps:
        """This step's ops: the planned loads, and saves of tracked requests'
        full blocks that the step completes and the tier lacks."""
        ops, self._ops = self._ops, TierOps()
        try:
            self._plan_saves(progress, ops)
        except Exception:  # saves are best effort; the loads must still go out
            logger.exception("agent-hints tier: save planning failed")
            ops.saves.clear()
        return ops

    def _plan_saves(self, progress: Iterable[BlockProgress], ops: TierOps) -> None:
        saves: dict[str, tuple[int, float]] = {}
        for p in progress:
            entry = self._tracked.get(p.request_id)
            if entry is None:
                continue
            if entry.lookup is not None:
                # Scheduled with a promise ``allocated`` never planned: the
                # promised blocks hold no KV, so they are reported failed.
                first, _, found = entry.lookup
                entry.lookup = None
                ops.failed.extend(p.block_ids[first : first + found])
            full = min(p.computed_tokens // self._block_size, len(p.block_hashes), len(p.block_ids))
            if entry.saving is None:
                entry.saving = self.payoff.saving
            if not entry.saving:
                self.counters.unsaved += max(full - entry.saved, 0)
                entry.saved = max(entry.saved, full)
                continue
            keys = self._keys(entry, p.block_hashes)
            for i in range(entry.saved, full):
                key = keys[i]
                if key in self.index:
                    self.index.add(key, self._block_bytes, entry.pin_s)  # refresh
                    continue
                for victim in self.index.shed(entry.tenant, self._block_bytes):
                    if saves.pop(victim, None) is None:
                        ops.drops.append(victim)
                evicted = self.index.add(key, self._block_bytes, entry.pin_s, entry.tenant)
                for victim in evicted:
                    # A key saved earlier in this same step is simply not saved
                    # (the store evicts the others on its own).
                    saves.pop(victim, None)
                if key not in evicted:
                    saves[key] = (p.block_ids[i], entry.pin_s)
            entry.saved = max(entry.saved, full)
        ops.saves.extend((key, block, pin) for key, (block, pin) in saves.items())

    def worker_report(
        self,
        failed_saves: Sequence[str],
        failed_loads: Sequence[str],
        bytes_saved: int,
        bytes_loaded: int,
        seconds: float = 0.0,
    ) -> None:
        """What the worker(s) did in ``seconds`` of steps: keys they could not
        store or serve leave the index (parallel workers may each report the
        same key); a failed load is a prefill the books counted as spared
        and the engine still does. A key one worker failed to store is
        dropped on every worker with the next step: the other workers' parts
        of it would sit in the store, outside the index's budget, unloadable
        without the missing part."""
        saves, loads = set(failed_saves), set(failed_loads)
        self.payoff.cost(seconds + self._prefill_seconds(len(loads)))
        self.index.remove(saves | loads)
        self._ops.drops.extend(sorted(saves))
        self.counters.save_failures += len(saves)
        self.counters.load_failures += len(loads)
        self.counters.bytes_saved += bytes_saved
        self.counters.bytes_loaded += bytes_loaded
