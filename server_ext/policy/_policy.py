"""The retention policy: which branches' KV blocks to hold, and until when."""

from __future__ import annotations

import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

from hints_spec.core import ROOT_BRANCH, EndEvent, Event, ForkEvent, Outcome, ToolEndEvent

from ._actions import Action, Decision, Hold, Reason, Release, ReleaseReason
from ._config import PolicyConfig
from ._estimator import MIN_GAP_S, GapEstimator, ReturnPlan
from ._heap import IndexedHeap
from ._keys import BranchHints, BranchKey
from ._ledger import BlockLedger
from ._order import DueIndex, Rank, VictimOrder, victim_rank
from ._retention import Retention
from ._sessions import SessionIndex

MAX_LIVE_FORKS = 256
"""Live forks one retention tracks (over all fork events); bounds the state a
tenant can create. Not the protocol's ``MAX_CHILDREN``, a cap per fork event."""

_RERANKS_PER_CALL = 4
"""Branches re-ranked per call at most: a burst of them waits for later calls
(their ranks are a little stale meanwhile) rather than stall one."""

MAX_SKIPS = 16
"""Victims of tenants within their fair share that one eviction passes over
before it settles for fewer: bounds its work whatever the other tenants hold."""

MAX_DROPS = 8
"""Retentions one call releases at most. Retentions can share blocks (forks,
sessions with one prefix), and a block is freed only with its last holder, so
freeing a few blocks could otherwise release thousands; past this, room is
made without them (the shelf takes blocks anyway, a newcomer is clipped).
Eight keep ``make_room`` under a millisecond at 100,000 retentions
(``benchmarks.policy_ops``)."""

