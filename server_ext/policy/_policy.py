"""The retention policy: which branches' KV blocks to hold, and until when.

``RetentionPolicy`` is the front: it turns request and control events into
decisions and delegates the rest to collaborators it owns, one concern each:
``RetentionTable`` (the live retentions and every index kept in step with
them, forks, ends and deadlines), ``Evictor`` (which retentions give way, and
the fair-share rules), ``ReturnForecast`` (departures, predicted windows and
what returns teach) and the scorecards of ``_books``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from hints_spec.core import ROOT_BRANCH, EndEvent, Event, ForkEvent, Outcome, ToolEndEvent

from ._actions import Action, Decision, Hold, Reason, ReleaseReason
from ._config import PolicyConfig
from ._estimator import GapEstimator, ReturnPlan
from ._evict import Evictor
from ._keys import BranchHints, BranchKey
from ._retention import Retention
from ._returns import ReturnForecast
from ._table import RetentionTable


@dataclass(frozen=True, slots=True)
class PolicyStats:
    """Gauges and counters (since creation) for metrics."""

    held_blocks: int
    retained_branches: int
    holds: int
    clipped: int
    rejected: int
    ends: int
    expiries: int
    pressure_releases: int
    budget_releases: int
    replacements: int
    returns: int
    resets: int
    predicted_returns: int
    return_log2_error_sum: float
    returns_within_2x: int
    warmups_returned: int
    warmups_wasted: int


class RetentionPolicy:
    """Holds the KV blocks of branches waiting on a tool, soft and budgeted.

    Pure and synchronous: it is driven by events (request started/finished,
    control events, engine steps, allocation pressure) and an injected clock,
    and answers with ``Hold``/``Release`` actions that an adapter applies to
    the block pool. It never touches vLLM, so the same code runs in the engine
    core, in unit tests with a fake clock and in simulators.

    A branch whose request ends in tool calls (or carries a ``gap``) is
    retained until ``now + clip(p90 gap * gap_slack, min_retain_s, limit)``;
    its next request teaches the estimator the observed gap when it arrives
    and releases it (``returned``) when it is scheduled. Under allocation
    pressure (``make_room``) retentions go expired first, then furthest
    expected return first (Belady with predicted next use), higher ``prio``
    number breaking ties, branches whose request is queued last. A full budget
    evicts only retentions due back later than the newcomer (or expired);
    otherwise the newcomer is clipped to the prefix that fits.

    Invariants, true after every public call:
      - Each live retention's blocks were announced by exactly one ``Hold``,
        and the ``Release`` actions of its key give each of them back exactly
        once: a trimmed retention's tail first, the rest when it ends.
      - ``held_blocks`` (distinct block ids over live retentions, see
        ``BlockLedger``) is at most ``held_cap`` and each tenant's at most
        ``tenant_cap``.
      - Every live retention is in the table's deadline heap at its
        ``effective_deadline`` and in its ``Ranking`` (victim orders, due
        index, re-rank heap): each an addressable heap or sorted list,
        O(log n) per change, nothing stale. So ``expire`` is O(1) when nothing
        is due, and no operation sorts or scans all retentions.
      - A tenant has at most ``config.max_tenant_retentions`` live retentions.
      - All state is keyed by ``BranchKey`` (tenant first): one tenant's events
        can neither see nor touch another tenant's sessions; and a tenant
        holding no more than its fair share of the budget (the cap over the
        tenants holding blocks) loses none of it to another tenant's
        newcomers, nor is warm-first admission held back by another tenant's
        branches.

    Args:
        config: Budgets and time bounds.
        clock: Monotonic seconds; methods also take an explicit ``now``.
        estimator: Gap estimator, shared or pre-trained (default: a new one).
    """

    def __init__(
        self,
        config: PolicyConfig,
        clock: Callable[[], float] = time.monotonic,
        estimator: GapEstimator | None = None,
    ) -> None:
        self.config = config
        self.estimator = estimator or GapEstimator(config.estimator)
        self._clock = clock
        self._table = RetentionTable()
        self._evictor = Evictor(self._table, config)
        self._returns = ReturnForecast(config, self.estimator)
        self._outcomes: Counter[Outcome] = Counter()

    # Introspection.

    @property
    def held_cap(self) -> int:
        """Most distinct blocks all retentions may hold."""
        return self.config.held_cap

    @property
    def tenant_cap(self) -> int:
        """Most distinct blocks one tenant's retentions may hold."""
        return self.config.tenant_cap

    @property
    def held_blocks(self) -> int:
        """Distinct block ids held by all retentions."""
        return self._table.ledger.held

    @property
    def retained_branches(self) -> int:
        return len(self._table.retentions)

    def tenant_held_blocks(self, tenant: str) -> int:
        return self._table.ledger.tenant_held(tenant)

    def retention(self, key: BranchKey) -> Retention | None:
        """The live retention of ``key`` (read-only view)."""
        return self._table.retentions.get(key)

    def retentions(self) -> Iterator[Retention]:
        """All live retentions (read-only views)."""
        return iter(self._table.retentions.values())

    @property
    def prefetch_accuracy(self) -> float:
        """Share of recent warmed retentions that lasted until their branch
        came back (decaying, optimistic prior; see ``PrefetchAccuracy``)."""
        return self._table.prefetch.rate

    @property
    def warmups_take_room(self) -> bool:
        """May a prefetch warm-up release retentions (of branches due back
        after its own)? Not while recent warm-ups were mostly wasted: each
        such eviction then costs a branch its prefix for a warm-up that
        likely does not pay."""
        return self._table.prefetch.rate >= self.config.prefetch_min_accuracy

    @property
    def stats(self) -> PolicyStats:
        r = self._table.released
        return PolicyStats(
            held_blocks=self.held_blocks,
            retained_branches=self.retained_branches,
            holds=self._table.holds,
            clipped=self._outcomes[Outcome.CLIPPED],
            rejected=self._outcomes[Outcome.REJECTED],
            ends=r[ReleaseReason.END],
            expiries=r[ReleaseReason.EXPIRED],
            pressure_releases=r[ReleaseReason.PRESSURE],
            budget_releases=r[ReleaseReason.BUDGET],
            replacements=r[ReleaseReason.REPLACED],
            returns=r[ReleaseReason.RETURNED],
            resets=r[ReleaseReason.RESET],
            predicted_returns=self._returns.calibration.returns,
            return_log2_error_sum=self._returns.calibration.log2_error_sum,
            returns_within_2x=self._returns.calibration.within_2x,
            warmups_returned=self._table.prefetch.returned,
            warmups_wasted=self._table.prefetch.wasted,
        )

    def take_return_errors(self) -> list[float]:
        """|log2(actual gap / predicted gap)| of each branch return since the
        last call: the calibration histogram's observations."""
        return self._returns.calibration.take_errors()

    # Request events.

    def on_request_arrived(self, key: BranchKey, now: float | None = None) -> None:
        """The branch's next request reached the engine and may queue: learn
        the gap, and keep the retention until the request is scheduled, as the
        last victim (it is the surest next use of all)."""
        now = self._now(now)
        self._returns.learn_return(key, now)
        r = self._table.retentions.get(key)
        if r is not None and r.arrived_at is None:
            r.arrived_at = now
            r.plan = ReturnPlan(now, 0.0)
            self._table.replan(r, now)

    def on_request_started(self, key: BranchKey, now: float | None = None) -> list[Action]:
        """The branch's next request was scheduled: release the retention (the
        running request now holds its own references). Learns the gap if
        ``on_request_arrived`` did not."""
        self._returns.learn_return(key, self._now(now))
        r = self._table.retentions.get(key)
        return [] if r is None else [self._table.drop(r, ReleaseReason.RETURNED)[0]]

    def on_request_finished(
        self,
        key: BranchKey,
        block_ids: Sequence[int],
        hints: BranchHints,
        tool_calls: bool,
        now: float | None = None,
        departs: bool = True,
    ) -> Decision:
        """A request of ``key`` finished holding ``block_ids`` (prefix first).

        ``end`` releases the branch (the session on the root branch). A
        response with tool calls or a ``gap`` hint is retained, replacing an
        older retention of the branch; budgets may evict others or clip it.
        A request that computed nothing (aborted in the queue) leaves the
        branch what it held.

        ``departs=False`` (a prefetch warm-up) retains without restarting the
        branch's gap: it left when its last real request finished. A warm-up
        adds to what the branch still holds (its last response's blocks, which
        the replayed prompt lacks) and keeps a queued request's place as the
        last victim.
        """
        now = self._now(now)
        if hints.end:
            return self._decide(self._end(key, key.br == ROOT_BRANCH, now))
        old = self._table.retentions.get(key)
        if old is not None and not block_ids and not departs:
            return self._decide([])
        actions: list[Action] = []
        if old is not None:
            actions.append(self._table.drop(old, ReleaseReason.REPLACED)[0])
        if not (tool_calls or hints.gap is not None):
            return self._decide(actions)
        if departs:
            self._returns.depart(key, now, hints.tool, hints.gap)
        horizon = now + self._hold_limit(hints.ttl)
        kept_blocks = old.block_ids if old is not None and not (departs and block_ids) else ()
        blocks = tuple(dict.fromkeys((*kept_blocks, *block_ids)))
        # A warm-up that only re-touched held blocks recomputed nothing.
        warmed = not departs and (
            (old is not None and old.warmed) or len(blocks) > len(kept_blocks)
        )
        if horizon <= now or not blocks:  # ttl 0 asks for no retention
            return self._decide(actions)
        # A warm-up re-creates the retention its branch had when it left.
        since = None if departs else self._returns.departure(key)
        window = self._returns.window(key, now, horizon, hints.gap, hints.ttl, hints.tool, since)
        if (
            old is None
            and self._table.tenant_retentions[key.tenant] >= self.config.max_tenant_retentions
        ):
            actions += self._evictor.evict_own(key.tenant, now)
        kept = self._evictor.admit(key.tenant, blocks, now, window.plan.expected, actions)
        if kept == 0:
            return self._decide(actions, Outcome.REJECTED, Reason.OVER_BUDGET)
        r = Retention(
            key=key,
            block_ids=blocks[:kept],
            retained_at=now,
            plan=window.plan,
            deadline=window.deadline,
            horizon=horizon,
            prio=hints.prio,
            gap=hints.gap,
            ttl=hints.ttl,
            parent=hints.pbr,
            children=old.children if old is not None else set(),
            warmed=warmed,
        )
        if not departs and old is not None and old.arrived_at is not None:
            r.arrived_at, r.plan = old.arrived_at, old.plan
        self._table.insert(r, now)
        actions.insert(0, Hold(key, r.block_ids))
        if hints.pbr is not None and hints.pbr != key.br:
            parent = self._table.retentions.get(key.sibling(hints.pbr))
            if parent is not None:
                self._table.add_children(parent, (key.br,))
        if kept < len(blocks):
            return self._decide(actions, Outcome.CLIPPED, Reason.BUDGET_CLIPPED)
        if (hints.ttl is not None and hints.ttl > self.config.ttl_cap_s) or _beyond(
            now, horizon, hints.gap
        ):
            return self._decide(actions, Outcome.CLIPPED, Reason.TTL_CAPPED)
        return self._decide(actions)

    # Control events.

    def on_control(self, tenant: str, sid: str, event: Event, now: float | None = None) -> Decision:
        """Apply one control event of ``tenant``'s session ``sid``."""
        now = self._now(now)
        if isinstance(event, EndEvent):
            key = BranchKey(tenant, sid, event.br or ROOT_BRANCH)
            return self._decide(self._end(key, key.br == ROOT_BRANCH, now))
        if isinstance(event, ForkEvent):
            r = self._table.retentions.get(BranchKey(tenant, sid, event.parent or ROOT_BRANCH))
            if r is None:
                return self._decide([], Outcome.REJECTED, Reason.UNKNOWN_BRANCH)
            if not self._table.add_children(r, event.children):
                return self._decide([], Outcome.CLIPPED, Reason.TOO_MANY_CHILDREN)
            return self._decide([])
        key = BranchKey(tenant, sid, event.br or ROOT_BRANCH)
        if isinstance(event, ToolEndEvent):
            plan = self._returns.tool_ended(key, now)
            r = self._table.retentions.get(key)
            if r is None:
                return self._decide([], Outcome.REJECTED, Reason.UNKNOWN_BRANCH)
            # Coming back now: keep it at least min_retain_s for the request.
            r.plan = plan
            r.deadline = max(r.deadline, min(now + self.config.min_retain_s, r.horizon))
            self._table.replan(r, now)
            return self._decide([])
        return self._announce(key, event.tool, event.eta, now)

    def on_response_tool(self, key: BranchKey, tool: str, now: float | None = None) -> Decision:
        """The server's own response to ``key`` called ``tool`` (the API server
        parsed it): the branch waits on it, as on a ``tool_start`` without an
        ETA, unless its client named the tool it waits on (a client's
        ``tool_start`` comes before or after this one, and wins either way)."""
        departed = self._returns.departure(key)
        if departed is None or departed.tool is not None:
            return self._decide([])
        return self._announce(key, tool, None, self._now(now))

    def _announce(self, key: BranchKey, tool: str, eta: float | None, now: float) -> Decision:
        """The branch ``key`` waits on ``tool`` (for ``eta`` seconds, if given):
        its return is predicted again, and the gap learned under the tool. A
        branch evicted while away still has its departure on record: it takes
        the tool and the return time (warm-ups plan by it) even when there is
        no retention to update."""
        r = self._table.retentions.get(key)
        if r is None:
            self._returns.waits_on(key, tool, now, eta=eta)
            return self._decide([], Outcome.REJECTED, Reason.UNKNOWN_BRANCH)
        if eta is not None:
            r.gap = eta
        r.plan, r.deadline = self._returns.window(key, now, r.horizon, r.gap, r.ttl, tool)
        self._returns.waits_on(key, tool, now, plan=r.plan)
        self._table.replan(r, now)
        if _beyond(now, r.horizon, eta):
            return self._decide([], Outcome.CLIPPED, Reason.TTL_CAPPED)
        return self._decide([])

    # Engine-driven events.

    def expire(self, now: float | None = None) -> list[Action]:
        """Release retentions past their deadline; O(1) when none is due."""
        return self._table.expire(self._now(now))[0]

    def make_room(
        self,
        blocks_needed: int,
        now: float | None = None,
        spare: BranchKey | None = None,
        sooner_than: float | None = None,
    ) -> list[Action]:
        """Release retentions until they free ``blocks_needed`` distinct blocks
        or none is left, sparing ``spare`` (the branch whose request needs the
        room: its retention is its own prefix): expired ones first, then in
        victim order, those of tenants over their fair share before the
        others. With ``sooner_than`` (a prefetch for a branch due back then),
        only retentions due back later, or expired, give way. Freed blocks
        may still be used by running requests, so the adapter calls again if
        the pool is still short.
        """
        return self._evictor.make_room(blocks_needed, self._now(now), spare, sooner_than)

    def return_due(self, now: float, within_s: float, other_than: BranchKey) -> bool:
        """Is a retained branch of ``other_than``'s tenant (not ``other_than``
        itself, not yet arrived) expected back within ``within_s`` of ``now``,
        before or after? Another tenant's branches never count: its hints must
        not hold this tenant's requests back."""
        return self._table.ranking.return_due(now - within_s, now + within_s, other_than)

    def releasable_for(
        self, expected_return: float, now: float, spare: BranchKey, enough: int
    ) -> int:
        """Held blocks that ``make_room(spare=spare, sooner_than=expected_return)``
        may release (those of other branches due back later, or expired), up
        to ``enough`` or a little more. Blocks shared by several retentions
        count once per retention."""
        return self._evictor.releasable_for(expected_return, now, spare, enough)

    def next_return(self, key: BranchKey, now: float) -> float | None:
        """When departed branch ``key`` is predicted back, given that it is
        still away at ``now``; None if it is not expected (never left, or
        ended)."""
        return self._returns.next_return(key, now)

    def release_all(self, reason: ReleaseReason = ReleaseReason.RESET) -> list[Action]:
        """Release every retention (e.g. on reset_prefix_cache)."""
        return self._table.release_all(reason)

    def forget_all(self) -> None:
        """Drop every retention without a ``Release``: after a fault, when this
        state may be half-updated, the adapter gives the blocks back from its
        own count of references. Learned gaps, scores and counters stay."""
        self._table.forget_all()
        self._returns.clear()

    # Internals.

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now

    def _decide(
        self,
        actions: list[Action],
        outcome: Outcome = Outcome.ACCEPTED,
        reason: Reason | None = None,
    ) -> Decision:
        self._outcomes[outcome] += 1
        return Decision(actions, outcome, reason)

    def _hold_limit(self, ttl: int | None) -> float:
        cap = self.config.ttl_cap_s
        return cap if ttl is None else min(float(ttl), cap)

    def _end(self, key: BranchKey, session: bool, now: float) -> list[Action]:
        """Release branch ``key`` (or its whole session) and unregister it as
        a live fork: a parent whose last child ended keeps its own deadline,
        but at least ``min_retain_s`` more, since it usually resumes now."""
        if session:
            self.estimator.forget_session(key.tenant, key.sid)
        actions = self._table.end(key, session, now + self.config.min_retain_s)
        self._returns.forget(key, *(a.key for a in actions))
        return actions


def _beyond(now: float, horizon: float, seconds: float | None) -> bool:
    """The client expects to come back after the retention's hard end."""
    return seconds is not None and now + seconds > horizon
