"""``HostOffloadingConnector``: vLLM's ``OffloadingConnector``, loads in step
where the copy is a host memcpy.

vLLM reports every offloading load as asynchronous: the request waits in
``WAITING_FOR_REMOTE_KVS`` while a side stream copies, the worker reports the
job finished at the end of the step, and the request is scheduled one engine
step later. On a GPU that step is spent on other requests' compute while the
copy runs, so nothing is lost. With ``HostOffloadingWorker`` (the CPU build)
the copy is a synchronous memcpy done in ``start_load_kv``, before that very
step's forward pass: reporting it asynchronously only adds one engine step (a
whole batch's decode on a CPU) to every tier hit's time to first token.

So where the spec copies on the host, this connector declares the loads
synchronous, as vLLM's synchronous connectors do: the scheduler schedules the
request's remaining tokens in the step that loads its prefix (a load stops
short of the last token, which that step computes; the load's blocks are
shown to vLLM's scheduler side unhashed, as an asynchronous allocation leaves
them, so that it finds where the load starts; the request's stores of that
step are issued beside its load, which completes first), and the worker
does not report the load as a finished receive (vLLM's scheduler expects one
only for a request that waited). The job itself still completes through
vLLM's worker metadata, so ``CPUOffloadingManager``'s ``complete_load`` and
the cache policy see every load. Everywhere else (a GPU, or a spec that is
not ``HostOffloadingSpec``) it is vLLM's connector, unchanged.

With ``"store": "evicted"`` in its extra config it stores blocks when the
device evicts them instead of as they are computed
(``_victims``), on any spec.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
    TransferJob,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

from ._spec import HostOffloadingSpec
from ._victims import STORE_KEY, STORE_MODES, EvictionStores, eviction_stores_unsupported

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["HostOffloadingConnector"]

logger = logging.getLogger(__name__)

_IN_STEP_TOUCH_POINTS = {"_req_status", "_current_batch_load_jobs"}
"""vLLM's offloading scheduler-side attributes that loads in step read
(``OffloadingConnectorScheduler``, vLLM 0.32-0.33)."""


class HostOffloadingConnector(OffloadingConnector):
    """vLLM's ``OffloadingConnector`` whose loads complete within their step
    when ``HostOffloadingSpec`` copies host to host (module doc)."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        spec = OffloadingSpecFactory.get_spec_cls(extra)
        self._loads_in_step = issubclass(spec, HostOffloadingSpec) and spec.copies_on_host()
        # Both roles decide alike (the scheduler process and the workers):
        # from what vLLM's scheduler side sets up, not from an instance.
        missing = _IN_STEP_TOUCH_POINTS - set(
            OffloadingConnectorScheduler.__init__.__code__.co_names
        )
        if self._loads_in_step and missing:
            self._loads_in_step = False
            logger.warning(
                "agent-hints offloading: this vLLM's offloading scheduler lacks %s; tier loads "
                "stay asynchronous (one engine step per tier hit)",
                sorted(missing),
            )
        store = extra.get(STORE_KEY, STORE_MODES[0])
        if store not in STORE_MODES:
            raise ValueError(
                f"kv_connector_extra_config[{STORE_KEY!r}]={store!r}: expected one of {STORE_MODES}"
            )
        self._evictions: EvictionStores | None = None
        if store == "evicted" and self.connector_scheduler is not None:
            why = eviction_stores_unsupported(self.scheduler)
            if why is None:
                self._evictions = EvictionStores(self.scheduler)
                # Nothing is written through as computed (a method of vLLM's
                # scheduler side, replaced on this instance only).
                self.scheduler._build_store_jobs = _no_stores  # type: ignore[method-assign]
            else:
                logger.warning(
                    "agent-hints offloading: stores at eviction are off (%s); blocks are "
                    "stored as computed",
                    why,
                )

    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        super().bind_gpu_block_pool(gpu_block_pool)
        if self._evictions is not None:
            self._evictions.bind(gpu_block_pool)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        if not self._loads_in_step:
            return super().get_num_new_matched_tokens(request, num_computed_tokens)
        # The step that loads must compute at least the last token (vLLM's
        # local prefix cache stops there too; an asynchronous load is trimmed
        # after it lands, a synchronous one must be before): load no further.
        bound = request.num_tokens - 1 - num_computed_tokens
        theirs = self._max_loadable_tokens(request, num_computed_tokens)
        hit = self.scheduler.get_num_new_matched_tokens(
            request,
            num_computed_tokens,
            max_num_new_tokens=bound if theirs is None else min(bound, theirs),
        )[0]
        return hit, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if self._loads_in_step and num_external_tokens:
            # vLLM's scheduler side finds where a load starts by the first
            # allocated block without a hash, as an asynchronous load leaves
            # them (``delay_cache_blocks``); a synchronous allocation hashes
            # them at once. Show it the blocks as the asynchronous path does.
            blocks = KVCacheBlocks(
                tuple(
                    [KVCacheBlock(b.block_id, is_null=b.is_null) for b in group]
                    for group in blocks.blocks
                )
            )
        super().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        if self._evictions is not None:
            self._evictions.finishing(scheduler_output.finished_req_ids or ())
        meta = self._build_meta(scheduler_output)
        if self._evictions is not None:
            assert isinstance(meta, OffloadingConnectorMetadata)
            self._evictions.build(meta)
        return meta

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        if self._evictions is not None and isinstance(meta, OffloadingWorkerMetadata):
            self._evictions.completed(meta)
        super().update_connector_output(connector_output)

    def _build_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        if not self._loads_in_step:
            return super().build_connector_meta(scheduler_output)
        # vLLM's scheduler side issues a request's stores only while no load of
        # it is pending, true of its asynchronous loads (the request is not
        # running yet). This step's loads complete in start_load_kv, before its
        # forward pass and before its stores are submitted (at the next step's
        # start): keep them out of that check while the step's jobs are built.
        side = self.scheduler
        loading = [
            (side._req_status[job.req_id].transfer_jobs, job_id)
            for job_id, job in side._current_batch_load_jobs.items()
        ]
        for jobs, job_id in loading:
            jobs.discard(job_id)
        try:
            return super().build_connector_meta(scheduler_output)
        finally:
            for jobs, job_id in loading:
                jobs.add(job_id)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        sending, receiving = super().get_finished(finished_req_ids)
        return sending, set() if self._loads_in_step else receiving


def _no_stores(scheduler_output: SchedulerOutput) -> dict[int, TransferJob]:
    """vLLM's write-through, off: stores at eviction write the tier."""
    return {}
