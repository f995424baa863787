"""Stores at eviction (``server_ext.offload._victims``): the tier receives the
blocks the device evicts, not every block as it is computed.

Against vLLM's own ``CPUOffloadingManager`` (the tier's books), vLLM's own
``KVCacheBlock`` and the job table of vLLM's offloading scheduler side; the
real server test (``test_tier_server.py``) shows the effect: with the same
tier bytes a session that write-through loses comes back whole.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
)
from vllm.v1.core.kv_cache_utils import KVCacheBlock, make_block_hash_with_group_id
from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from hints_spec import AgentHints
from server_ext._contract import hint_params
from server_ext.offload._victims import VICTIM_REQ_ID, EvictionStores, eviction_stores_unsupported

CTX = ReqContext(req_id="test")


class Pool:
    """What ``EvictionStores`` watches of vLLM's ``BlockPool``: the one call
    every eviction of a cached block passes through."""

    def __init__(self) -> None:
        self.evicted: list[int] = []

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        self.evicted.append(block.block_id)
        return block.block_hash is not None


def _side(capacity: int, policy: str = "lru") -> Any:
    """vLLM's offloading scheduler side, as far as stores at eviction use it."""
    counter = itertools.count()
    path = None if policy == "lru" else "server_ext.offload"
    return SimpleNamespace(
        manager=CPUOffloadingManager(capacity, cache_policy=policy, cache_policy_module_path=path),
        _req_status={},
        config=SimpleNamespace(num_workers=1),
        _jobs={},
        _stale_job_threshold=0,
        _generate_job_id=lambda: next(counter),
    )


def _block(block_id: int, cached: bool = True) -> KVCacheBlock:
    block = KVCacheBlock(block_id)
    if cached:
        block.set_block_hash(make_block_hash_with_group_id(bytes([block_id]) * 32, 0), 64)
    return block


def _key(block: KVCacheBlock) -> OffloadKey:
    assert block.block_hash is not None
    return OffloadKey(bytes(block.block_hash))


def _setup(capacity: int = 8, policy: str = "lru") -> tuple[EvictionStores, Pool, Any]:
    side, pool = _side(capacity, policy), Pool()
    stores = EvictionStores(side)
    stores.bind(pool)  # type: ignore[arg-type]
    return stores, pool, side


def _step(stores: EvictionStores) -> OffloadingConnectorMetadata:
    meta = OffloadingConnectorMetadata(load_jobs={}, store_jobs={})
    stores.build(meta)
    return meta


def _complete(stores: EvictionStores, meta: OffloadingConnectorMetadata) -> dict[int, int]:
    worker = OffloadingWorkerMetadata(completed_jobs={j: 1 for j in meta.store_jobs} | {99: 1})
    stores.completed(worker)
    return worker.completed_jobs


def test_evicted_blocks_are_stored_before_the_step_overwrites_them() -> None:
    stores, pool, side = _setup()
    blocks = [_block(i) for i in range(3)] + [_block(9, cached=False)]
    for block in blocks:
        assert pool._maybe_evict_cached_block(block) is (block.block_hash is not None)
    assert pool.evicted == [0, 1, 2, 9]  # vLLM's own eviction still runs
    meta = _step(stores)
    ((job_id, job),) = meta.store_jobs.items()
    assert job.req_id == VICTIM_REQ_ID
    assert job.src_spec.block_ids.tolist() == [0, 1, 2]  # the uncached block has nothing to keep
    assert meta.jobs_to_flush == {job_id}  # done before this step's forward pass
    assert side._jobs[job_id].is_store
    keys = [_key(b) for b in blocks[:3]]
    assert all(side.manager.lookup(k, CTX) is LookupResult.HIT_PENDING for k in keys)
    # The worker's completion is taken out of vLLM's books (no request owns
    # it); another job's stays for vLLM's scheduler side.
    assert _complete(stores, meta) == {99: 1}
    assert all(side.manager.lookup(k, CTX) is LookupResult.HIT for k in keys)
    assert side._jobs == {}
    assert stores.stored_blocks == 3


def test_a_step_without_evictions_stores_nothing() -> None:
    stores, _, _ = _setup()
    meta = _step(stores)
    assert meta.store_jobs == {} and meta.jobs_to_flush is None


