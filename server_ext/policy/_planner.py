"""When to bring an idle branch's KV back before it returns (prefetch planning)."""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from hints_spec.core import ROOT_BRANCH

from ._books import ReturnCalibration
from ._estimator import GapEstimator
from ._heap import IndexedHeap
from ._keys import BranchKey
from ._sessions import SessionIndex


@dataclass(frozen=True, slots=True)
class Plan:
    """A tracked branch's predicted return, as the driver needs it.

    Args:
        expected_return: Predicted time of its next request (median).
        deadline: Late bound of that return (the estimator's high quantile);
            a warm-up after it is likely wasted.
        warm_at: When its warm-up should start (expected return - lead time).
        fired: ``due`` has handed it out since it was last (re)planned.
    """

    expected_return: float
    deadline: float
    warm_at: float
    fired: bool


@dataclass(slots=True)
class _Branch:
    departed: float
    tool: str | None
    gap: float | None
    tokens: int
    expected_return: float
    deadline: float
    warm_at: float
    fired: bool = False

    def view(self) -> Plan:
        return Plan(self.expected_return, self.deadline, self.warm_at, self.fired)


@dataclass(frozen=True, slots=True)
class PlannerStats:
    """Calibration of the return predictions, for metrics and benchmarks.

    Args:
        tracked: Branches currently planned.
        fired: Warm-ups handed out by ``due`` since creation.
        returns: Returns of planned branches (the sample behind the errors).
        early_returns: Of those, returns before their warm-up was handed out.
        mean_abs_error_s: Mean |actual - predicted return| over ``returns``.
        mean_error_s: Mean (actual - predicted): positive = returns come late.
        seconds_per_token: Current warm-up cost estimate.
    """

    tracked: int
    fired: int
    returns: int
    early_returns: int
    mean_abs_error_s: float
    mean_error_s: float
    seconds_per_token: float

    @property
    def early_fraction(self) -> float:
        """Fraction of returns that came before their warm-up time."""
        return self.early_returns / self.returns if self.returns else 0.0


