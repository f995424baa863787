"""Online, bounded-memory estimate of tool-gap durations."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Generic, TypeVar

from ._config import EstimatorConfig

MIN_GAP_S = 0.01
"""Gaps are floored here before taking logs (a zero gap means "at once")."""

_K = TypeVar("_K")
_V = TypeVar("_V")

_TOOLS_PER_SESSION = 16
"""Tools whose gaps a session keeps apart (LRU); others share its untyped stats."""

_STANDARD = NormalDist()


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted gap, log-normal: ``expected_s`` (median) orders victims,
    ``deadline_s`` (a high quantile) bounds the retention, ``spread`` (the
    standard deviation of the log gap) says how that median moves while the
    branch stays away (``median_given_elapsed``)."""

    expected_s: float
    deadline_s: float
    spread: float = 0.0

    def plan(self, since: float) -> ReturnPlan:
        """This gap, begun at ``since``."""
        return ReturnPlan(since, self.expected_s, self.spread)


@dataclass(frozen=True, slots=True)
class ReturnPlan:
    """When a branch that left at ``since`` is predicted back: after a
    log-normal gap of median ``median_s`` and log-space ``spread`` (0: certain)."""

    since: float
    median_s: float
    spread: float = 0.0

    @property
    def expected(self) -> float:
        """The planned return."""
        return self.since + self.median_s

    def next_use(self, now: float) -> float:
        """The predicted return given that the branch is still away at
        ``now``: ``expected`` when planned, later the longer it stays away
        (``median_given_elapsed``)."""
        return self.since + median_given_elapsed(self.median_s, self.spread, now - self.since)


def median_given_elapsed(median_s: float, spread: float, elapsed_s: float) -> float:
    """Median of a log-normal gap (``median_s``, log-space ``spread``) given
    that it has already lasted ``elapsed_s``.

    Gaps are heavy-tailed, so a branch still away past its median is not back
    any second: the longer it has been away, the longer it is likely to stay.
    (At ``elapsed_s`` = 0 this is ``median_s``; it grows without bound, and is
    infinite where the fit gives the branch no chance of still being away.)
    A ``spread`` of 0 means the return is certain at ``median_s``.
    """
    if spread <= 0 or median_s <= 0 or elapsed_s <= 0:
        return max(median_s, elapsed_s)
    # Half the chance of still being away (erfc keeps the far tail precise).
    half_survival = 0.25 * math.erfc(math.log(elapsed_s / median_s) / (spread * math.sqrt(2)))
    if half_survival <= 0.0:
        return math.inf
    return median_s * math.exp(-spread * _STANDARD.inv_cdf(half_survival))


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


class _Lru(Generic[_K, _V]):
    """At most ``capacity`` values made by ``factory``, least recently used
    dropped first."""

    def __init__(self, capacity: int, factory: Callable[[], _V]) -> None:
        self._capacity = capacity
        self._factory = factory
        self._values: OrderedDict[_K, _V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: _K) -> _V | None:
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
        return value

    def setdefault(self, key: _K) -> _V:
        value = self.get(key)
        if value is None:
            value = self._values[key] = self._factory()
            if len(self._values) > self._capacity:
                self._values.popitem(last=False)
        return value

    def pop(self, key: _K) -> None:
        self._values.pop(key, None)


class GapEstimator:
    """Learns tool-gap durations per session and per (tenant, tool).

    Gaps are heavy-tailed (median ~10 s, p75 ~30 s, max hours), so everything
    is done on log seconds and a prediction is a log-normal fit. A prediction
    pools, as weighted moment matching (a mixture of log-normals):

    - the prior: the client's ``gap`` (``hint_weight`` pseudo-observations)
      or, without it, the population prior (``prior_weight``);
    - the session's observed gaps after the same tool (None: gaps the client
      named no tool for) and the tenant's gaps after that tool (weight = their
      effective counts; an observation feeds both, which only speeds up how
      fast learning overrides the prior). A session's gaps are kept apart per
      tool because they differ by orders of magnitude: a file read returns in
      a second, a test run in minutes, the user (tool ``user``) in minutes to
      hours; pooled, the many short gaps would drown the rare long ones.

    Disagreement between sources widens the spread and hence the deadline.
    Memory is bounded: sessions and tools are kept in LRU maps.
    """

    def __init__(self, config: EstimatorConfig | None = None) -> None:
        self._config = config or EstimatorConfig()
        self._z = _STANDARD.inv_cdf(self._config.quantile)
        self._sessions: _Lru[tuple[str, str], _Lru[str | None, _LogStats]] = _Lru(
            self._config.max_sessions, lambda: _Lru(_TOOLS_PER_SESSION, _LogStats)
        )
        self._tools: _Lru[tuple[str, str], _LogStats] = _Lru(self._config.max_tools, _LogStats)

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
        self._sessions.setdefault((tenant, sid)).setdefault(tool).add(x, memory)
        if tool is not None:
            self._tools.setdefault((tenant, tool)).add(x, memory)

    def predict(
        self, tenant: str, sid: str, tool: str | None, client_gap: float | None
    ) -> Prediction:
        """Predict the next gap of ``sid``, with the client's ``gap`` as prior."""
        c = self._config
        if client_gap is None:
            sources = [(c.prior_weight, math.log(c.prior_gap_s), c.prior_sigma**2)]
        else:
            sources = [(c.hint_weight, math.log(max(client_gap, MIN_GAP_S)), c.hint_sigma**2)]
        session = self._sessions.get((tenant, sid))
        learned = [None if session is None else session.get(tool)]
        if tool is not None:
            learned.append(self._tools.get((tenant, tool)))
        sources += [(s.weight, s.mean, s.var) for s in learned if s is not None]
        total = sum(w for w, _, _ in sources)
        mu = sum(w * m for w, m, _ in sources) / total
        var = sum(w * (v + (m - mu) ** 2) for w, m, v in sources) / total
        sigma = math.sqrt(var)
        return Prediction(
            expected_s=math.exp(mu), deadline_s=math.exp(mu + self._z * sigma), spread=sigma
        )

    def forget_session(self, tenant: str, sid: str) -> None:
        """Drop an ended session's statistics (its tools' statistics stay)."""
        self._sessions.pop((tenant, sid))