def test_a_block_the_tier_holds_is_not_copied_again() -> None:
    stores, pool, _ = _setup()
    block = _block(1)
    pool._maybe_evict_cached_block(block)
    _complete(stores, _step(stores))
    # It came back to the device (a tier hit) and is evicted again.
    pool._maybe_evict_cached_block(block)
    assert _step(stores).store_jobs == {}


def test_the_tier_continues_the_devices_lru_order() -> None:
    """The tier (2 chunks, vLLM's LRU) keeps the most recently evicted."""
    stores, pool, side = _setup(capacity=2)
    blocks = [_block(i) for i in range(3)]
    for block in blocks:
        pool._maybe_evict_cached_block(block)
        _complete(stores, _step(stores))
    held = [side.manager.lookup(_key(b), CTX) is LookupResult.HIT for b in blocks]
    assert held == [False, True, True]


def test_a_reset_tier_drops_the_jobs_in_flight() -> None:
    stores, pool, side = _setup()
    pool._maybe_evict_cached_block(_block(1))
    meta = _step(stores)
    side._jobs.clear()  # vLLM's reset_cache: every job is stale
    side._stale_job_threshold = 1
    assert _complete(stores, meta) == {99: 1}
    assert stores._jobs == {}


def test_a_job_completes_when_every_worker_has_copied() -> None:
    stores, pool, side = _setup()
    side.config.num_workers = 2
    block = _block(1)
    pool._maybe_evict_cached_block(block)
    meta = _step(stores)
    _complete(stores, meta)
    assert side.manager.lookup(_key(block), CTX) is LookupResult.HIT_PENDING
    _complete(stores, meta)
    assert side.manager.lookup(_key(block), CTX) is LookupResult.HIT


def _layout(**changes: object) -> Any:
    group = dict(
        group_idx=0,
        hashes_per_chunk=1,
        sliding_window_size_in_chunks=None,
        is_eagle_group=False,
        requires_cow_source=False,
    )
    config = dict(blocks_per_chunk=1, dcp_world_size=1)
    for name, value in changes.items():
        (group if name in group else config)[name] = value
    return SimpleNamespace(
        config=SimpleNamespace(kv_group_configs=(SimpleNamespace(**group),), **config)
    )


def test_stores_at_eviction_need_one_chunk_per_device_block() -> None:
    assert eviction_stores_unsupported(_layout()) is None
    for change in (
        {"blocks_per_chunk": 2},  # a chunk spans blocks another request may still hold
        {"hashes_per_chunk": 2},
        {"sliding_window_size_in_chunks": 4},
        {"is_eagle_group": True},
        {"dcp_world_size": 2},
    ):
        assert eviction_stores_unsupported(_layout(**change)) is not None, change


def _finished(
    side: Any, stores: EvictionStores, blocks: list[KVCacheBlock], **hints: object
) -> None:
    """A hinted request that held ``blocks`` (head first) finished."""
    context = ReqContext(req_id="r", kv_transfer_params=hint_params("t", AgentHints(**hints)))  # type: ignore[arg-type]
    ids = [b.block_id for b in blocks]
    side._req_status["r"] = SimpleNamespace(
        req_context=context, group_states=(SimpleNamespace(block_ids=ids),)
    )
    stores.finishing(["r"])
    del side._req_status["r"]


def test_victims_are_stored_under_their_last_requests_hints() -> None:
    """An ended branch's evicted blocks reach the tier as that branch's, so
    the hints' policy lets them go first, as it would its own stores."""
    stores, pool, side = _setup(policy="AgentHintsCachePolicy")
    ended, live = [_block(i) for i in range(1, 4)], [_block(i) for i in range(4, 6)]
    _finished(side, stores, ended, sid="s", br="sub", end=True)
    for block in reversed(ended + live):  # vLLM frees and evicts a chain tail first
        pool._maybe_evict_cached_block(block)
    _complete(stores, _step(stores))
    policy = side.manager._policy
    assert policy.counters.released_chunks == len(ended)
    assert list(policy._released) == [_key(b) for b in reversed(ended)]  # tail goes first
    # The unowned victims rank as evicted: the chain's head most recent.
    assert list(policy._live) == [_key(b) for b in reversed(live)]
