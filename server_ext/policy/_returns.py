"""When each departed branch is expected back, and what its return teaches."""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from ._books import ReturnCalibration
from ._config import PolicyConfig
from ._estimator import GapEstimator, ReturnPlan
from ._keys import BranchKey

__all__ = ["Departure", "ReturnForecast", "Window"]


class Window(NamedTuple):
    """A retention's predicted return and deadline."""

    plan: ReturnPlan
    deadline: float


class Departure(NamedTuple):
    """A branch expected back: when it left, after which tool, its return plan."""

    at: float
    tool: str | None
    plan: ReturnPlan


class ReturnForecast:
    """The departures of branches expected back, the windows predicted from
    them, and the gaps and calibration learned when they return.

    It exists apart from the retentions because a departure outlives its
    retention: a branch evicted while away still comes back, its gap still
    teaches the estimator, and warm-ups still plan by its return. The record
    is bounded by ``config.max_pending_returns`` (the oldest departure is
    forgotten first) and keyed by ``BranchKey``, so it never outgrows what
    tenants are allowed to create.

    Args:
        config: Time bounds (``min_retain_s``, ``gap_slack``, ``default_ttl_s``).
        estimator: The gap estimator that predicts and learns the gaps.
    """

    def __init__(self, config: PolicyConfig, estimator: GapEstimator) -> None:
        self.config = config
        self.estimator = estimator
        self.calibration = ReturnCalibration()
        self._pending: OrderedDict[BranchKey, Departure] = OrderedDict()

    def departure(self, key: BranchKey) -> Departure | None:
        """The departure on record of ``key``, if it is expected back."""
        return self._pending.get(key)

    def depart(self, key: BranchKey, now: float, tool: str | None, gap: float | None) -> None:
        """``key`` left at ``now`` (after ``tool``, for ``gap`` seconds if the
        client said): plan its return, forgetting the oldest departure past
        the bound."""
        plan = self.estimator.predict(key.tenant, key.sid, tool, gap).plan(now)
        self._pending[key] = Departure(now, tool, plan)
        self._pending.move_to_end(key)
        if len(self._pending) > self.config.max_pending_returns:
            self._pending.popitem(last=False)

    def learn_return(self, key: BranchKey, now: float) -> None:
        """``key`` is back at ``now``: teach the estimator its gap and score
        the prediction; its departure is then off the record."""
        departed = self._pending.pop(key, None)
        if departed is not None:
            self.estimator.observe(key.tenant, key.sid, departed.tool, now - departed.at)
            self.calibration.add(departed.plan.expected - departed.at, now - departed.at)

    def waits_on(
        self,
        key: BranchKey,
        tool: str,
        now: float,
        eta: float | None = None,
        plan: ReturnPlan | None = None,
    ) -> None:
        """Departed ``key`` waits on ``tool``: it takes the tool and ``plan``
        (by default one predicted from ``eta`` at ``now``). Nothing if ``key``
        is not expected back."""
        departed = self._pending.get(key)
        if departed is not None:
            if plan is None:
                plan = self.estimator.predict(key.tenant, key.sid, tool, eta).plan(now)
            self._pending[key] = departed._replace(tool=tool, plan=plan)

    def tool_ended(self, key: BranchKey, now: float) -> ReturnPlan:
        """``key``'s tool ended at ``now``: it is planned back now."""
        plan = ReturnPlan(now, 0.0)
        departed = self._pending.get(key)
        if departed is not None:
            self._pending[key] = departed._replace(plan=plan)
        return plan

    def window(
        self,
        key: BranchKey,
        now: float,
        horizon: float,
        gap: float | None,
        ttl: int | None,
        tool: str | None,
        since: Departure | None = None,
    ) -> Window:
        """The predicted return of a branch leaving for a tool at ``now``, or
        of one that left as ``since`` says (kept: its plan and its tool)."""
        c = self.config
        pred = self.estimator.predict(
            key.tenant, key.sid, tool if since is None else since.tool, gap
        )
        hold = max(pred.deadline_s * c.gap_slack, c.min_retain_s)
        if gap is None and ttl is None:
            hold = min(hold, c.default_ttl_s)
        if since is None:
            return Window(pred.plan(now), min(now + hold, horizon))
        return Window(since.plan, min(max(since.at + hold, now), horizon))

    def next_return(self, key: BranchKey, now: float) -> float | None:
        """When departed branch ``key`` is predicted back, given that it is
        still away at ``now``; None if it is not expected."""
        departed = self._pending.get(key)
        return None if departed is None else departed.plan.next_use(now)

    def forget(self, *keys: BranchKey) -> None:
        """``keys`` are no longer expected back (they ended)."""
        for key in keys:
            self._pending.pop(key, None)

    def clear(self) -> None:
        self._pending.clear()
