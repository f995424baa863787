"""``AgentHintsConnector``: vLLM's KV connector interface, handed on to the
scheduler-side (``scheduler.ConnectorScheduler``) and worker-side
(``worker.ConnectorWorker``) objects, as vLLM's own connectors are laid out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._config import ExtensionConfig
from .._vllm import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorPromMetrics,
    KVConnectorRole,
    KVConnectorStats,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from ..tier import TierConfig, TierOps
from .metadata import AgentHintsMetadata
from .metrics import AgentHintsPromMetrics, AgentHintsStats
from .scheduler import ConnectorScheduler
from .tier import refuse_sleep_mode, tier_for_role
from .worker import ConnectorWorker

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["AgentHintsConnector"]


class AgentHintsConnector(KVConnectorBase_V1, SupportsHMA):
    """Scheduler-side connector that turns agent hints into KV retention, plus an
    optional KV tier below device memory (``"tier"`` in the extra config).

    Without a tier of its own it loads and saves nothing (a pure cache-residency
    policy) and the worker-side instance is inert. With one (Mooncake), hinted
    requests' full blocks are written through to the tier as they are computed,
    and a returning prefix that left the device cache is loaded from the tier
    instead of recomputed. Enable with::

        --kv-transfer-config '{"kv_connector": "AgentHintsConnector",
          "kv_connector_module_path": "server_ext.connector", "kv_role": "kv_both",
          "kv_connector_extra_config": {"tier": "none"}}'

    (``kv_role`` as ``server_ext.extension_flags`` sets it: ``kv_both`` with a
    tier, ``kv_producer`` with ``"tier": "none"``; the default host tier is
    vLLM's ``OffloadingConnector`` beside this one, as ``extension_flags``
    composes them.)
    """

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        transfer = self._kv_transfer_config
        extra = transfer.kv_connector_extra_config
        tier = tier_for_role(extra, transfer)
        refuse_sleep_mode(tier, vllm_config.model_config)
        self._scheduler: ConnectorScheduler | None = None
        self._worker: ConnectorWorker | None = None
        if role == KVConnectorRole.SCHEDULER:
            host = TierConfig.from_mapping(extra)
            self._scheduler = ConnectorScheduler(
                vllm_config,
                kv_cache_config,
                transfer,
                ExtensionConfig.from_mapping(extra),
                tier,
                offloaded=host is not None and host.kind == "host",
            )
        elif tier is not None:
            self._worker = ConnectorWorker(vllm_config, tier, int(kv_cache_config.num_blocks))

    @property
    def requires_kv_delivery(self) -> bool:
        """False: retention and tier saves are best effort (a lost save is a later
        miss), so a preempted request keeps its in-flight output as it would
        without the extension (vLLM's default follows ``kv_role``, which names a
        producer here)."""
        return False

    def _on_scheduler(self) -> ConnectorScheduler:
        assert self._scheduler is not None, "a scheduler-side hook on a worker"
        return self._scheduler

    # -- scheduler side

    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        self._on_scheduler().bind_kv_cache_manager(kv_cache_manager)

    def reset_cache(self) -> bool:
        return self._on_scheduler().reset_cache()

    def has_pending_block_frees(self) -> bool:
        return self._on_scheduler().has_pending_block_frees()

    def on_new_request(self, request: Request) -> None:
        self._on_scheduler().on_new_request(request)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self._on_scheduler().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self._on_scheduler().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self._on_scheduler().build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self._on_scheduler().update_connector_output(connector_output)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """``SupportsHMA``: retention reads the first group's blocks, the only
        one where it can act (with several groups retention holds references
        and the tier is off; both say so at start-up)."""
        return self.request_finished(request, block_ids[0] if block_ids else [])

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._on_scheduler().request_finished(request, block_ids)

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        return self._scheduler.stats() if self._scheduler is not None else None

    @classmethod
    def build_kv_connector_stats(
        cls, data: dict[str, Any] | None = None
    ) -> KVConnectorStats | None:
        return AgentHintsStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        return AgentHintsPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # -- worker side: tier transfers (inert without a tier)

    def _tier_ops(self) -> TierOps | None:
        if self._worker is None or not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        return meta.tier if isinstance(meta, AgentHintsMetadata) and meta.tier else None

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        if self._worker is not None:
            self._worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        ops = self._tier_ops()
        if self._worker is not None and ops is not None:
            self._worker.start_load_kv(ops)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return None  # saves copy every layer at once, in wait_for_save

    def wait_for_save(self) -> None:
        ops = self._tier_ops()
        if self._worker is not None and ops is not None:
            self._worker.wait_for_save(ops)

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
        if self._scheduler is not None:
            self._scheduler.shutdown()

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.get_block_ids_with_load_errors() if self._worker else set()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        return self._worker.build_connector_worker_meta() if self._worker else None
