"""The one piece of vLLM's offloading that vLLM's CPU build lacks: the copy.

vLLM's ``CPUOffloadingWorker`` moves KV between device blocks and pinned host
chunks with batched copies on CUDA/XPU side streams, and refuses a CPU
platform. On the CPU test bed the "device" KV cache already lives in host
memory, so this worker does the same transfers as plain tensor copies: the
same specs in (``GPULoadStoreSpec`` block ids, group sizes and first-block
offsets; ``CPULoadStoreSpec`` chunk ids), the same layout of a chunk
(``blocks_per_chunk`` device pages side by side), the same results out.
Everything around it — vLLM's ``OffloadingConnector``, its scheduler side,
``CPUOffloadingManager`` and the cache policy — runs unchanged.

The copies are synchronous: a CPU step computes its KV before the connector
submits the next transfers, and a host-to-host copy has no engine to overlap
with (a thread would take a core from the model on this 2-core bed). Each
job is reported finished at the next ``get_finished``, as vLLM reports a
completed CUDA event.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)

__all__ = ["HostOffloadingWorker"]


class HostOffloadingWorker(OffloadingWorker):
    """Host-to-host ``OffloadingWorker`` (module doc).

    Args:
        kv_caches: vLLM's canonical KV caches: per tensor ``(num_blocks,
            page_bytes)`` int8 views of the engine's KV, and which tensors
            each KV cache group uses.
        blocks_per_chunk: Device blocks in one offloaded chunk.
        num_chunks: Chunks the host buffer holds (the manager's capacity).
    """

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, num_chunks: int):
        self._bpc = blocks_per_chunk
        self._device = [t.tensor for t in kv_caches.tensors]
        for t in kv_caches.tensors:
            if t.tensor.dim() != 2 or t.tensor.dtype != torch.int8:
                raise ValueError(
                    f"agent-hints offloading: expected (blocks, bytes) int8 KV views, got "
                    f"{tuple(t.tensor.shape)} {t.tensor.dtype}"
                )
        # One host page per device block, a chunk's pages side by side.
        self._host = [
            torch.zeros((num_chunks * blocks_per_chunk, t.tensor.shape[1]), dtype=torch.int8)
            for t in kv_caches.tensors
        ]
        self._groups = [
            sorted({ref.tensor_idx for ref in refs}) for refs in kv_caches.group_data_refs
        ]
        self._finished: list[TransferResult] = []

    @property
    def host_bytes(self) -> int:
        """Bytes of host memory the worker holds for offloaded KV."""
        return sum(h.numel() for h in self._host)

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        return self._transfer(job_id, src_spec, dst_spec, store=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        return self._transfer(job_id, dst_spec, src_spec, store=False)

    def get_finished(self) -> list[TransferResult]:
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        return None  # every submitted job has completed

    def _transfer(
        self, job_id: int, device: GPULoadStoreSpec, host: LoadStoreSpec, store: bool
    ) -> bool:
        assert isinstance(host, BlockIDsLoadStoreSpec)
        start = time.perf_counter()
        moved = 0
        device_at = host_at = 0
        for group, (size, first) in enumerate(
            zip(device.group_sizes, device.block_indices, strict=True)
        ):
            if size == 0:
                continue
            # The first chunk may start mid-chunk: skip the pages before the
            # group's first block (vLLM's worker does the same).
            skip = int(first) % self._bpc
            chunks = -(-(size + skip) // self._bpc)
            chunk_ids = host.block_ids[host_at : host_at + chunks].astype(np.int64)
            pages = (chunk_ids[:, None] * self._bpc + np.arange(self._bpc)).ravel()
            host_idx = torch.from_numpy(pages[skip : skip + size].copy())
            device_idx = torch.from_numpy(
                device.block_ids[device_at : device_at + size].astype(np.int64)
            )
            for t in self._groups[group]:
                if store:
                    self._host[t].index_copy_(
                        0, host_idx, self._device[t].index_select(0, device_idx)
                    )
                else:
                    self._device[t][device_idx] = self._host[t].index_select(0, host_idx)
                moved += size * self._device[t].shape[1]
            device_at += size
            host_at += chunks
        self._finished.append(TransferResult(job_id, True, moved, time.perf_counter() - start))
        return True