MAX_ROOM_CALLS = 4
"""``make_room`` calls one allocation makes at most, so it releases at most
``MAX_ROOM_CALLS * MAX_DROPS`` retentions, however many share its blocks: the
shelf then takes protected blocks itself; with held references vLLM waits a
step (the next allocation releases the next few)."""


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
      - Every live retention is in ``_deadlines`` at its
        ``effective_deadline``, in the victim orders (all, and its tenant's) at
        its ``rank``, in its tenant's ``DueIndex`` while it is away, and in
        ``_rerank`` while it is due to be re-ranked: each an addressable heap
        or sorted list, O(log n) per change, nothing stale. So ``expire`` is
        O(1) when nothing is due, and no operation sorts or scans all
        retentions.
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
        self._retentions: dict[BranchKey, Retention] = {}
        self._sessions = SessionIndex()
        self._ledger = BlockLedger()
        self._deadlines = IndexedHeap[BranchKey]()
        # Victim order (all, per tenant), branches due back per tenant, and
        # when a branch away is next re-ranked (its predicted next use grows).
        self._order = VictimOrder()
        self._tenant_orders: dict[str, VictimOrder] = {}
        self._due: dict[str, DueIndex] = {}
        self._rerank = IndexedHeap[BranchKey]()
        self._tenant_retentions: Counter[str] = Counter()
        # Departure time and tool of branches expected back, kept after their
        # retention is gone so that late returns still teach the estimator.
        self._pending: OrderedDict[BranchKey, _Departure] = OrderedDict()
        self._released: Counter[ReleaseReason] = Counter()
        self._outcomes: Counter[Outcome] = Counter()
        self._holds = 0
        self._calibration = _Calibration()
        self._prefetch = _PrefetchAccuracy()

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
        return self._ledger.held

    @property
    def retained_branches(self) -> int:
        return len(self._retentions)

    def tenant_held_blocks(self, tenant: str) -> int:
        return self._ledger.tenant_held(tenant)

    def retention(self, key: BranchKey) -> Retention | None:
        """The live retention of ``key`` (read-only view)."""
        return self._retentions.get(key)

    def retentions(self) -> Iterator[Retention]:
        """All live retentions (read-only views)."""
        return iter(self._retentions.values())

    @property
    def prefetch_accuracy(self) -> float:
        """Share of recent warmed retentions that lasted until their branch
        came back (decaying, optimistic prior; see ``_PrefetchAccuracy``)."""
        return self._prefetch.rate

    @property
    def warmups_take_room(self) -> bool:
        """May a prefetch warm-up release retentions (of branches due back
        after its own)? Not while recent warm-ups were mostly wasted: each
        such eviction then costs a branch its prefix for a warm-up that
        likely does not pay."""
        return self._prefetch.rate >= self.config.prefetch_min_accuracy

    @property
    def stats(self) -> PolicyStats:
        r = self._released
        return PolicyStats(
            held_blocks=self.held_blocks,
            retained_branches=self.retained_branches,
            holds=self._holds,
            clipped=self._outcomes[Outcome.CLIPPED],
            rejected=self._outcomes[Outcome.REJECTED],
            ends=r[ReleaseReason.END],
            expiries=r[ReleaseReason.EXPIRED],
            pressure_releases=r[ReleaseReason.PRESSURE],
            budget_releases=r[ReleaseReason.BUDGET],
            replacements=r[ReleaseReason.REPLACED],
            returns=r[ReleaseReason.RETURNED],
            resets=r[ReleaseReason.RESET],
            predicted_returns=self._calibration.returns,
            return_log2_error_sum=self._calibration.log2_error_sum,
            returns_within_2x=self._calibration.within_2x,
            warmups_returned=self._prefetch.returned,
            warmups_wasted=self._prefetch.wasted,
        )

    def take_return_errors(self) -> list[float]:
        """|log2(actual gap / predicted gap)| of each branch return since the
        last call: the calibration histogram's observations."""
        return self._calibration.take_errors()

    # Request events.

    def on_request_arrived(self, key: BranchKey, now: float | None = None) -> None:
        """The branch's next request reached the engine and may queue: learn
        the gap, and keep the retention until the request is scheduled, as the
        last victim (it is the surest next use of all)."""
        now = self._now(now)
        self._learn_return(key, now)
        r = self._retentions.get(key)
        if r is not None and r.arrived_at is None:
            r.arrived_at = now
            r.plan = ReturnPlan(now, 0.0)
            self._schedule(r)
            self._index(r, now)

    def on_request_started(self, key: BranchKey, now: float | None = None) -> list[Action]:
        """The branch's next request was scheduled: release the retention (the
        running request now holds its own references). Learns the gap if
        ``on_request_arrived`` did not."""
        self._learn_return(key, self._now(now))
        r = self._retentions.get(key)
        return [] if r is None else [self._drop(r, ReleaseReason.RETURNED)[0]]

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
        old = self._retentions.get(key)
        if old is not None and not block_ids and not departs:
            return self._decide([])
        actions: list[Action] = []
        if old is not None:
            actions.append(self._drop(old, ReleaseReason.REPLACED)[0])
        if not (tool_calls or hints.gap is not None):
            return self._decide(actions)
        if departs:
            self._depart(key, now, hints.tool, hints.gap)
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
        since = None if departs else self._pending.get(key)
        window = self._window(key, now, horizon, hints.gap, hints.ttl, hints.tool, since)
        if old is None and self._tenant_retentions[key.tenant] >= self.config.max_tenant_retentions:
            actions += self._evict_own(key.tenant, now)
        kept = self._admit(key.tenant, blocks, now, window.plan.expected, actions)
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
        self._insert(r, now)
        actions.insert(0, Hold(key, r.block_ids))
        if hints.pbr is not None and hints.pbr != key.br:
            parent = self._retentions.get(key.sibling(hints.pbr))
            if parent is not None:
                self._add_children(parent, (key.br,))
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
            r = self._retentions.get(BranchKey(tenant, sid, event.parent or ROOT_BRANCH))
            if r is None:
                return self._decide([], Outcome.REJECTED, Reason.UNKNOWN_BRANCH)
            if not self._add_children(r, event.children):
                return self._decide([], Outcome.CLIPPED, Reason.TOO_MANY_CHILDREN)
            return self._decide([])
        key = BranchKey(tenant, sid, event.br or ROOT_BRANCH)
        if isinstance(event, ToolEndEvent):
            r, departed = self._retentions.get(key), self._pending.get(key)
            plan = ReturnPlan(now, 0.0)
            if departed is not None:
                self._pending[key] = departed._replace(plan=plan)
            if r is None:
                return self._decide([], Outcome.REJECTED, Reason.UNKNOWN_BRANCH)
            # Coming back now: keep it at least min_retain_s for the request.
            r.plan = plan
            r.deadline = max(r.deadline, min(now + self.config.min_retain_s, r.horizon))
            self._schedule(r)
            self._index(r, now)
            return self._decide([])
        return self._announce(key, event.tool, event.eta, now)

    def on_response_tool(self, key: BranchKey, tool: str, now: float | None = None) -> Decision:
        """The server's own response to ``key`` called ``tool`` (the API server
        parsed it): the branch waits on it, as on a ``tool_start`` without an
        ETA, unless its client named the tool it waits on (a client's
        ``tool_start`` comes before or after this one, and wins either way)."""
        departed = self._pending.get(key)
        if departed is None or departed.tool is not None:
            return self._decide([])
        return self._announce(key, tool, None, self._now(now))

    def _announce(self, key: BranchKey, tool: str, eta: float | None, now: float) -> Decision:
        """The branch ``key`` waits on ``tool`` (for ``eta`` seconds, if given):
        its return is predicted again, and the gap learned under the tool. A
        branch evicted while away still has its departure on record: it takes
        the tool and the return time (warm-ups plan by it) even when there is
        no retention to update."""
        r = self._retentions.get(key)
        departed = self._pending.get(key)
        if r is None:
            if departed is not None:
                plan = self.estimator.predict(key.tenant, key.sid, tool, eta).plan(now)
                self._pending[key] = departed._replace(tool=tool, plan=plan)
            return self._decide([], Outcome.REJECTED, Reason.UNKNOWN_BRANCH)
        if eta is not None:
            r.gap = eta
        window = self._window(key, now, r.horizon, r.gap, r.ttl, tool)
        r.plan, r.deadline = window
        if departed is not None:
            self._pending[key] = departed._replace(tool=tool, plan=r.plan)
        self._schedule(r)
        self._index(r, now)
        if _beyond(now, r.horizon, eta):
            return self._decide([], Outcome.CLIPPED, Reason.TTL_CAPPED)
        return self._decide([])

    # Engine-driven events.

    def expire(self, now: float | None = None) -> list[Action]:
        """Release retentions past their deadline; O(1) when none is due."""
        return self._expire(self._now(now))[0]

    def _expire(self, now: float) -> tuple[list[Action], int]:
        """``expire``'s actions, and how many distinct blocks they freed."""
        actions: list[Action] = []
        freed = 0
        while (first := self._deadlines.peek()) is not None and first[0] <= now:
            release, released, _ = self._drop(self._retentions[first[1]], ReleaseReason.EXPIRED)
            actions.append(release)
            freed += len(released)
        return actions, freed

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
        now = self._now(now)
        if blocks_needed <= 0:
            return []
        actions, freed = self._expire(now)
        if freed >= blocks_needed:
            return actions
        self._rerank_due(now)
        fair = self._fair_share()
        over_share = self._ledger.most_held() > fair
        for within_share in (self._within(fair), None) if over_share else (None,):
            with self._candidates(self._order, passed_over=within_share) as victims:
                for victim in victims:
                    if victim.key == spare:
                        continue
                    if sooner_than is not None and not victim.evicts_for(sooner_than, now):
                        break
                    release, released, _ = self._drop(victim, ReleaseReason.PRESSURE)
                    actions.append(release)
                    freed += len(released)
                    if freed >= blocks_needed:
                        return actions
        return actions

    def return_due(self, now: float, within_s: float, other_than: BranchKey) -> bool:
        """Is a retained branch of ``other_than``'s tenant (not ``other_than``
        itself, not yet arrived) expected back within ``within_s`` of ``now``,
        before or after? Another tenant's branches never count: its hints must
        not hold this tenant's requests back."""
        due = self._due.get(other_than.tenant)
        return due is not None and due.any_within(now - within_s, now + within_s, other_than)

    def releasable_for(
        self, expected_return: float, now: float, spare: BranchKey, enough: int
    ) -> int:
        """Held blocks that ``make_room(spare=spare, sooner_than=expected_return)``
        may release (those of other branches due back later, or expired), up
        to ``enough`` or a little more. Blocks shared by several retentions
        count once per retention."""
        total = 0
        with self._order.scan(self._rank_back) as keys:
            for r in map(self._retentions.__getitem__, keys):
                if total >= enough or not r.evicts_for(expected_return, now):
                    break
                if r.key != spare:
                    total += len(r.block_ids)
        return total

    def next_return(self, key: BranchKey, now: float) -> float | None:
        """When departed branch ``key`` is predicted back, given that it is
        still away at ``now``; None if it is not expected (never left, or
        ended)."""
        departed = self._pending.get(key)
        return None if departed is None else departed.plan.next_use(now)

    def release_all(self, reason: ReleaseReason = ReleaseReason.RESET) -> list[Action]:
        """Release every retention (e.g. on reset_prefix_cache)."""
        actions: list[Action] = [self._drop(r, reason)[0] for r in list(self._retentions.values())]
        self._clear_indexes()
        return actions

    def forget_all(self) -> None:
        """Drop every retention without a ``Release``: after a fault, when this
        state may be half-updated, the adapter gives the blocks back from its
        own count of references. Learned gaps, scores and counters stay."""
        self._retentions.clear()
        self._sessions.clear()
        self._ledger = BlockLedger()
        self._tenant_retentions.clear()
        self._clear_indexes()
        self._pending.clear()

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

    def _window(
        self,
        key: BranchKey,
        now: float,
        horizon: float,
        gap: float | None,
        ttl: int | None,
        tool: str | None,
        since: _Departure | None = None,
    ) -> _Window:
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
            return _Window(pred.plan(now), min(now + hold, horizon))
        return _Window(since.plan, min(max(since.at + hold, now), horizon))

    def _learn_return(self, key: BranchKey, now: float) -> None:
        departed = self._pending.pop(key, None)
        if departed is not None:
            self.estimator.observe(key.tenant, key.sid, departed.tool, now - departed.at)
            self._calibration.add(departed.plan.expected - departed.at, now - departed.at)

    def _depart(self, key: BranchKey, now: float, tool: str | None, gap: float | None) -> None:
        plan = self.estimator.predict(key.tenant, key.sid, tool, gap).plan(now)
        self._pending[key] = _Departure(now, tool, plan)
        self._pending.move_to_end(key)
        if len(self._pending) > self.config.max_pending_returns:
            self._pending.popitem(last=False)

    def _admit(
        self,
        tenant: str,
        blocks: tuple[int, ...],
        now: float,
        expected_return: float,
        actions: list[Action],
    ) -> int:
        """Make budget room for ``blocks`` by evicting other retentions that
        are expired or due back later than ``expected_return``: the tenant's
        own for the tenant cap; for the global cap, the tenant's own or those
        of tenants over their fair share (at most ``MAX_SKIPS`` others passed
        over); return how long a prefix fits."""
        expired, _ = self._expire(now)
        actions += expired
        cap, tenant_cap = self.held_cap, self.tenant_cap
        new, new_tenant = self._ledger.new_blocks(tenant, blocks)
        over = self._ledger.held + new - cap
        over_tenant = self._ledger.tenant_held(tenant) + new_tenant - tenant_cap
        if over <= 0 and over_tenant <= 0:
            return len(blocks)
        self._rerank_due(now)
        wanted = frozenset(blocks)
        for own_only in (True, False):
            if (over_tenant if own_only else over) <= 0:
                continue
            order = self._order_of(tenant) if own_only else self._order
            fair = self._fair_share(tenant)
            others_within = self._within(fair, but=tenant)
            with self._candidates(order, passed_over=others_within) as victims:
                for victim in victims:
                    if not victim.evicts_for(expected_return, now):
                        break  # the rest are due back sooner than the newcomer
                    theirs = victim.key.tenant
                    # Another tenant gives up no more than it holds over its share.
                    excess = self._ledger.tenant_held(theirs) - math.ceil(fair)
                    short = over_tenant if own_only else over
                    if theirs != tenant and min(excess, short) < len(victim.block_ids):
                        keep = len(victim.block_ids) - max(min(excess, short), 0)
                        release, freed, tenant_freed = self._trim(victim, keep)
                    else:
                        release, freed, tenant_freed = self._drop(victim, ReleaseReason.BUDGET)
                    actions.append(release)
                    over -= _count_outside(freed, wanted)
                    if theirs == tenant:
                        over_tenant -= _count_outside(tenant_freed, wanted)
                    if (over_tenant if own_only else over) <= 0:
                        break
        if over > 0 or over_tenant > 0:
            return self._ledger.fitting_prefix(tenant, blocks, cap, tenant_cap)
        return len(blocks)

    def _evict_own(self, tenant: str, now: float) -> list[Action]:
        """Make room for one more retention of ``tenant`` (at its count cap):
        its own first victim goes."""
        self._rerank_due(now)
        with self._candidates(self._order_of(tenant)) as victims:
            for victim in victims:
                return [self._drop(victim, ReleaseReason.BUDGET)[0]]
        return []

    @contextmanager
    def _candidates(
        self, order: VictimOrder, passed_over: Callable[[Retention], bool] | None = None
    ) -> Iterator[Iterator[Retention]]:
        """The retentions of ``order`` in victim order, for the caller to
        release: at most ``MAX_DROPS`` of them, passing over those that
        ``passed_over`` protects (at most ``MAX_SKIPS``)."""
        with order.scan(self._rank_back) as keys:

            def victims() -> Iterator[Retention]:
                skips = 0
                for taken, key in enumerate(keys):
                    r = self._retentions[key]
                    if passed_over is not None and passed_over(r):
                        skips += 1
                        if skips > MAX_SKIPS:
                            return
                        continue
                    if taken - skips >= MAX_DROPS:
                        return
                    yield r

            yield victims()

    def _within(self, fair: float, but: str | None = None) -> Callable[[Retention], bool]:
        """Whether a retention's tenant (other than ``but``) holds no more
        than ``fair`` blocks: its retentions are not another tenant's to take."""

        def within(r: Retention) -> bool:
            tenant = r.key.tenant
            return tenant != but and self._ledger.tenant_held(tenant) <= fair

        return within

    def _fair_share(self, newcomer: str | None = None) -> float:
        """The global cap split evenly over the tenants holding blocks (and
        ``newcomer``): a tenant within it keeps what it holds."""
        return self.held_cap / max(self._ledger.tenant_count(newcomer), 1)

    def _order_of(self, tenant: str) -> VictimOrder:
        order = self._tenant_orders.get(tenant)
        if order is None:
            order = self._tenant_orders[tenant] = VictimOrder()
        return order

    def _index(self, r: Retention, now: float) -> None:
        """(Re-)rank ``r`` in the victim orders and the due index, and plan
        when it is next re-ranked: at its planned return, then each time the
        time it has been away doubles (its predicted next use grows)."""
        key = r.key
        r.rank = victim_rank(r, now)
        self._order.set(key, r.rank)
        self._order_of(key.tenant).set(key, r.rank)
        due = self._due.setdefault(key.tenant, DueIndex())
        due.discard(r)
        if r.arrived_at is not None:
            self._rerank.remove(key)
            return
        due.add(r)
        since = r.plan.since
        at = max(r.expected_return, since + 2 * (now - since))
        if at < r.effective_deadline:
            self._rerank.set(key, at)
        else:
            self._rerank.remove(key)

    def _rerank_due(self, now: float) -> None:
        """Re-rank (a bounded number of) the branches away whose time has come."""
        for _ in range(_RERANKS_PER_CALL):
            first = self._rerank.peek()
            if first is None or first[0] > now:
                return
            self._index(self._retentions[first[1]], now)

    def _rank_back(self, key: BranchKey) -> Rank | None:
        r = self._retentions.get(key)
        return None if r is None else r.rank

    def _clear_indexes(self) -> None:
        self._deadlines.clear()
        self._order = VictimOrder()
        self._tenant_orders.clear()
        self._due.clear()
        self._rerank.clear()

    def _add_children(self, r: Retention, children: Iterable[str]) -> bool:
        """Register live forks of ``r``; False if some did not fit."""
        for child in children:
            if child != r.key.br and child not in r.children:
                if len(r.children) >= MAX_LIVE_FORKS:
                    return False
                r.children.add(child)
        self._schedule(r)
        return True

    def _end(self, key: BranchKey, session: bool, now: float) -> list[Action]:
        """Release branch ``key`` (or its whole session) and unregister it as
        a live fork: a parent whose last child ended keeps its own deadline,
        but at least ``min_retain_s`` more, since it usually resumes now."""
        in_session = [
            self._retentions[key.sibling(br)] for br in self._sessions.branches(key.tenant, key.sid)
        ]
        if session:
            self.estimator.forget_session(key.tenant, key.sid)
            for r in in_session:
                self._pending.pop(r.key, None)
            self._pending.pop(key, None)
            return [self._drop(r, ReleaseReason.END)[0] for r in in_session]
        self._pending.pop(key, None)
        actions: list[Action] = []
        for r in in_session:
            if r.key == key:
                actions.append(self._drop(r, ReleaseReason.END)[0])
            elif key.br in r.children:
                r.children.discard(key.br)
                if not r.children:
                    r.deadline = max(r.deadline, min(now + self.config.min_retain_s, r.horizon))
                self._schedule(r)
        return actions

    def _insert(self, r: Retention, now: float) -> None:
        self._retentions[r.key] = r
        self._sessions.add(r.key)
        self._ledger.add(r.key.tenant, r.block_ids)
        self._tenant_retentions[r.key.tenant] += 1
        self._holds += 1
        self._schedule(r)
        self._index(r, now)

    def _drop(self, r: Retention, reason: ReleaseReason) -> tuple[Release, list[int], list[int]]:
        """Forget ``r``; return its Release and the blocks no longer held
        globally and by its tenant. Its heap entry goes stale."""
        key = r.key
        del self._retentions[key]
        self._sessions.discard(key)
        freed, tenant_freed = self._ledger.remove(key.tenant, r.block_ids)
        self._deadlines.remove(key)
        self._order.remove(key)
        self._rerank.remove(key)
        if (order := self._tenant_orders.get(key.tenant)) is not None:
            order.remove(key)
        if (due := self._due.get(key.tenant)) is not None:
            due.discard(r)
        self._tenant_retentions[key.tenant] -= 1
        if not self._tenant_retentions[key.tenant]:
            del self._tenant_retentions[key.tenant]
            self._tenant_orders.pop(key.tenant, None)
            self._due.pop(key.tenant, None)
        self._released[reason] += 1
        if r.warmed and reason not in (ReleaseReason.REPLACED, ReleaseReason.RESET):
            self._prefetch.add(reason is ReleaseReason.RETURNED)
        return Release(key, r.block_ids, reason), freed, tenant_freed

    def _trim(self, r: Retention, keep: int) -> tuple[Release, list[int], list[int]]:
        """Keep ``r``'s first ``keep`` blocks (its prefix) and give up the
        rest; like ``_drop``, return that Release and the blocks it frees."""
        tail = r.block_ids[keep:]
        r.block_ids = r.block_ids[:keep]
        freed, tenant_freed = self._ledger.remove(r.key.tenant, tail)
        self._released[ReleaseReason.BUDGET] += 1
        return Release(r.key, tail, ReleaseReason.BUDGET), freed, tenant_freed

    def _schedule(self, r: Retention) -> None:
        """Keep ``r`` in the deadline heap at its current effective deadline."""
        self._deadlines.set(r.key, r.effective_deadline)


class _Window(NamedTuple):
    """A retention's predicted return and deadline."""

    plan: ReturnPlan
    deadline: float


class _Departure(NamedTuple):
    """A branch expected back: when it left, after which tool, its return plan."""

    at: float
    tool: str | None
    plan: ReturnPlan


@dataclass(slots=True)
class _Calibration:
    """Predicted vs actual gaps of returning branches, on a log2 scale
    (an error of 1 is a factor of 2), for the calibration metrics."""

    returns: int = 0
    log2_error_sum: float = 0.0
    within_2x: int = 0
    errors: list[float] = field(default_factory=list)
    """Errors not yet taken (``take_errors``), at most ``_MAX_UNTAKEN``."""

    def add(self, predicted_s: float, actual_s: float) -> None:
        error = abs(math.log2(max(actual_s, MIN_GAP_S) / max(predicted_s, MIN_GAP_S)))
        self.returns += 1
        self.log2_error_sum += error
        self.within_2x += error <= 1.0
        if len(self.errors) < _MAX_UNTAKEN:
            self.errors.append(error)

    def take_errors(self) -> list[float]:
        """The errors since the last call (for a histogram of them)."""
        taken, self.errors = self.errors, []
        return taken


_MAX_UNTAKEN = 4096
"""Calibration errors kept for the metrics between two reports (one per step)."""


_ACCURACY_MEMORY = 32.0
"""Warm-up outcomes ``_PrefetchAccuracy`` effectively remembers."""

_ACCURACY_PRIOR = 4.0
"""Pseudo-outcomes, all returned, that a new ``_PrefetchAccuracy`` starts with."""


@dataclass(slots=True)
class _PrefetchAccuracy:
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


def _beyond(now: float, horizon: float, seconds: float | None) -> bool:
    """The client expects to come back after the retention's hard end."""
    return seconds is not None and now + seconds > horizon


def _count_outside(blocks: list[int], wanted: frozenset[int]) -> int:
    return sum(b not in wanted for b in blocks)
