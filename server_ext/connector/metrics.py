"""The connector's telemetry: engine-core stats shipped to the API server, and
the ``agent_hints_*`` series vLLM exports on ``/metrics`` from them.

Each metric is declared once, with its help text, in ``_GAUGES`` or
``_COUNTERS``; the Prometheus series and the stats' gauge set are built from
those declarations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._config import ExtensionConfig
from .._vllm import KVConnectorPromMetrics, KVConnectorStats

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = ["AgentHintsPromMetrics", "AgentHintsStats", "StatsReporter"]

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


class StatsReporter:
    """vLLM's per-interval stats from the scheduler's cumulative readings:
    gauges as read, counters as what they moved since the last report."""

    def __init__(self) -> None:
        self._reported: dict[str, float] = {}

    def report(self, now: dict[str, float], observed: list[float]) -> AgentHintsStats | None:
        """The stats of this interval (None: nothing moved); ``observed``:
        the return calibration's new observations."""
        delta: dict[str, Any] = {
            k: (v if k in AgentHintsStats.GAUGES else v - self._reported.get(k, 0))
            for k, v in now.items()
            if v != self._reported.get(k)
        }
        self._reported = now
        if observed:
            delta[_OBSERVED] = observed
        return AgentHintsStats(data=delta) if delta else None
