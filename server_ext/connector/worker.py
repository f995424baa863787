"""The connector's worker role: the tier's transfers in each worker (inert
without a tier of the connector's own)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..tier import BlockCodec, GuardedTier, MooncakeTier, TierConfig, TierOps, TierWorker
from .metadata import TierWorkerMetadata
from .tier import worker_shard

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = ["ConnectorWorker"]

logger = logging.getLogger(__name__)


class ConnectorWorker:
    """Loads the blocks the scheduler planned before the forward pass, saves
    after it, and reports what failed (vLLM recomputes those blocks)."""

    def __init__(self, vllm_config: VllmConfig, tier: TierConfig, total_blocks: int) -> None:
        self._vllm_config = vllm_config
        self._config = tier
        self._secret = tier.secret()
        self._total_blocks = total_blocks
        self.tier_worker: TierWorker | None = None
        self._load_errors: set[int] = set()

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        config = self._config
        try:
            codec = BlockCodec(kv_caches, self._total_blocks)
            secret = self._secret
            tier = GuardedTier(
                lambda: MooncakeTier(
                    config.mooncake_master,
                    segment_bytes=config.mooncake_segment_bytes,
                    secret=secret,
                ),
                timeout_s=config.timeout_s,
            )
            shard, stores = worker_shard(self._vllm_config)
            self.tier_worker = TierWorker(
                tier, codec, shard, stores=stores, budget_s=config.step_budget_s
            )
            first = next(iter(kv_caches.values()))
            logger.info(
                "agent-hints tier %s: %d layers of %s %s, %d bytes per block",
                config.kind, len(kv_caches), tuple(first.shape), first.dtype, codec.block_bytes,
            )  # fmt: skip
        except Exception:
            logger.exception("agent-hints tier: cannot use these KV caches; tier off")

    def start_load_kv(self, ops: TierOps) -> None:
        # Promised blocks the scheduler could not plan: vLLM recomputes them.
        self._load_errors.update(ops.failed)
        if not ops.loads:
            return
        worker = self.tier_worker
        if worker is None:
            self._load_errors.update(block for _, block in ops.loads)
            return
        self._load_errors |= worker.load(ops.loads)

    def wait_for_save(self, ops: TierOps) -> None:
        if self.tier_worker is not None and (ops.saves or ops.drops):
            self.tier_worker.save(ops.saves, ops.drops)

    def shutdown(self) -> None:
        if self.tier_worker is not None:
            self.tier_worker.tier.close()

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def build_connector_worker_meta(self) -> TierWorkerMetadata | None:
        report = self.tier_worker.take_report() if self.tier_worker is not None else None
        return TierWorkerMetadata(report) if report is not None else None