class PrefetchPlanner:
    """Plans a warm-up for each branch that left for a tool, just before it returns.

    Pure and synchronous (injected clock, no I/O): a driver reports departures,
    tool events, returns and ends, polls ``due`` and reports each warm-up's
    duration. A branch's expected return is the ``GapEstimator`` median (the
    client's ``gap`` or a tool's ``eta`` as prior, learned per session and
    tool from the returns reported here); its warm-up time is that minus the
    lead time a warm-up of its size takes (``lead_time``).

    It is built from the policy's primitives (``GapEstimator``,
    ``IndexedHeap``, ``SessionIndex``, ``ReturnCalibration``) but keeps
    instances of its own: it runs in the API server (``Prefetcher``), the
    retention policy in the engine core, and neither process can read the
    other's. So each learns the gaps it sees, one estimator per process; its
    departures also carry what only prefetch needs (the prompt's size, the
    warm-up time, whether it was handed out).

    Invariants, true after every public call:
      - At most ``max_branches`` branches are tracked (least recently
        departed or updated dropped first), with one ``_sessions`` entry each,
        and at most ``tenant_share`` of them of one tenant (its own least
        recent dropped first): one tenant cannot push another's plans out.
      - Every tracked branch not yet fired has exactly one heap entry, at
        its ``warm_at``; a fired or forgotten one has none.
      - ``due`` hands each plan out at most once; only a re-plan
        (``depart``, ``tool_start``) arms it again.

    Args:
        estimator: Gap estimator (default: a new one).
        clock: Monotonic seconds; methods also take an explicit ``now``.
        max_branches: Cap on tracked branches.
        tenant_share: Share of ``max_branches`` one tenant may take.
        margin_s: Added to every lead time (scheduling and HTTP overhead).
        seconds_per_token: Initial warm-up cost, seconds per prompt token.
        smoothing: EWMA weight of each measured warm-up.
    """

    def __init__(
        self,
        estimator: GapEstimator | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_branches: int = 4096,
        tenant_share: float = 0.25,
        margin_s: float = 0.25,
        seconds_per_token: float = 1e-4,
        smoothing: float = 0.3,
    ) -> None:
        if max_branches < 1 or margin_s < 0 or seconds_per_token < 0:
            raise ValueError("max_branches must be >= 1, margin and cost >= 0")
        if not 0 < tenant_share <= 1:
            raise ValueError("tenant_share must be in (0, 1]")
        if not 0 < smoothing <= 1:
            raise ValueError("smoothing must be in (0, 1]")
        self.estimator = estimator or GapEstimator()
        self._clock = clock
        self._max = max_branches
        self._tenant_max = max(int(max_branches * tenant_share), 1)
        # Each tenant's tracked branches, least recently departed or updated first.
        self._by_tenant: dict[str, OrderedDict[BranchKey, None]] = {}
        self._margin = margin_s
        self._spt = seconds_per_token
        self._smoothing = smoothing
        self._branches: OrderedDict[BranchKey, _Branch] = OrderedDict()
        self._sessions = SessionIndex()
        # Unfired branches by warm-up time (ties: the earlier planned first).
        self._heap: IndexedHeap[BranchKey] = IndexedHeap()
        self._order = itertools.count()
        self._fired = 0
        self._early = 0
        # Predicted vs actual returns, scored as retention's are.
        self._calibration = ReturnCalibration()

    # Introspection.

    def plan(self, key: BranchKey) -> Plan | None:
        """The current plan of ``key``; None once it returned or ended."""
        b = self._branches.get(key)
        return None if b is None else b.view()

    def lead_time(self, tokens: int) -> float:
        """Seconds to start a warm-up of a ``tokens``-token prompt before its return."""
        return self._spt * max(tokens, 0) + self._margin

    @property
    def stats(self) -> PlannerStats:
        calibration = self._calibration
        return PlannerStats(
            tracked=len(self._branches),
            fired=self._fired,
            returns=calibration.returns,
            early_returns=self._early,
            mean_abs_error_s=calibration.mean_abs_error_s,
            mean_error_s=calibration.mean_error_s,
            seconds_per_token=self._spt,
        )

    # Events.

    def depart(
        self,
        key: BranchKey,
        now: float | None = None,
        gap_hint: float | None = None,
        tool: str | None = None,
        tokens: int = 0,
    ) -> Plan:
        """A response of ``key`` (a ``tokens``-token prompt) completed at ``now``."""
        now = self._now(now)
        b = self._branches.pop(key, None)
        if b is None:
            self._sessions.add(key)
        b = _Branch(now, tool, gap_hint, tokens, now, now, now)
        self._branches[key] = b
        mine = self._by_tenant.setdefault(key.tenant, OrderedDict())
        mine[key] = None
        mine.move_to_end(key)
        if len(mine) > self._tenant_max:
            self._forget(next(iter(mine)))
        if len(self._branches) > self._max:
            self._forget(next(iter(self._branches)))
        self._replan(key, b, now)
        return b.view()

    def tool_start(
        self,
        key: BranchKey,
        eta: float | None = None,
        tool: str | None = None,
        now: float | None = None,
        warm: bool = True,
    ) -> None:
        """``key`` started a tool: re-plan from now with ``eta`` as the prior.

        This arms the branch again even if its warm-up was handed out: a later
        return means its KV may be gone again by then. With ``warm=False`` the
        branch is still planned (its return is learned and scored) but never
        handed out for a warm-up.
        """
        b = self._branches.get(key)
        if b is None:
            return
        self._branches.move_to_end(key)
        self._by_tenant[key.tenant].move_to_end(key)
        b.tool = tool if tool is not None else b.tool
        b.gap = eta if eta is not None else b.gap
        self._replan(key, b, self._now(now))
        if not warm:
            b.fired = True
            self._heap.remove(key)

    def tool_end(self, key: BranchKey, now: float | None = None) -> None:
        """``key``'s tool finished: it returns now, warm it at once if not yet."""
        b = self._branches.get(key)
        if b is None:
            return
        now = self._now(now)
        b.expected_return = b.warm_at = now
        b.deadline = max(b.deadline, now)
        if not b.fired:
            self._schedule(key, b)

    def returned(self, key: BranchKey, now: float | None = None) -> None:
        """``key``'s real next request arrived: stop planning it, learn the gap."""
        b = self._branches.get(key)
        if b is None:
            return
        now = self._now(now)
        self._forget(key)
        self.estimator.observe(key.tenant, key.sid, b.tool, now - b.departed)
        self._calibration.add(b.expected_return - b.departed, now - b.departed)
        self._early += not b.fired

    def ended(self, key: BranchKey) -> None:
        """``key`` ended (its whole session on the root branch): stop planning."""
        if key.br != ROOT_BRANCH:
            self._forget(key)
            return
        for br in self._sessions.branches(key.tenant, key.sid):
            self._forget(key.sibling(br))
        self.estimator.forget_session(key.tenant, key.sid)

    def due(self, now: float | None = None) -> list[BranchKey]:
        """Branches whose warm-up time has come, each once, earliest return first."""
        now = self._now(now)
        fired: list[tuple[float, BranchKey]] = []
        heap = self._heap
        while (top := heap.peek()) is not None and top[0][0] <= now:
            _, key = heap.pop()
            b = self._branches[key]
            b.fired = True
            fired.append((b.expected_return, key))
        self._fired += len(fired)
        return [key for _, key in sorted(fired, key=lambda f: f[0])]

    def observe_warmup(self, seconds: float, tokens: int) -> None:
        """A warm-up of a ``tokens``-token prompt took ``seconds``: learn the cost.

        New plans use the new lead time; existing ones keep theirs.
        """
        if tokens > 0 and seconds >= 0:
            a = self._smoothing
            self._spt = (1 - a) * self._spt + a * seconds / tokens

    # Internals.

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now

    def _replan(self, key: BranchKey, b: _Branch, now: float) -> None:
        pred = self.estimator.predict(key.tenant, key.sid, b.tool, b.gap)
        b.expected_return = now + pred.expected_s
        b.deadline = now + pred.deadline_s
        b.warm_at = b.expected_return - self.lead_time(b.tokens)
        self._schedule(key, b)

    def _schedule(self, key: BranchKey, b: _Branch) -> None:
        """(Re)place ``b`` in the heap at its warm-up time, armed."""
        b.fired = False
        self._heap.set(key, (b.warm_at, next(self._order)))

    def _forget(self, key: BranchKey) -> None:
        if self._branches.pop(key, None) is None:
            return
        mine = self._by_tenant[key.tenant]
        del mine[key]
        if not mine:
            del self._by_tenant[key.tenant]
        self._sessions.discard(key)
        self._heap.remove(key)
