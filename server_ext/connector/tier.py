"""The connector's tier wiring: which tier a role runs, the scheduler's side
of it (``SchedulerTier``: the planner and the shared-store probe), and each
worker's part of a block.

``"tier": "host"`` is vLLM's ``OffloadingConnector`` beside this connector
(``server_ext.offload``); the tier this connector runs itself is Mooncake's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from .._contract import HintedParams
from .._requests import InFlight, RequestTable
from .._vllm import envs, parallel_ranks
from ..tier import (
    BlockProgress,
    GuardedTier,
    KeyIndex,
    MooncakeTier,
    Shard,
    TierConfig,
    TierConfigError,
    TierPayoff,
    TierPlanner,
    shard_key,
)
from .metadata import AgentHintsMetadata, TierWorkerMetadata

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = [
    "SchedulerTier",
    "first_shard",
    "layout",
    "make_planner",
    "one_hashed_group",
    "refuse_sleep_mode",
    "shared_store_probe",
    "tier_for_role",
    "tier_identity",
    "worker_shard",
]

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 0.05
"""The scheduler waits on a shared-store lookup; a normal one takes under 1 ms."""


def tier_identity(read: HintedParams | None, ttl_cap_s: float) -> tuple[str, float] | None:
    """(tenant, soft pin seconds) of a hinted request (``read``: its hint),
    else None (no tier use)."""
    if read is None:
        return None
    hints = read.hints
    pin = hints.ttl if hints.ttl is not None else hints.gap
    if hints.end or pin is None:
        return read.tenant, 0.0
    return read.tenant, min(float(pin), ttl_cap_s)


def tier_for_role(
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


def refuse_sleep_mode(tier: TierConfig | None, model_config: Any) -> None:
    """A tier of the connector's own (Mooncake) keeps its buffers registered
    across vLLM's sleep mode, which moves the KV cache: refused at start-up."""
    if tier is not None and getattr(model_config, "enable_sleep_mode", False):
        raise TierConfigError(
            "the Mooncake tier keeps buffers registered across vLLM's sleep mode, which "
            'moves the KV cache: drop --enable-sleep-mode, or use "tier": "host" or "none"'
        )


def shared_store_probe(config: TierConfig) -> GuardedTier:
    """A query-only Mooncake client for the scheduler: which blocks other
    engines stored. It contributes no memory; the scheduler waits on it, so a
    lookup longer than ``PROBE_TIMEOUT_S`` is a miss."""
    probe = GuardedTier(
        lambda: MooncakeTier(config.mooncake_master, segment_bytes=0, buffer_bytes=16 << 20),
        timeout_s=min(config.timeout_s, PROBE_TIMEOUT_S),
    )
    probe.connect()
    return probe


LAYOUT_FIELDS = ("num_kv_heads", "head_size", "dtype", "sliding_window", "attention_chunk_size")
"""The KV cache spec's fields that decide what a stored block's bytes mean."""


def layout(spec: object) -> str:
    """A KV cache spec's layout, named by fields rather than ``str(spec)``:
    vLLM 0.33 added ``is_draft`` to the spec's repr, and engines of 0.32 and
    0.33 with the same layout must name their blocks alike in a shared store."""
    fields = (f"{name}={getattr(spec, name, None)}" for name in LAYOUT_FIELDS)
    return ",".join((type(spec).__name__, *fields))


def first_shard(vllm_config: VllmConfig) -> Shard:
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


def worker_shard(vllm_config: VllmConfig) -> tuple[Shard, bool]:
    """This worker's part of every block (``Shard``: its stage and ranks), and
    whether it stores it (with MLA only TP rank 0 does; every rank loads it)."""
    pp_rank, tp_rank, dcp_rank = parallel_ranks()
    replicated = _replicated(vllm_config)
    shard = dataclasses.replace(
        first_shard(vllm_config),
        pp_rank=pp_rank,
        tp_rank=0 if replicated else tp_rank,
        dcp_rank=dcp_rank,
    )
    return shard, not replicated or tp_rank == 0


def make_planner(
    config: TierConfig,
    vllm_config: VllmConfig,
    kv_cache_config: KVCacheConfig,
    namespace_suffix: str,
    probe: Callable[[], GuardedTier],
) -> TierPlanner:
    """The scheduler's tier planner for this engine's KV layout: its blocks'
    keys live in a namespace of the model, the block size and bytes, and the
    layout (plus ``namespace_suffix``, which a cache reset changes); with
    Mooncake, ``probe`` gives the query-only client of the shared store."""
    groups = kv_cache_config.kv_cache_groups
    spec = groups[0].kv_cache_spec
    block_size = int(vllm_config.cache_config.block_size)
    block_bytes = int(spec.page_size_bytes) * len(groups[0].layer_names)
    namespace = "|".join(
        str(part)
        for part in (vllm_config.model_config.model, block_size, block_bytes, layout(spec))
    )
    namespace += namespace_suffix
    shared: Callable[[Sequence[str]], int] | None = None
    if config.kind == "mooncake":
        store = probe()
        first = first_shard(vllm_config)

        def shared(keys: Sequence[str]) -> int:
            # Rank 0's shard stands for the block; another rank's missing
            # shard is a failed load, recomputed like any tier miss.
            return store.contains([shard_key(key, first) for key in keys])

    return TierPlanner(
        KeyIndex(config.budget_bytes, owner_budget_bytes=config.tenant_budget_bytes),
        namespace,
        block_size,
        block_bytes,
        shared=shared,
        secret=config.secret(),
        payoff=TierPayoff(trial=config.trial),
    )


