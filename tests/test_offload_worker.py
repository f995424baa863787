"""``HostOffloadingWorker``: vLLM's offloading transfers, copied host to host.

Specs are vLLM's own (``GPULoadStoreSpec`` with group sizes and first-block
indices, ``CPULoadStoreSpec`` chunk ids), laid out as vLLM's
``CPUOffloadingWorker`` lays them: ``blocks_per_chunk`` device pages per
chunk, a group's first chunk possibly entered mid-way.
"""

from __future__ import annotations

import pytest
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from server_ext.offload import HostOffloadingWorker

PAGE = 48
BLOCKS = 16


def _caches(
    groups: list[list[int]], tensors: int = 2
) -> tuple[CanonicalKVCaches, list[torch.Tensor]]:
    # Strided views like vLLM's (a block's page inside a wider row).
    storage = [
        torch.randint(-128, 127, (BLOCKS, PAGE + 16), dtype=torch.int8) for _ in range(tensors)
    ]
    views = [s[:, :PAGE] for s in storage]
    caches = CanonicalKVCaches(
        [CanonicalKVCacheTensor(v, PAGE) for v in views],
        [[CanonicalKVCacheRef(t, PAGE) for t in g] for g in groups],
    )
    return caches, views


def test_store_then_load_round_trips_every_byte() -> None:
    caches, views = _caches([[0, 1]])
    worker = HostOffloadingWorker(caches, blocks_per_chunk=1, num_chunks=8)
    before = [v.clone() for v in views]
    assert worker.submit_store(
        1, GPULoadStoreSpec([3, 7, 2], [3], [0]), CPULoadStoreSpec([5, 0, 6])
    )
    for v in views:
        v.zero_()
    assert worker.submit_load(2, CPULoadStoreSpec([0, 6]), GPULoadStoreSpec([9, 11], [2], [1]))
    for old, new in zip(before, views, strict=True):
        assert torch.equal(new[9], old[7]) and torch.equal(new[11], old[2])
        assert not new[3].any()  # only what was loaded
    results = {r.job_id: r for r in worker.get_finished()}
    assert results[1].success and results[1].transfer_size == 3 * PAGE * 2
    assert results[2].transfer_size == 2 * PAGE * 2
    assert worker.get_finished() == []


def test_chunks_of_several_blocks_entered_mid_chunk() -> None:
    """With 2 blocks per chunk a request whose first new block is its 3rd
    (index 3: odd) starts in the second page of its first chunk."""
    caches, views = _caches([[0, 1]])
    worker = HostOffloadingWorker(caches, blocks_per_chunk=2, num_chunks=4)
    before = [v.clone() for v in views]
    # Blocks 3, 4, 5 of a request in device blocks 10, 11, 12 -> chunks 2 (page 1), 0 (both).
    worker.submit_store(1, GPULoadStoreSpec([10, 11, 12], [3], [3]), CPULoadStoreSpec([2, 0]))
    for v in views:
        v.zero_()
    worker.submit_load(2, CPULoadStoreSpec([2, 0]), GPULoadStoreSpec([1, 2, 3], [3], [3]))
    for old, new in zip(before, views, strict=True):
        assert torch.equal(new[1:4], old[10:13])


def test_each_group_copies_its_own_tensors() -> None:
    caches, views = _caches([[0], [1]])
    worker = HostOffloadingWorker(caches, blocks_per_chunk=1, num_chunks=4)
    before = [v.clone() for v in views]
    # Group 0: block 4 -> chunk 0; group 1: blocks 5, 6 -> chunks 1, 2.
    worker.submit_store(1, GPULoadStoreSpec([4, 5, 6], [1, 2], [0, 0]), CPULoadStoreSpec([0, 1, 2]))
    for v in views:
        v.zero_()
    worker.submit_load(2, CPULoadStoreSpec([0, 1, 2]), GPULoadStoreSpec([4, 5, 6], [1, 2], [0, 0]))
    assert torch.equal(views[0][4], before[0][4]) and not views[0][5:7].any()
    assert torch.equal(views[1][5:7], before[1][5:7]) and not views[1][4].any()


def test_refuses_kv_views_it_cannot_copy() -> None:
    caches = CanonicalKVCaches(
        [CanonicalKVCacheTensor(torch.zeros(4, 8, dtype=torch.float16), 16)],
        [[CanonicalKVCacheRef(0, 16)]],
    )
    with pytest.raises(ValueError, match="int8"):
        HostOffloadingWorker(caches, blocks_per_chunk=1, num_chunks=2)
