"""Every vLLM touch point of the extension, in one module.

vLLM's connector API and scheduler internals are experimental upstream and move
between releases, so the extension pins ``SUPPORTED_VLLM`` and touches vLLM only
here:

- ``KVConnectorBase_V1`` (scheduler role): ``bind_kv_cache_manager``,
  ``on_new_request``, ``update_state_after_alloc``, ``build_connector_meta``
  (every step), ``request_finished`` (before blocks are freed),
  ``get_kv_connector_stats`` / ``build_prom_metrics`` (metrics);
- ``BlockPool.touch`` / ``free_blocks`` and ``KVCacheBlock.block_hash``;
- ``KVCacheManager.allocate_slots`` and ``reset_prefix_cache``, wrapped on the
  bound instance: release retained blocks before the scheduler would preempt,
  and before a prefix-cache reset;
- ``EngineClient.notify_kv_transfer_request_rejected``: a pre-aborted request
  that carries control events to the engine with no inference;
- ``app.state.vllm_config`` / ``app.state.engine_client`` in the API server.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from ._config import CONNECTOR_NAME, ExtensionConfig
from ._engine import CONTROL_KEY, EngineRetention, control_params
from .policy import RetentionPolicy

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = [
    "SUPPORTED_VLLM",
    "AgentHintsConnector",
    "connector_config",
    "send_control",
]

logger = logging.getLogger(__name__)

SUPPORTED_VLLM = (">=0.32", "<0.34")


def _check_version() -> None:
    parts = vllm.__version__.split(".")
    try:
        minor = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return  # a source build: trust the operator
    if not (0, 32) <= minor < (0, 34):
        logger.warning(
            "agent-hints supports vllm%s,%s; found %s: retention may not work",
            *SUPPORTED_VLLM,
            vllm.__version__,
        )


_check_version()


# ---------------------------------------------------------------- API server side


def connector_config(app_state: Any) -> ExtensionConfig | None:
    """The extension's config when the engine runs our connector, else None."""
    kv = getattr(getattr(app_state, "vllm_config", None), "kv_transfer_config", None)
    if kv is None or kv.kv_connector != CONNECTOR_NAME:
        return None
    return ExtensionConfig.from_mapping(kv.kv_connector_extra_config)


async def send_control(
    app_state: Any, tenant: str, sid: str, events: Sequence[Mapping[str, object]]
) -> None:
    """Deliver control events to the engine core without an inference request."""
    await app_state.engine_client.notify_kv_transfer_request_rejected(
        f"agent-hints-control-{uuid.uuid4().hex}", control_params(tenant, sid, events)
    )


# ---------------------------------------------------------------- engine side


class _PoolPort:
    """``BlockPort`` over vLLM's ``BlockPool``: hold = touch, release = free."""

    def __init__(self, pool: BlockPool) -> None:
        self._pool = pool

    def hold(self, block_ids: Sequence[int]) -> None:
        self._pool.touch([self._pool.blocks[i] for i in block_ids])

    def release(self, block_ids: Sequence[int]) -> None:
        # Tail first, as vLLM frees a request: the shared prefix is evicted last.
        self._pool.free_blocks([self._pool.blocks[i] for i in reversed(block_ids)])


