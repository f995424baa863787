"""The connector's tier wiring: which tier a role runs, the scheduler's
planner and shared-store probe, and each worker's part of a block.

``"tier": "host"`` is vLLM's ``OffloadingConnector`` beside this connector
(``server_ext.offload``); the tier this connector runs itself is Mooncake's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._contract import HintedParams
from .._vllm import envs, parallel_ranks
from ..tier import (
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

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

__all__ = [
    "first_shard",
    "layout",
    "make_planner",
    "refuse_sleep_mode",
    "shared_store_probe",
    "tier_for_role",
    "tier_identity",
    "worker_shard",
]

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
