"""The connector's scheduler role: hints into retention, warm-ups paced
against real requests, and the tier's plan (with a tier of the connector's own).

``AgentHintsConnector`` hands each scheduler-side hook of vLLM here. Retention
decisions live in ``EngineRetention`` (``server_ext._engine``, no vLLM import);
each request's one record in ``server_ext._requests``; the wrapped
allocations in ``allocation``; warm-up pacing in ``warmups``; the tier's side
in ``tier``; telemetry in ``metrics``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from .._config import ExtensionConfig
from .._contract import read_params, without_hints
from .._engine import EngineRetention
from .._headroom import Headroom
from .._pool import HoldPort, ShelfPort
from .._requests import RequestTable
from .._vllm import check_cpu_reservation
from ..offload import lower_to_envelope, policy_counters
from ..policy import RetentionPolicy, StepTimer
from ..tier import TierConfig
from .allocation import binding_scheduler, wrap_allocations
from .metadata import AgentHintsMetadata
from .metrics import AgentHintsStats, StatsReporter
from .tier import SchedulerTier, one_hashed_group
from .warmups import WarmupsGoFirst, pace_warmups, yielded_warmups

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["ConnectorScheduler"]

logger = logging.getLogger(__name__)


class ConnectorScheduler:
    """The scheduler-side state of one engine: one record per request in
    flight (``RequestTable``, its params read once), retention (once vLLM
    binds its KV cache manager), the tier's side, and the engine's step
    timer."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        kv_cache_config: KVCacheConfig,
        transfer: KVTransferConfig,
        config: ExtensionConfig,
        tier: TierConfig | None,
        offloaded: bool,
    ) -> None:
        self._vllm_config = vllm_config
        self._kv_cache_config = kv_cache_config
        self._config = config
        # The host tier: vLLM's OffloadingConnector beside this one.
        self._offloaded = offloaded
        self._total_blocks = int(kv_cache_config.num_blocks)
        self._block_size = int(vllm_config.cache_config.block_size)
        self._step_tokens = int(vllm_config.scheduler_config.max_num_batched_tokens)
        self.kv_cache_manager: KVCacheManager | None = None
        self.retention: EngineRetention | None = None
        # Retention by eviction order.
        self._shelf: ShelfPort | None = None
        self._stats = StatsReporter()
        # Every request from arrival to finish, its params read once.
        self._requests = RequestTable()
        # The engine's step time: the tier's books and warm-first admission's window.
        self._timer = StepTimer()
        # The steps a running warm-up sat out.
        self._warmup_yields = 0
        self._guard: WarmupsGoFirst | None = None
        self._headroom: Headroom | None = None
        # Preemptions of finished requests: real ones, warm-ups.
        self._preemptions = {False: 0, True: 0}
        self.tier: SchedulerTier | None = None
        if tier is not None and not self._one_hashed_group():
            logger.warning("agent-hints tier: needs one KV cache group hashed per block; off")
        elif tier is not None:
            self.tier = SchedulerTier(
                tier, vllm_config, kv_cache_config, transfer, config.ttl_cap_s, self._tier_fault
            )
        check_cpu_reservation()

    def _tier_fault(self) -> None:
        if self.retention is not None:
            self.retention.faults += 1

    def _release_retentions(self) -> None:
        """Release every retention, and every block eviction order set aside."""
        if self.retention is not None:
            self.retention.release_all()
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
        if self.tier is not None:
            self.tier.reset(self._requests)
        return True

    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        self.kv_cache_manager = kv_cache_manager
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
                tiered=self.tier is not None or self._offloaded,
                step_tokens=self._step_tokens,
                timer=self._timer,
            ),
            requests=self._requests,
        )
        self.retention = retention
        if isinstance(port, ShelfPort):
            self._shelf = port
        # The caller binding the manager is vLLM's scheduler (or a connector
        # composing this one): found now, while it is on the stack.
        scheduler = binding_scheduler(kv_cache_manager)
        if scheduler is not None:
            self._guard = WarmupsGoFirst(scheduler, self._requests)
        self._headroom = self._make_headroom(kv_cache_manager, scheduler)
        wrap_allocations(
            kv_cache_manager,
            self._block_size,
            retention,
            port.releases_for_room,
            self._release_retentions,
            scheduler,
            self._headroom,
            self._guard,
        )

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
        return one_hashed_group(self._kv_cache_config, self._block_size)

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
        params = read_params(request.kv_transfer_params)
        record = self._requests.add(request.request_id, request, params)
        if params.control is not None:
            return  # delivered when it finishes: it carries no inference
        if self.retention is not None:
            blocks = len(request.block_hashes)
            self.retention.request_added(request.request_id, params.hinted, blocks, request)
            self._pace_warmups()
        if self.tier is not None:
            self.tier.track(request.request_id, record, params.hinted)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        # None = "not now": the scheduler passes over the request this step
        # (warm-first admission) and considers it again on the next.
        tokens = 0
        record = self._requests.get(request.request_id)
        if self.tier is not None and record is not None and record.tiered:
            tokens = self.tier.lookup(request, num_computed_tokens)
        if self._shelf is not None and self.retention is not None:
            # vLLM computes a prompt's last token whatever the cache holds.
            servable = (request.num_tokens - 1) // self._block_size
            self._shelf.admit(
                request.request_id,
                record is not None and record.key is not None,
                request.block_hashes[:servable],
                num_computed_tokens // self._block_size,
            )
        if self.retention is not None:
            cached_blocks = (num_computed_tokens + tokens) // self._block_size
            if self.retention.defers(request.request_id, len(request.block_hashes) - cached_blocks):
                return None, False
        return tokens, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if self._shelf is not None:
            self._shelf.admitted(request.request_id)
        if self.retention is not None:
            self.retention.request_scheduled(request.request_id)
        record = self._requests.get(request.request_id)
        if self.tier is not None and record is not None and record.tiered:
            self.tier.allocated(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> AgentHintsMetadata:
        timer, busy = self._timer, self._timer.busy_s
        timer.step(time.monotonic(), scheduler_output.num_scheduled_tokens)
        if self._headroom is not None:
            self._headroom.new_step()
        scheduled = scheduler_output.num_scheduled_tokens
        if self.retention is not None:
            self._warmup_yields += yielded_warmups(self._requests, scheduled)
            self.retention.step_scheduled(scheduled)
            self._pace_warmups()
        if self.tier is None or self.kv_cache_manager is None:
            return AgentHintsMetadata()
        return self.tier.step(
            self.kv_cache_manager,
            scheduled,
            self._requests,
            timer.busy_s - busy,
            timer.seconds_per_token,
        )

    def _pace_warmups(self) -> None:
        """Make running warm-ups sit out the next step, or run again, as the
        retention decides (``EngineRetention.warmups_yield``)."""
        assert self.retention is not None
        pace_warmups(self._requests, self.retention.warmups_yield)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        if self.tier is not None:
            self.tier.worker_report(connector_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        if self.tier is not None:
            self.tier.finished(request.request_id)
        try:
            self._retain(request, block_ids)
        finally:
            # Retention took its records off the table; what it does not track
            # (control messages, requests before retention) leaves here.
            self._requests.pop(request.request_id)
        return False, None

    def _retain(self, request: Request, block_ids: list[int]) -> None:
        """A finished request's part in retention: its blocks, or its control message."""
        retention = self.retention
        if retention is None:
            return
        record = self._requests.get(request.request_id)
        warmup = record is not None and record.warmup
        self._preemptions[warmup] += request.num_preemptions
        params = record.params if record is not None else None
        control = params.control if params is not None else None
        if control is not None:
            retention.control(control)
            return
        pool = self.kv_cache_manager.block_pool if self.kv_cache_manager else None
        # Only full, hashed blocks can be hit again; the partial tail cannot.
        full = (
            [b for b in block_ids if pool.blocks[b].block_hash is not None and b != 0]
            if pool is not None
            else []
        )
        retention.request_finished(request.request_id, full)

    # -- metrics

    def stats(self) -> AgentHintsStats | None:
        """What moved since the last report (vLLM's ``get_kv_connector_stats``)."""
        now: dict[str, float] = {}
        observed: list[float] = []
        if self.retention is not None:
            now.update(dataclasses.asdict(self.retention.stats))
            del now["return_log2_error_sum"]  # a histogram of each error instead
            now["faults"] = self.retention.faults
            now["deferrals"] = self.retention.deferrals
            now["warmup_yields"] = self._warmup_yields
            now["real_preemptions"] = self._preemptions[False]
            now["warmup_preemptions"] = self._preemptions[True]
            if (trial := self.retention.trial) is not None:
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
        if self.tier is not None:
            planner = self.tier.planner
            counters = dataclasses.asdict(planner.counters)
            now.update({f"tier_{name}": value for name, value in counters.items()})
            now["tier_bytes"] = planner.index.bytes_used
            payoff = planner.payoff
            now["tier_saving"] = float(payoff.saving)
            now["tier_cost_seconds"] = payoff.cost_s
            now["tier_spared_seconds"] = payoff.spared_s
        if self.retention is not None:
            observed = self.retention.policy.take_return_errors()
        return self._stats.report(now, observed)

    def shutdown(self) -> None:
        if self.tier is not None:
            self.tier.shutdown()
