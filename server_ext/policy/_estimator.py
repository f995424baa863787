"""Online, bounded-memory estimate of tool-gap durations."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from statistics import NormalDist
from typing import Generic, TypeVar

from ._config import EstimatorConfig

MIN_GAP_S = 0.01
"""Gaps are floored here before taking logs (a zero gap means "at once")."""

_K = TypeVar("_K")


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted gap: ``expected_s`` (median) orders victims, ``deadline_s``
    (a high quantile) bounds the retention."""

    expected_s: float
    deadline_s: float


@dataclass(slots=True)
class _LogStats:
    """Mean and variance of log gaps that forget old observations.

    Invariant: ``weight <= memory``; while ``weight < memory`` the moments are
    the exact sample moments, afterwards an exponential average with weight
    ``1 / memory`` per observation, so a session's habits can drift.
    """

    weight: float = 0.0
    mean: float = 0.0
    var: float = 0.0

    def add(self, x: float, memory: float) -> None:
        self.weight = min(self.weight + 1.0, memory)
        alpha = 1.0 / self.weight
        delta = x - self.mean
        self.mean += alpha * delta
        self.var = (1.0 - alpha) * (self.var + alpha * delta * delta)


class _LruStats(Generic[_K]):
    """At most ``capacity`` ``_LogStats``, least recently used dropped first."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._stats: OrderedDict[_K, _LogStats] = OrderedDict()

    def __len__(self) -> int:
        return len(self._stats)

    def get(self, key: _K) -> _LogStats | None:
        stats = self._stats.get(key)
        if stats is not None:
            self._stats.move_to_end(key)
        return stats

    def add(self, key: _K, x: float, memory: float) -> None:
        stats = self.get(key)
        if stats is None:
            stats = self._stats[key] = _LogStats()
            if len(self._stats) > self._capacity:
                self._stats.popitem(last=False)
        stats.add(x, memory)

    def pop(self, key: _K) -> None:
        self._stats.pop(key, None)


class GapEstimator:
    """Learns tool-gap durations per session and per (tenant, tool).

    Gaps are heavy-tailed (median ~10 s, p75 ~30 s, max hours), so everything
    is done on log seconds and a prediction is a log-normal fit. A prediction
    pools, as weighted moment matching (a mixture of log-normals):

    - the prior: the client's ``gap`` (``hint_weight`` pseudo-observations)
      or, without it, the population prior (``prior_weight``);
    - the session's observed gaps and the tool's observed gaps (weight = their
      effective counts; an observation feeds both, which only speeds up how
      fast learning overrides the prior).

    Disagreement between sources widens the spread and hence the deadline.
    Memory is bounded: sessions and tools are kept in LRU maps.
    """

    def __init__(self, config: EstimatorConfig | None = None) -> None:
        self._config = config or EstimatorConfig()
        self._z = NormalDist().inv_cdf(self._config.quantile)
        self._sessions: _LruStats[tuple[str, str]] = _LruStats(self._config.max_sessions)
        self._tools: _LruStats[tuple[str, str]] = _LruStats(self._config.max_tools)

    @property
    def tracked_sessions(self) -> int:
        return len(self._sessions)

    @property
    def tracked_tools(self) -> int:
        return len(self._tools)

    def observe(self, tenant: str, sid: str, tool: str | None, seconds: float) -> None:
        """Record one observed gap of session ``sid`` (after tool ``tool``)."""
        x = math.log(max(seconds, MIN_GAP_S))
        memory = self._config.memory
        self._sessions.add((tenant, sid), x, memory)
        if tool is not None:
            self._tools.add((tenant, tool), x, memory)

    def predict(
        self, tenant: str, sid: str, tool: str | None, client_gap: float | None
    ) -> Prediction:
        """Predict the next gap of ``sid``, with the client's ``gap`` as prior."""
        c = self._config
        if client_gap is None:
            sources = [(c.prior_weight, math.log(c.prior_gap_s), c.prior_sigma**2)]
        else:
            sources = [(c.hint_weight, math.log(max(client_gap, MIN_GAP_S)), c.hint_sigma**2)]
        learned = [self._sessions.get((tenant, sid))]
        if tool is not None:
            learned.append(self._tools.get((tenant, tool)))
        sources += [(s.weight, s.mean, s.var) for s in learned if s is not None]
        total = sum(w for w, _, _ in sources)
        mu = sum(w * m for w, m, _ in sources) / total
        var = sum(w * (v + (m - mu) ** 2) for w, m, v in sources) / total
        return Prediction(
            expected_s=math.exp(mu), deadline_s=math.exp(mu + self._z * math.sqrt(var))
        )

    def forget_session(self, tenant: str, sid: str) -> None:
        """Drop an ended session's statistics (its tools' statistics stay)."""
        self._sessions.pop((tenant, sid))
