"""``HostOffloadingSpec``: vLLM's CPU offloading spec, runnable on every platform.

It is vLLM's ``CPUOffloadingSpec`` (the same ``cpu_bytes_to_use`` sizing, the
same ``CPUOffloadingManager``, the cache policy named by ``eviction_policy``
and ``cache_policy_module_path``) with one change: where vLLM's own worker
refuses the platform (a CPU build: "only supported on CUDA-alike and XPU
GPUs"), the worker is ``HostOffloadingWorker``. On a GPU the worker is
vLLM's, pinned memory and side streams included.
"""

from __future__ import annotations

import logging

from vllm.platforms import current_platform
from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingWorker
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from ._worker import HostOffloadingWorker

__all__ = ["HostOffloadingSpec"]

logger = logging.getLogger(__name__)


class HostOffloadingSpec(CPUOffloadingSpec):
    """vLLM's ``CPUOffloadingSpec``, with a host-to-host copy where vLLM has none."""

    @staticmethod
    def copies_on_host() -> bool:
        """Whether this platform's transfers are ``HostOffloadingWorker``'s
        synchronous host copies (no CUDA or XPU device for vLLM's worker)."""
        return not (current_platform.is_cuda_alike() or current_platform.is_xpu())

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if not self.copies_on_host():
            return super().get_worker(kv_caches)
        worker = HostOffloadingWorker(kv_caches, self.blocks_per_chunk, self.num_chunks)
        logger.info(
            "agent-hints offloading: %d host chunks of %d block(s), %d bytes, copied host to host",
            self.num_chunks, self.blocks_per_chunk, worker.host_bytes,
        )  # fmt: skip
        return worker
