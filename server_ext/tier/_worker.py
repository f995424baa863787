"""Worker-side tier transfers: KV cache blocks <-> tier, every failure contained."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from ._blocks import BlockCodec
from ._guard import GuardedTier
from ._keys import Shard, shard_key
from ._protocol import KVTier

__all__ = ["TierReport", "TierWorker"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class TierReport:
    """What the worker did since the last report (keys are the planner's keys;
    ``seconds``: of engine steps spent loading and saving)."""

    failed_saves: list[str] = field(default_factory=list)
    failed_loads: list[str] = field(default_factory=list)
    bytes_saved: int = 0
    bytes_loaded: int = 0
    seconds: float = 0.0


class TierWorker:
    """Moves packed blocks between the KV caches and a tier.

    Store keys carry the worker's ``shard`` (pipeline stage, tensor- and
    decode-context-parallel rank: ``shard_key``), so the parts of one block
    never collide in a shared store, nor pass for one another. Where every
    tensor-parallel rank holds the same bytes (MLA), one part serves them all:
    the others load it and do not store (``stores`` False). No method raises:
    a failed load is reported (vLLM recomputes the block), a failed save only
    means a later miss. Each call's loads (and each call's saves) take at
    most ``budget_s`` of the step: a slow but alive store is given that long,
    and what did not fit is a failed load (recomputed) or a skipped save.
    A guarded (remote) tier starts connecting at construction: the
    connection (Mooncake registers its segment, seconds on a busy host)
    would otherwise take the first step's budget and skip its saves.
    """

    def __init__(
        self,
        tier: KVTier,
        codec: BlockCodec,
        shard: Shard = Shard(),  # noqa: B008 - frozen, shared safely
        *,
        stores: bool = True,
        budget_s: float = float("inf"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tier = tier
        self.codec = codec
        self._shard = shard
        self._stores = stores
        self._budget_s = budget_s
        self._clock = clock
        self._report = TierReport()
        if isinstance(tier, GuardedTier):
            tier.connect()

    @contextlib.contextmanager
    def _budget(self) -> Iterator[float]:
        """The deadline of this batch, which a guarded store also waits by; the
        batch's time goes into the report (the tier's cost to the step)."""
        self.codec.synchronize()
        start = self._clock()
        deadline = start + self._budget_s
        try:
            if isinstance(self.tier, GuardedTier):
                with self.tier.deadline(deadline):
                    yield deadline
            else:
                yield deadline
        finally:
            self._report.seconds += self._clock() - start

    def load(self, loads: Sequence[tuple[str, int]]) -> set[int]:
        """Copy tier -> KV cache; return the block ids that could not be loaded."""
        failed: set[int] = set()
        with self._budget() as deadline:
            for key, block_id in loads:
                if self._clock() >= deadline or not self._load(key, block_id):
                    failed.add(block_id)
                    self._report.failed_loads.append(key)
        return failed

    def _load(self, key: str, block_id: int) -> bool:
        try:
            value = self.tier.get(shard_key(key, self._shard))
            if value is not None:
                self.codec.unpack(value, block_id)
                self._report.bytes_loaded += value.numel()
                return True
        except Exception:
            logger.exception("agent-hints tier: load of block %d failed", block_id)
        return False

    def save(self, saves: Sequence[tuple[str, int, float]], drops: Sequence[str]) -> None:
        """Apply the planner's drops, then copy KV cache -> tier (not at all on a
        worker whose part another worker stores: ``stores``)."""
        if not self._stores:
            return
        with self._budget() as deadline:
            try:
                if drops:
                    self.tier.drop([shard_key(key, self._shard) for key in drops])
                values = self.codec.pack([block_id for _, block_id, _ in saves])
            except Exception:
                logger.exception("agent-hints tier: save of %d blocks failed", len(saves))
                self._report.failed_saves.extend(key for key, _, _ in saves)
                return
            for (key, _, pin_s), value in zip(saves, values, strict=True):
                if self._clock() < deadline and self._put(key, value, pin_s):
                    self._report.bytes_saved += value.numel()
                else:
                    self._report.failed_saves.append(key)

    def _put(self, key: str, value: torch.Tensor, pin_s: float) -> bool:
        try:
            return self.tier.put(shard_key(key, self._shard), value, pin_s)
        except Exception:
            logger.exception("agent-hints tier: put failed")
            return False

    def take_report(self) -> TierReport | None:
        report, self._report = self._report, TierReport()
        if (
            report.failed_saves
            or report.failed_loads
            or report.bytes_saved
            or report.bytes_loaded
            or report.seconds
        ):
            return report
        return None
