"""Stores at eviction: the tier keeps what the device is about to lose.

vLLM's offloading writes every block through to the tier as it is computed,
so the tier's LRU holds the most recent blocks, and those are the blocks the
device holds too: device plus tier reach about as many distinct blocks as the
larger of the two, where an exclusive pair reaches their sum. With stores at
eviction (``"store": "evicted"`` in the offloading connector's extra config)
nothing is written as it is computed; instead, the blocks each engine step's
allocations evict from the device (vLLM's LRU free queue picks them) are
stored if the tier lacks them. A block that comes back from the tier stays
there too, so its next eviction costs no copy. The tier then continues the
device's LRU order (an evicted block enters it as its most recent), as an
exclusive second level does: device plus tier hold as many distinct blocks
as their sizes allow.

The copies are vLLM's own store jobs, flushed as vLLM flushes a finished
request's store whose blocks it has allocated again (``jobs_to_flush``): the
worker completes the copy before the forward pass that overwrites the
blocks. On a GPU that copy is on the step's critical path (the evicted
bytes over the host link); on the CPU build it is a memcpy. Only the job's
completion is handled here (a victim's store belongs to no request), before
vLLM's scheduler side sees the step's completions.

It needs one offloaded chunk per device block, keyed by the block's own hash
(one KV cache group, full attention, offloaded block size = device block
size = hash block size); elsewhere it says so at start-up and stores as
computed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import TransferJob
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
    TransferJobStatus,
)
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.kv_offload.base import GPULoadStoreSpec, LookupResult, OffloadKey, ReqContext

from .._config import OFFLOAD_STORE_KEY
from ..tier import TIER_STORES

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        OffloadingConnectorMetadata,
        OffloadingWorkerMetadata,
    )
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

__all__ = ["STORE_KEY", "STORE_MODES", "EvictionStores", "eviction_stores_unsupported"]

STORE_KEY = OFFLOAD_STORE_KEY

STORE_MODES = TIER_STORES
"""``computed``: vLLM's write-through (every block as computed); ``evicted``:
the blocks the device is about to evict (module doc)."""

logger = logging.getLogger(__name__)

VICTIM_REQ_ID = "agent-hints-evicted"
"""The request id of the victims' store jobs (they belong to no request)."""

TOUCH_POINTS = {"_jobs", "_stale_job_threshold", "_job_counter"}
"""vLLM's offloading scheduler-side attributes that stores at eviction use
(vLLM 0.32-0.33): its job table and its job ids (and ``BlockPool.
_maybe_evict_cached_block``, through which every eviction passes)."""


def eviction_stores_unsupported(side: OffloadingConnectorScheduler) -> str | None:
    """Why stores at eviction cannot run on ``side``, or None."""
    missing = TOUCH_POINTS - set(OffloadingConnectorScheduler.__init__.__code__.co_names)
    if missing or not hasattr(BlockPool, "_maybe_evict_cached_block"):
        return f"this vLLM's offloading scheduler or block pool lacks {sorted(missing)}"
    config = side.config
    groups = config.kv_group_configs
    if len(groups) != 1 or config.dcp_world_size != 1:
        return "it needs one KV cache group on one decode context rank"
    group = groups[0]
    if (
        config.blocks_per_chunk != 1
        or group.hashes_per_chunk != 1
        or group.sliding_window_size_in_chunks is not None
        or group.is_eagle_group
        or group.requires_cow_source
    ):
        return (
            "it needs offloaded blocks of the device's block size, full attention "
            "(offloaded block size = device block size = hash block size)"
        )
    return None


@dataclass(slots=True)
class _Victims:
    """One store job of victims: its keys and the device blocks it reads."""

    keys: list[OffloadKey]
    block_ids: list[int]


class EvictionStores:
    """Scheduler side of stores at eviction (module doc), over vLLM's
    offloading scheduler ``side`` and the engine's block pool."""

    def __init__(self, side: OffloadingConnectorScheduler) -> None:
        self._side = side
        self._evicted: dict[OffloadKey, int] = {}
        self._jobs: dict[int, _Victims] = {}
        self.stored_blocks = 0

    def bind(self, pool: BlockPool) -> None:
        """Watch ``pool``'s evictions (``bind_gpu_block_pool``): vLLM evicts
        a cached block when an allocation takes it, and the step that
        allocated it overwrites it."""
        evict = pool._maybe_evict_cached_block

        def evicting(block: KVCacheBlock) -> bool:
            if block.block_hash is not None and not block.is_null:
                key = OffloadKey(bytes(block.block_hash))
                self._evicted[key] = block.block_id
            return evict(block)

        pool._maybe_evict_cached_block = evicting  # type: ignore[method-assign]

    def build(self, meta: OffloadingConnectorMetadata) -> None:
        """Store what this step's allocations evicted and the tier lacks, in
        one job that the worker completes before the step's forward pass
        overwrites the blocks (``jobs_to_flush``)."""
        evicted, self._evicted = self._evicted, {}
        side = self._side
        keys = [k for k in evicted if side.manager.lookup(k, _CONTEXT) is LookupResult.MISS]
        if not keys:
            return
        output = side.manager.prepare_store(keys, ReqContext(req_id=VICTIM_REQ_ID))
        if output is None or not output.keys_to_store:
            return  # the tier has no room it may evict: these blocks are lost
        keys = list(output.keys_to_store)
        ids = [evicted[k] for k in keys]
        job_id = side._generate_job_id()
        side._jobs[job_id] = TransferJobStatus(
            req_id=VICTIM_REQ_ID,
            pending_count=side.config.num_workers,
            keys=set(keys),
            is_store=True,
        )
        self._jobs[job_id] = _Victims(keys, ids)
        self.stored_blocks += len(keys)
        src = GPULoadStoreSpec(ids, group_sizes=[len(ids)], block_indices=[0])
        meta.store_jobs[job_id] = TransferJob(
            req_id=VICTIM_REQ_ID, src_spec=src, dst_spec=output.store_spec
        )
        if meta.jobs_to_flush is None:
            meta.jobs_to_flush = set()
        meta.jobs_to_flush.add(job_id)

    def completed(self, meta: OffloadingWorkerMetadata) -> None:
        """Take this step's completions of victim stores out of ``meta``
        (vLLM's scheduler side keys every other job to its request)."""
        side = self._side
        for job_id in [j for j in meta.completed_jobs if j in self._jobs]:
            count = meta.completed_jobs.pop(job_id)
            status = side._jobs.get(job_id)
            if job_id < side._stale_job_threshold or status is None:
                del self._jobs[job_id]  # the tier was reset: nothing to complete
                continue
            status.pending_count -= count
            if status.pending_count > 0:
                continue
            side.manager.complete_store(self._jobs.pop(job_id).keys, _CONTEXT)
            del side._jobs[job_id]


_CONTEXT = ReqContext(req_id=VICTIM_REQ_ID)
"""The context of lookups and completions of victims: no request, no hint
(a request's recency in the tier is set by its own loads)."""
