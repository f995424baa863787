"""Online per-tool latency estimates: the source of the ``gap`` hint and tool ETAs.

Tool waits are heavy-tailed and drift (a test suite grows, a network slows), so each tool
keeps a decayed histogram over log-spaced bins rather than a mean: any quantile can be
read from it, it merges by addition, and it serialises to a few numbers per tool for the
session store.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, Field

from hints_spec import MAX_SECONDS, USER_TOOL, ToolStart

from ._errors import UserError

__all__ = ["LatencyEstimator", "LatencyStats", "user_wait"]

_MIN_SECONDS = 1e-3
_MAX_SECONDS = float(MAX_SECONDS)  # the protocol's bound on gap and eta
_BINS_PER_DECADE = 10  # a bin spans ~26%: finer than the noise of real tool timings
_NUM_BINS = math.ceil(math.log10(_MAX_SECONDS / _MIN_SECONDS) * _BINS_PER_DECADE) + 1
_FORGOTTEN = 1e-3  # weights that decayed below this are dropped to keep stats small


def _bin(seconds: float) -> int:
    clamped = min(max(seconds, _MIN_SECONDS), _MAX_SECONDS)
    index = math.floor(math.log10(clamped / _MIN_SECONDS) * _BINS_PER_DECADE)
    return min(index, _NUM_BINS - 1)


def _center(index: int) -> float:
    """Geometric centre of a bin, so the round-trip error is symmetric in log space."""
    return min(_MIN_SECONDS * 10 ** ((index + 0.5) / _BINS_PER_DECADE), _MAX_SECONDS)


class LatencyStats(BaseModel):
    """Persisted state: per tool name, histogram bin -> decayed count of the tool's own
    durations; ``around``, the same of the loop's own time around a batch of calls."""

    tools: dict[str, dict[int, float]] = Field(default_factory=dict)
    around: dict[int, float] = Field(default_factory=dict)


class LatencyEstimator:
    """Quantiles of past tool durations, with a prior for tools never seen, plus the
    loop's own time around them: the wait the server sees.

    A tool's duration is the tool's (a test suite takes as long on any agent
    host), the time around it is the host's (hooks, the session store, a busy
    event loop): kept apart, durations learned elsewhere (``shared``, a stored
    session) stay true here, and the host's overhead, common to every tool, is
    learned from every wait instead of each tool's few.

    The prior (a tool's ``expected_seconds``, else ``prior_seconds``) counts as one
    observation at its exact value, so it decides alone at first (an unseen tool's
    estimate is its prior) and fades as real durations arrive.
    ``decay`` multiplies a tool's older counts at each new observation: recent behaviour
    weighs more, and the effective sample size stays near ``1 / (1 - decay)``.

    ``shared`` is what earlier sessions of the same agent learned: a session knows
    few calls of each tool, while its tools behave much as they did in the agent's
    other sessions (on 176 real Claude Code sessions, a per-session median lands
    within 2x of the next wait for 55% of waits, one that also pools the agent's
    earlier sessions for 74%). Each observation goes into both, so a session's own
    calls weigh twice.
    """

    def __init__(
        self,
        stats: LatencyStats | None = None,
        *,
        shared: LatencyStats | None = None,
        prior_seconds: float = 1.0,
        quantile: float = 0.5,
        decay: float = 0.95,
    ) -> None:
        numbers = all(
            isinstance(v, int | float) and not isinstance(v, bool)
            for v in (prior_seconds, quantile, decay)
        )
        if not (numbers and prior_seconds > 0 and 0 < quantile < 1 and 0 < decay <= 1):
            raise UserError(
                f"LatencyEstimator(prior_seconds={prior_seconds!r}, quantile={quantile!r},"
                f" decay={decay!r}): need prior_seconds > 0, 0 < quantile < 1, 0 < decay <= 1"
            )
        for name, value in (("stats", stats), ("shared", shared)):
            if value is not None and not isinstance(value, LatencyStats):
                raise UserError(f"LatencyEstimator: {name} must be LatencyStats, got {value!r:.60}")
        self.stats = stats if stats is not None else LatencyStats()
        self.shared = shared
        self.prior_seconds = prior_seconds
        self.quantile = quantile
        self.decay = decay

    def observe(self, tool: str, seconds: float) -> None:
        """Record one finished call of ``tool`` that took ``seconds`` itself."""
        for stats in self._sources():
            self._add(stats.tools.setdefault(tool, {}), seconds)

    def observe_around(self, seconds: float) -> None:
        """Record the loop's own time around one batch of calls: from the response
        to the next request, less the batch's longest call."""
        for stats in self._sources():
            self._add(stats.around, seconds)

    def estimate(self, tools: Mapping[str, float | None]) -> float | None:
        """The wait after a response that calls ``tools`` (name -> prior or None):
        the quantile of their pooled durations plus that of the loop's time around.

        Pooling weights each tool by how often it ran recently, which is the best guess
        of the wait after a response whose tool calls are not known yet. None when there
        are no tools: then no wait follows a response.
        """
        if not tools:
            return None
        points: list[tuple[float, float]] = []  # (seconds, weight)
        for name, prior in tools.items():
            seconds = prior if prior is not None else self.prior_seconds
            points.append((min(max(seconds, _MIN_SECONDS), _MAX_SECONDS), 1.0))
            for stats in self._sources():
                points.extend((_center(i), w) for i, w in stats.tools.get(name, {}).items())
        around = [(_center(i), w) for stats in self._sources() for i, w in stats.around.items()]
        overhead = self._quantile(around) if around else 0.0
        return min(self._quantile(points) + overhead, _MAX_SECONDS)

    def _quantile(self, points: list[tuple[float, float]]) -> float:
        """The estimator's quantile of weighted (seconds, weight) points."""
        points.sort()
        target = self.quantile * sum(weight for _, weight in points)
        cumulative = 0.0
        for seconds, weight in points:
            cumulative += weight
            if cumulative >= target:
                return seconds
        return points[-1][0]  # float rounding left the target just out of reach

    def _add(self, weights: dict[int, float], seconds: float) -> None:
        """Decay a histogram's older counts and count ``seconds`` in it."""
        for i in list(weights):
            weights[i] *= self.decay
            if weights[i] < _FORGOTTEN:
                del weights[i]
        index = _bin(seconds)
        weights[index] = weights.get(index, 0.0) + 1.0

    def _sources(self) -> tuple[LatencyStats, ...]:
        return (self.stats,) if self.shared is None else (self.stats, self.shared)


def user_wait(estimator: LatencyEstimator, prior_seconds: float) -> ToolStart:
    """The root branch now waits on its user (SPEC §6.3's ``user`` tool), for about the
    session's usual reply time (``prior_seconds`` before any reply was timed)."""
    estimate = estimator.estimate({USER_TOOL: prior_seconds})
    assert estimate is not None  # one tool given
    return ToolStart(tool=USER_TOOL, eta=round(estimate, 3))