@dataclass
class AgentHintsStats(KVConnectorStats):
    """Retention telemetry shipped from the engine core to the API server.

    ``data`` holds gauges (latest value wins) and counters (deltas since the
    previous report, summed on aggregation).
    """

    data: dict[str, Any] = field(default_factory=dict)

    GAUGES = ("held_blocks", "retained_branches")

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name, value in other.data.items():
            if name in self.GAUGES:
                self.data[name] = value
            else:
                self.data[name] = self.data.get(name, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not self.data


_COUNTERS = {
    "holds": "Branches retained after a request",
    "expiries": "Retentions released at their deadline",
    "pressure_releases": "Retentions released to make room for an allocation",
    "budget_releases": "Retentions released to keep within a budget",
    "ends": "Retentions released by an end hint or event",
    "returns": "Retentions released because their branch came back",
    "replacements": "Retentions replaced by a newer request of the same branch",
    "resets": "Retentions released by a prefix-cache reset",
    "clipped": "Retention hints clipped by a budget or TTL cap",
    "rejected": "Retention hints rejected (over budget, unknown branch)",
    "faults": "Internal retention faults contained (the engine served without hints)",
}
_GAUGES = {
    "held_blocks": "KV blocks held for idle agent branches",
    "retained_branches": "Agent branches whose KV is retained",
}


class AgentHintsPromMetrics(KVConnectorPromMetrics):
    """``agent_hints_*`` series on vLLM's ``/metrics`` (per engine)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._series: dict[str, dict[int, Any]] = {}
        for name, doc in _GAUGES.items():
            gauge = self._gauge_cls(f"agent_hints_{name}", doc, labelnames=labelnames)
            self._series[name] = self._per_engine(gauge)
        for name, doc in _COUNTERS.items():
            counter = self._counter_cls(f"agent_hints_{name}", doc, labelnames=labelnames)
            self._series[name] = self._per_engine(counter)

    def _per_engine(self, metric: Any) -> dict[int, Any]:
        return {i: metric.labels(*values) for i, values in self.per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, value in transfer_stats_data.items():
            series = self._series.get(name, {}).get(engine_idx)
            if series is None:
                continue
            if name in _GAUGES:
                series.set(value)
            else:
                series.inc(value)


class AgentHintsConnector(KVConnectorBase_V1):
    """Scheduler-side connector that turns agent hints into KV retention.

    It loads and saves nothing (a pure cache-residency policy); the worker-side
    instance is inert. Enable with::

        --kv-transfer-config '{"kv_connector": "AgentHintsConnector",
          "kv_connector_module_path": "server_ext._vllm", "kv_role": "kv_both"}'
    """

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._config = ExtensionConfig.from_mapping(
            self._kv_transfer_config.kv_connector_extra_config
        )
        self._total_blocks = int(kv_cache_config.num_blocks)
        self._block_size = int(vllm_config.cache_config.block_size)
        self._retention: EngineRetention | None = None
        self._reported: dict[str, int] = {}

    # -- binding: the two wrapped KVCacheManager methods live here

    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        policy = RetentionPolicy(self._config.policy_config(self._total_blocks))
        retention = EngineRetention(policy, _PoolPort(kv_cache_manager.block_pool))
        self._retention = retention
        block_size = self._block_size
        allocate: Callable[..., Any] = kv_cache_manager.allocate_slots
        reset: Callable[[], bool] = kv_cache_manager.reset_prefix_cache

        def allocate_slots(request: Request, num_new_tokens: int, *args: Any, **kw: Any) -> Any:
            blocks = allocate(request, num_new_tokens, *args, **kw)
            # Soft retention: before the scheduler preempts or defers anything,
            # give back held blocks, furthest expected return first.
            needed = -(-num_new_tokens // block_size)
            while blocks is None and retention.make_room(needed):
                blocks = allocate(request, num_new_tokens, *args, **kw)
            return blocks

        def reset_prefix_cache() -> bool:
            retention.release_all()
            return reset()

        kv_cache_manager.allocate_slots = allocate_slots  # type: ignore[method-assign]
        kv_cache_manager.reset_prefix_cache = reset_prefix_cache  # type: ignore[method-assign]

    # -- scheduler-side hooks

    def on_new_request(self, request: Request) -> None:
        if self._retention is not None:
            self._retention.request_added(request.request_id, request.kv_transfer_params)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(
        self, request: Request, blocks: Any, num_external_tokens: int
    ) -> None:
        if self._retention is not None:
            self._retention.request_scheduled(request.request_id)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        if self._retention is not None:
            self._retention.tick()
        return KVConnectorMetadata()

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        retention = self._retention
        if retention is None:
            return False, None
        params = request.kv_transfer_params or {}
        control = params.get(CONTROL_KEY)
        if control is not None:
            retention.control(control)
            return False, None
        pool = self._kv_cache_manager.block_pool if self._kv_cache_manager else None
        # Only full, hashed blocks can be hit again; the partial tail cannot.
        full = (
            [b for b in block_ids if pool.blocks[b].block_hash is not None and b != 0]
            if pool is not None
            else []
        )
        retention.request_finished(request.request_id, full)
        return False, None

    # -- metrics

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self._retention is None:
            return None
        now = dataclasses.asdict(self._retention.stats)
        now["faults"] = self._retention.faults
        delta = {
            k: (v if k in AgentHintsStats.GAUGES else v - self._reported.get(k, 0))
            for k, v in now.items()
            if v != self._reported.get(k)
        }
        self._reported = now
        return AgentHintsStats(data=delta) if delta else None

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

    # -- worker side: nothing to load or save

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return None

    def wait_for_save(self) -> None:
        return None