def one_hashed_group(kv_cache_config: KVCacheConfig, block_size: int) -> bool:
    """Whether the KV cache is one group hashed per block: the layout in
    which a request's block hashes name the pool's blocks (the tier and
    retention by eviction order need it)."""
    return len(kv_cache_config.kv_cache_groups) == 1 and kv_cache_config.hash_block_size in (
        None,
        block_size,
    )


class SchedulerTier:
    """The scheduler's side of a tier of the connector's own (Mooncake): the
    planner for this engine's KV layout, the query-only probe of the shared
    store, and each scheduler hook's part of the tier. A fault in any of them
    costs the tier (``fault``), never a request.
    """

    def __init__(
        self,
        config: TierConfig,
        vllm_config: VllmConfig,
        kv_cache_config: KVCacheConfig,
        transfer: KVTransferConfig,
        ttl_cap_s: float,
        fault: Callable[[], None],
    ) -> None:
        self._config = config
        self._ttl_cap_s = ttl_cap_s
        self._vllm_config = vllm_config
        self._kv_cache_config = kv_cache_config
        self._fault = fault
        self._shared_probe: GuardedTier | None = None
        # Connector cache resets so far: each starts the tier's keys anew.
        self._resets = 0
        # A tier miss at load time (evicted, corrupt, store down) must cost a
        # recompute, never a failed request.
        transfer.kv_load_failure_policy = "recompute"
        self.planner = self._make_planner()

    def _make_planner(self) -> TierPlanner:
        return make_planner(
            self._config,
            self._vllm_config,
            self._kv_cache_config,
            f"|reset {self._resets}" if self._resets else "",
            self._probe,
        )

    def _probe(self) -> GuardedTier:
        if self._shared_probe is None:
            self._shared_probe = shared_store_probe(self._config)
        return self._shared_probe

    def _failed(self, what: str) -> None:
        logger.exception("agent-hints tier: %s failed; serving without the tier", what)
        self._fault()

    def reset(self, requests: RequestTable) -> None:
        """Start over (``ConnectorScheduler.reset_cache``): a new planner with
        an empty index and a new key namespace; the ``requests`` it tracked
        leave the tier; its counters and books carry over."""
        old = self.planner
        self._resets += 1
        for _, record in requests.items():
            record.tiered = False
        self.planner = self._make_planner()
        self.planner.counters, self.planner.payoff = old.counters, old.payoff

    def track(self, request_id: str, record: InFlight, read: HintedParams | None) -> None:
        """A new request: the tier plans for it if it is hinted."""
        identity = tier_identity(read, self._ttl_cap_s)
        if identity is not None:
            self.planner.track(request_id, *identity)
            record.tiered = True

    def lookup(self, request: Request, num_computed_tokens: int) -> int:
        """Tokens past ``num_computed_tokens`` the tier can load (0 on a fault)."""
        try:
            return self.planner.lookup(
                request.request_id, request.block_hashes, request.num_tokens,
                num_computed_tokens,
            )  # fmt: skip
        except Exception:
            self._failed("lookup")
            return 0

    def allocated(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        try:
            block_ids = blocks.get_block_ids()[0]
            self.planner.allocated(request.request_id, block_ids, num_external_tokens)
        except Exception:
            self._failed("load planning")

    def step(
        self,
        manager: KVCacheManager,
        scheduled: Mapping[str, int],
        requests: RequestTable,
        busy_s: float,
        seconds_per_token: float | None,
    ) -> AgentHintsMetadata:
        """The step's metadata: its planned loads, and saves of the tiered
        requests' blocks it completes (``scheduled``: tokens per request); the
        engine ran its last step for ``busy_s``."""
        try:
            self.planner.engine_step(busy_s, seconds_per_token)
            progress = []
            for req_id, tokens in scheduled.items():
                record = requests.get(req_id)
                if record is None or not record.tiered:
                    continue
                request = cast("Request", record.progress)
                progress.append(
                    BlockProgress(
                        req_id,
                        request.block_hashes,
                        manager.get_block_ids(req_id)[0],
                        # num_computed_tokens advances only after this call.
                        request.num_computed_tokens + tokens,
                    )
                )
            return AgentHintsMetadata(self.planner.step(progress))
        except Exception:
            self._failed("save planning")
            # The step's planned loads cannot reach the worker: report them
            # failed, so vLLM recomputes those blocks.
            return AgentHintsMetadata(self.planner.abandon())

    def worker_report(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, TierWorkerMetadata):
            r = meta.report
            self.planner.worker_report(
                r.failed_saves, r.failed_loads, r.bytes_saved, r.bytes_loaded, r.seconds
            )

    def finished(self, request_id: str) -> None:
        self.planner.finished(request_id)

    def shutdown(self) -> None:
        if self._shared_probe is not None:
            self._shared_probe.close()
