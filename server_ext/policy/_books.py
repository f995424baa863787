"""The policy's two scorecards: how well it predicts returns, and how often
prefetch warm-ups pay.

Both are pure counters fed by ``RetentionPolicy`` (through ``ReturnForecast``
and ``RetentionTable``) and read back as ``PolicyStats`` and metrics; the
warm-up score also gates whether a warm-up may evict (``warmups_take_room``).
The prefetch planner scores its return predictions with the same
``ReturnCalibration``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ._estimator import MIN_GAP_S

__all__ = ["PrefetchAccuracy", "ReturnCalibration"]

_MAX_UNTAKEN = 4096
"""Calibration errors kept for the metrics between two reports (one per step)."""

_ACCURACY_MEMORY = 32.0
"""Warm-up outcomes ``PrefetchAccuracy`` effectively remembers."""

_ACCURACY_PRIOR = 4.0
"""Pseudo-outcomes, all returned, that a new ``PrefetchAccuracy`` starts with."""


@dataclass(slots=True)
class ReturnCalibration:
    """Predicted vs actual gaps of returning branches: on a log2 scale (an
    error of 1 is a factor of 2), for the calibration metrics, and in
    seconds (actual - predicted: positive when returns come late)."""

    returns: int = 0
    log2_error_sum: float = 0.0
    within_2x: int = 0
    error_s_sum: float = 0.0
    abs_error_s_sum: float = 0.0
    errors: list[float] = field(default_factory=list)
    """Log2 errors not yet taken (``take_errors``), at most ``_MAX_UNTAKEN``."""

    def add(self, predicted_s: float, actual_s: float) -> None:
        error = abs(math.log2(max(actual_s, MIN_GAP_S) / max(predicted_s, MIN_GAP_S)))
        self.returns += 1
        self.log2_error_sum += error
        self.within_2x += error <= 1.0
        self.error_s_sum += actual_s - predicted_s
        self.abs_error_s_sum += abs(actual_s - predicted_s)
        if len(self.errors) < _MAX_UNTAKEN:
            self.errors.append(error)

    @property
    def mean_error_s(self) -> float:
        return self.error_s_sum / self.returns if self.returns else 0.0

    @property
    def mean_abs_error_s(self) -> float:
        return self.abs_error_s_sum / self.returns if self.returns else 0.0

    def take_errors(self) -> list[float]:
        """The errors since the last call (for a histogram of them)."""
        taken, self.errors = self.errors, []
        return taken


@dataclass(slots=True)
class PrefetchAccuracy:
    """Outcomes of warmed retentions: ``returned`` (the branch came back
    while they were held) or ``wasted`` (released first: under pressure, at
    their deadline, or by the session's end). A replaced or reset one is not
    scored (a warm-up that replaces it carries its mark on).

    ``rate`` is the returned share of the outcomes, as counts that decay by
    ``1 / _ACCURACY_MEMORY`` per outcome, over an optimistic prior
    (``_ACCURACY_PRIOR`` returned): prefetch starts trusted and loses its
    right to evict on evidence. Invariant: ``0 < rate <= 1``.
    """

    returned: int = 0
    wasted: int = 0
    _hits: float = _ACCURACY_PRIOR
    _total: float = _ACCURACY_PRIOR

    @property
    def rate(self) -> float:
        return self._hits / self._total

    def add(self, returned: bool) -> None:
        keep = 1.0 - 1.0 / _ACCURACY_MEMORY
        self._hits = self._hits * keep + returned
        self._total = self._total * keep + 1.0
        if returned:
            self.returned += 1
        else:
            self.wasted += 1
