"""Knobs of the retention policy and of the gap estimator."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class EstimatorConfig:
    """Priors and memory bounds of ``GapEstimator``.

    The population prior matches the development traces: median think time
    ~10 s, p75 ~30 s, i.e. log-normal with sigma ~ ln(3) / 0.674 ~ 1.6.

    Args:
        prior_gap_s: Median gap assumed when the client gives no ``gap``.
        prior_sigma: Log-space spread of that population prior.
        prior_weight: Pseudo-observations the population prior counts for.
        hint_sigma: Log-space spread assumed around a client ``gap``.
        hint_weight: Pseudo-observations a client ``gap`` counts for.
        memory: Effective window (observations) of the forgetting statistics.
        quantile: Quantile of the gap distribution used for deadlines.
        max_sessions: Sessions tracked (least recently used dropped first).
        max_tools: (tenant, tool) pairs tracked (LRU).
    """

    prior_gap_s: float = 10.0
    prior_sigma: float = 1.6
    prior_weight: float = 1.0
    hint_sigma: float = 0.7
    hint_weight: float = 4.0
    memory: float = 32.0
    quantile: float = 0.9
    max_sessions: int = 4096
    max_tools: int = 1024

    def __post_init__(self) -> None:
        if not (self.prior_gap_s > 0 and self.prior_sigma >= 0 and self.hint_sigma >= 0):
            raise ValueError("priors must be positive")
        if not (self.prior_weight > 0 and self.hint_weight > 0 and self.memory >= 1):
            raise ValueError("weights must be positive and memory >= 1")
        if not 0.5 <= self.quantile < 1:
            raise ValueError("quantile must be in [0.5, 1)")
        if self.max_sessions < 1 or self.max_tools < 1:
            raise ValueError("max_sessions and max_tools must be >= 1")


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Budgets and time bounds of ``RetentionPolicy``.

    Args:
        total_blocks: KV blocks in the engine's pool.
        max_held_fraction: Cap on distinct held blocks, as a fraction of the pool.
        max_tenant_fraction: Cap per tenant, as a fraction of the global cap.
        ttl_cap_s: No retention outlives this, whatever the client asks.
        default_ttl_s: Longest deadline when the client gives neither gap nor ttl.
        gap_slack: Multiplier on the predicted gap quantile for the deadline.
        min_retain_s: Shortest deadline (a client ``ttl`` may ask for less).
        max_pending_returns: Branches whose departure time is remembered to
            learn gaps even when their retention is gone (LRU).
        max_tenant_retentions: Live retentions one tenant may have (its
            oldest victim goes for a new one): bounds the state, and so the
            work, that one tenant's sessions make, however many share blocks.
        prefetch_min_accuracy: Prefetch warm-ups may take room from retentions
            (of branches due back later) only while at least this share of
            recent warmed retentions lasted until their branch came back
            (``RetentionPolicy.prefetch_accuracy``); below it they use free
            blocks only. 0 lets them always take room.
        estimator: Priors and bounds of the gap estimator.
    """

    total_blocks: int
    max_held_fraction: float = 0.5
    max_tenant_fraction: float = 0.5
    ttl_cap_s: float = 600.0
    default_ttl_s: float = 60.0
    gap_slack: float = 2.0
    min_retain_s: float = 5.0
    max_pending_returns: int = 16384
    max_tenant_retentions: int = 4096
    prefetch_min_accuracy: float = 0.5
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)

    def __post_init__(self) -> None:
        if self.total_blocks < 0:
            raise ValueError("total_blocks must be >= 0")
        if not (0 <= self.max_held_fraction <= 1 and 0 <= self.max_tenant_fraction <= 1):
            raise ValueError("fractions must be in [0, 1]")
        if not (self.ttl_cap_s >= 0 and self.default_ttl_s >= 0 and self.min_retain_s >= 0):
            raise ValueError("durations must be >= 0")
        if self.gap_slack < 1:
            raise ValueError("gap_slack must be >= 1")
        if self.max_pending_returns < 1 or self.max_tenant_retentions < 1:
            raise ValueError("max_pending_returns and max_tenant_retentions must be >= 1")
        if not 0 <= self.prefetch_min_accuracy <= 1:
            raise ValueError("prefetch_min_accuracy must be in [0, 1]")

    @property
    def held_cap(self) -> int:
        """Most distinct blocks all retentions together may hold."""
        return math.floor(self.total_blocks * self.max_held_fraction)

    @property
    def tenant_cap(self) -> int:
        """Most distinct blocks one tenant's retentions may hold."""
        return math.floor(self.held_cap * self.max_tenant_fraction)
