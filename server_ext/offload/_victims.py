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

from collections.abc import Iterable
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

VICTIM_REQ_ID = "agent-hints-evicted"
"""The request id of the victims' store jobs (they belong to no request)."""

TOUCH_POINTS = {"_jobs", "_stale_job_threshold", "_job_counter", "_req_status"}
"""vLLM's offloading scheduler-side attributes that stores at eviction use
(vLLM 0.32-0.33): its job table, its job ids and its requests' states (their
``req_context`` and ``group_states[0].block_ids``), and ``BlockPool.
_maybe_evict_cached_block``, through which every eviction passes."""


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
    """One store job of victims: its keys, and the context the tier's policy
    sees them under (their last request's hints, or none)."""

    keys: list[OffloadKey]
    context: ReqContext
    owned: bool


class EvictionStores:
    """Scheduler side of stores at eviction (module doc), over vLLM's
    offloading scheduler ``side`` and the engine's block pool.

    A victim is stored under the hints of the last request that held its
    block (vLLM's ``ReqContext`` of that request, seen when it finished), so
    the tier's cache policy knows whose it is: an ended branch's victims
    leave the tier first, as its own blocks would.
    """

    def __init__(self, side: OffloadingConnectorScheduler) -> None:
        self._side = side
        self._evicted: dict[OffloadKey, int] = {}
        self._owners: dict[int, ReqContext] = {}  # device block -> its last request
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

    def finishing(self, finished_req_ids: Iterable[str]) -> None:
        """Requests that finished (before vLLM's scheduler side forgets
        them): their blocks now belong to them until reused or evicted."""
        statuses = self._side._req_status
        for req_id in finished_req_ids:
            status = statuses.get(req_id)
            if status is None:
                continue
            for block_id in status.group_states[0].block_ids:
                if block_id:
                    self._owners[block_id] = status.req_context

    def build(self, meta: OffloadingConnectorMetadata) -> None:
        """Store what this step's allocations evicted and the tier lacks, one
        job per last owner, that the worker completes before the step's
        forward pass overwrites the blocks (``jobs_to_flush``)."""
        evicted, self._evicted = self._evicted, {}
        side = self._side
        groups: dict[int, tuple[ReqContext | None, dict[OffloadKey, int]]] = {}
        for key, block_id in evicted.items():
            owner = self._owners.pop(block_id, None)
            if side.manager.lookup(key, _CONTEXT) is LookupResult.MISS:
                groups.setdefault(id(owner), (owner, {}))[1][key] = block_id
        for owner, blocks in groups.values():
            self._store(meta, owner, blocks)

    def _store(
        self,
        meta: OffloadingConnectorMetadata,
        owner: ReqContext | None,
        blocks: dict[OffloadKey, int],
    ) -> None:
        side = self._side
        # vLLM evicts a chain tail first; the tier ranks a chain's head most
        # recent (a chain is useless without it). Inserts rank in order, an
        # owner's access (at completion) in reverse: order the keys for the
        # last of the two.
        keys = list(blocks) if owner is None else list(reversed(blocks))
        context = ReqContext(req_id=VICTIM_REQ_ID)
        if owner is not None:
            context.kv_transfer_params = owner.kv_transfer_params
            context.kv_hints = owner.kv_hints
        output = side.manager.prepare_store(keys, context)
        if output is None or not output.keys_to_store:
            return  # the tier has no room it may evict: these blocks are lost
        keys = list(output.keys_to_store)
        ids = [blocks[k] for k in keys]
        job_id = side._generate_job_id()
        side._jobs[job_id] = TransferJobStatus(
            req_id=VICTIM_REQ_ID,
            pending_count=side.config.num_workers,
            keys=set(keys),
            is_store=True,
        )
        self._jobs[job_id] = _Victims(keys, context, owned=owner is not None)
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
            victims = self._jobs.pop(job_id)
            side.manager.complete_store(victims.keys, victims.context)
            if victims.owned:  # the policy sees its owner's hints
                side.manager.on_request_finished(victims.context)
            del side._jobs[job_id]


_CONTEXT = ReqContext(req_id=VICTIM_REQ_ID)
"""The context of lookups and completions of victims: no request, no hint
(a request's recency in the tier is set by its own loads)."""
