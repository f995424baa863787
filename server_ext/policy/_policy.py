"""The retention policy: which branches' KV blocks to hold, and until when."""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ._actions import Action, Decision, Hold, Outcome, Reason, Release, ReleaseReason
from ._config import PolicyConfig
from ._estimator import MIN_GAP_S, GapEstimator, ReturnPlan
from ._events import ControlEvent, EndEvent, ForkEvent, ToolEndEvent
from ._keys import ROOT, BranchHints, BranchKey
from ._ledger import BlockLedger
from ._retention import Retention

MAX_CHILDREN = 256
"""Live forks one retention tracks; bounds the state a tenant can create."""

MIN_BUDGET_SCALE = 1 / 16
"""The smallest share of its budgets retention keeps while it does not pay
(``RetentionPolicy.scale_budget``): enough to go on measuring whether it does."""


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
        and a later ``Release`` with the same key and block tuple ends it:
        every ``Hold`` is matched by exactly one ``Release``.
      - ``held_blocks`` (distinct block ids over live retentions, see
        ``BlockLedger``) is at most ``held_cap`` and each tenant's at most
        ``tenant_cap`` (the configured caps times ``budget_scale``).
      - Every live retention has exactly one valid entry in ``_heap`` (its
        ``token``) at its ``effective_deadline``; other entries are stale and
        skipped, and the heap is rebuilt when they outnumber live ones. So
        ``expire`` is O(1) when nothing is due and O(log n) per change.
      - All state is keyed by ``BranchKey`` (tenant first): one tenant's events
        can neither see nor touch another tenant's sessions.

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
        self._sessions: dict[tuple[str, str], set[str]] = {}
        self._ledger = BlockLedger()
        self._heap: list[tuple[float, int, BranchKey]] = []
        self._tokens = itertools.count()
        # Departure time and tool of branches expected back, kept after their
        # retention is gone so that late returns still teach the estimator.
        self._pending: OrderedDict[BranchKey, _Departure] = OrderedDict()
        self._released: Counter[ReleaseReason] = Counter()
        self._outcomes: Counter[Outcome] = Counter()
        self._holds = 0
        self._calibration = _Calibration()
        self._prefetch = _PrefetchAccuracy()
        self.budget_scale = 1.0

    # Introspection.

    @property
    def held_cap(self) -> int:
        """Most distinct blocks all retentions may hold now."""
        return math.floor(self.config.held_cap * self.budget_scale)

    @property
    def tenant_cap(self) -> int:
        """Most distinct blocks one tenant's retentions may hold now."""
        return math.floor(self.config.tenant_cap * self.budget_scale)

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
            return self._decide(self._end(key, key.br == ROOT, now))
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
        self._insert(r)
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

    def on_control(
        self, tenant: str, sid: str, event: ControlEvent, now: float | None = None
    ) -> Decision:
        """Apply one control event of ``tenant``'s session ``sid``."""
        now = self._now(now)
        if isinstance(event, EndEvent):
            key = BranchKey(tenant, sid, event.br or ROOT)
            return self._decide(self._end(key, key.br == ROOT, now))
        if isinstance(event, ForkEvent):
            r = self._retentions.get(BranchKey(tenant, sid, event.parent or ROOT))
            if r is None:
                return self._decide([], Outcome.REJECTED, Reason.UNKNOWN_BRANCH)
            if not self._add_children(r, event.children):
                return self._decide([], Outcome.CLIPPED, Reason.TOO_MANY_CHILDREN)
            return self._decide([])
        key = BranchKey(tenant, sid, event.br or ROOT)
        r = self._retentions.get(key)
        # A branch evicted while away still has its departure on record: it
        # takes the tool (its gap is learned under it) and the return time
        # (warm-ups plan by it) even when there is no retention to update.
        departed = self._pending.get(key)
        if isinstance(event, ToolEndEvent):
            plan = ReturnPlan(now, 0.0)
            if departed is not None:
                self._pending[key] = departed._replace(plan=plan)
            if r is None:
                return self._decide([], Outcome.REJECTED, Reason.UNKNOWN_BRANCH)
            # Coming back now: keep it at least min_retain_s for the request.
            r.plan = plan
            r.deadline = max(r.deadline, min(now + self.config.min_retain_s, r.horizon))
            self._schedule(r)
            return self._decide([])
        if r is None:
            if departed is not None:
                plan = self.estimator.predict(tenant, sid, event.tool, event.eta).plan(now)
                self._pending[key] = departed._replace(tool=event.tool, plan=plan)
            return self._decide([], Outcome.REJECTED, Reason.UNKNOWN_BRANCH)
        if event.eta is not None:
            r.gap = event.eta
        window = self._window(key, now, r.horizon, r.gap, r.ttl, event.tool)
        r.plan, r.deadline = window
        if departed is not None:
            self._pending[key] = departed._replace(tool=event.tool, plan=r.plan)
        self._schedule(r)
        if _beyond(now, r.horizon, event.eta):
            return self._decide([], Outcome.CLIPPED, Reason.TTL_CAPPED)
        return self._decide([])

    # Engine-driven events.

    def expire(self, now: float | None = None) -> list[Action]:
        """Release retentions past their deadline; O(1) when none is due."""
        now = self._now(now)
        actions: list[Action] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, token, key = heapq.heappop(heap)
            r = self._retentions.get(key)
            if r is not None and r.token == token:
                actions.append(self._drop(r, ReleaseReason.EXPIRED)[0])
        return actions

    def make_room(
        self,
        blocks_needed: int,
        now: float | None = None,
        spare: BranchKey | None = None,
        sooner_than: float | None = None,
    ) -> list[Action]:
        """Release retentions until they free ``blocks_needed`` distinct blocks
        or none is left, in victim order, sparing ``spare`` (the branch whose
        request needs the room: its retention is its own prefix). With
        ``sooner_than`` (a prefetch for a branch due back then), only
        retentions due back later, or expired, give way. Freed blocks may still
        be used by running requests, so the adapter calls again if the pool is
        still short.
        """
        now = self._now(now)
        actions: list[Action] = []
        if blocks_needed <= 0:
            return actions
        freed_total = 0
        for victim in self._victims(now):
            if victim.key == spare:
                continue
            if sooner_than is not None and not victim.evicts_for(sooner_than, now):
                break
            reason = _evict_reason(victim, now, ReleaseReason.PRESSURE)
            release, freed, _ = self._drop(victim, reason)
            actions.append(release)
            freed_total += len(freed)
            if freed_total >= blocks_needed:
                break
        return actions

    def return_due(self, now: float, within_s: float, other_than: BranchKey) -> bool:
        """Is a retained branch (not ``other_than``, not yet arrived) expected
        back within ``within_s`` of ``now``, before or after?"""
        return any(
            r.arrived_at is None
            and r.key != other_than
            and abs(r.expected_return - now) <= within_s
            for r in self._retentions.values()
        )

    def releasable_for(self, expected_return: float, now: float, spare: BranchKey) -> int:
        """Held blocks that ``make_room(spare=spare, sooner_than=expected_return)``
        may release: those of other branches due back later, or expired.
        Blocks shared by several retentions count once per retention."""
        return sum(
            len(r.block_ids)
            for r in self._retentions.values()
            if r.key != spare and r.evicts_for(expected_return, now)
        )

    def next_return(self, key: BranchKey, now: float) -> float | None:
        """When departed branch ``key`` is predicted back, given that it is
        still away at ``now``; None if it is not expected (never left, or
        ended)."""
        departed = self._pending.get(key)
        return None if departed is None else departed.plan.next_use(now)

    def scale_budget(self, scale: float, now: float | None = None) -> list[Action]:
        """Scale the budgets to ``scale`` of the configured caps (from
        ``MIN_BUDGET_SCALE`` to 1): a mechanism that measures what retention
        gains and costs shrinks them while it does not pay. Retentions over a
        smaller cap go, in victim order."""
        if not MIN_BUDGET_SCALE <= scale <= 1:
            raise ValueError(f"budget scale must be in [{MIN_BUDGET_SCALE}, 1]")
        now = self._now(now)
        self.budget_scale = scale
        actions: list[Action] = []
        for victim in self._victims(now):
            if self.held_blocks <= self.held_cap and all(
                self._ledger.tenant_held(t) <= self.tenant_cap for t in self._ledger.tenants()
            ):
                break
            if self.held_blocks > self.held_cap or (
                self._ledger.tenant_held(victim.key.tenant) > self.tenant_cap
            ):
                actions.append(
                    self._drop(victim, _evict_reason(victim, now, ReleaseReason.BUDGET))[0]
                )
        return actions

    def release_all(self, reason: ReleaseReason = ReleaseReason.RESET) -> list[Action]:
        """Release every retention (e.g. on reset_prefix_cache)."""
        actions: list[Action] = [self._drop(r, reason)[0] for r in list(self._retentions.values())]
        self._heap.clear()
        return actions

    def forget_all(self) -> None:
        """Drop every retention without a ``Release``: after a fault, when this
        state may be half-updated, the adapter gives the blocks back from its
        own count of references. Learned gaps, scores and counters stay."""
        self._retentions.clear()
        self._sessions.clear()
        self._ledger = BlockLedger()
        self._heap.clear()
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
        """Make budget room for ``blocks`` by evicting other retentions (the
        tenant's own for the tenant cap) that are due back later than
        ``expected_return`` or expired; return how long a prefix fits."""
        cap, tenant_cap = self.held_cap, self.tenant_cap
        new, new_tenant = self._ledger.new_blocks(tenant, blocks)
        over = self._ledger.held + new - cap
        over_tenant = self._ledger.tenant_held(tenant) + new_tenant - tenant_cap
        wanted = frozenset(blocks)
        for own_only in (True, False):
            if (over_tenant if own_only else over) <= 0:
                continue
            for victim in self._victims(now, tenant if own_only else None):
                if not victim.evicts_for(expected_return, now):
                    break  # the rest are due back sooner than the newcomer
                reason = _evict_reason(victim, now, ReleaseReason.BUDGET)
                release, freed, tenant_freed = self._drop(victim, reason)
                actions.append(release)
                over -= _count_outside(freed, wanted)
                if victim.key.tenant == tenant:
                    over_tenant -= _count_outside(tenant_freed, wanted)
                if (over_tenant if own_only else over) <= 0:
                    break
        if over > 0 or over_tenant > 0:
            return self._ledger.fitting_prefix(tenant, blocks, cap, tenant_cap)
        return len(blocks)

    def _victims(self, now: float, tenant: str | None = None) -> list[Retention]:
        candidates = [r for r in self._retentions.values() if tenant in (None, r.key.tenant)]
        return sorted(candidates, key=lambda r: r.victim_rank(now))

    def _add_children(self, r: Retention, children: Iterable[str]) -> bool:
        """Register live forks of ``r``; False if some did not fit."""
        for child in children:
            if child != r.key.br and child not in r.children:
                if len(r.children) >= MAX_CHILDREN:
                    return False
                r.children.add(child)
        self._schedule(r)
        return True

    def _end(self, key: BranchKey, session: bool, now: float) -> list[Action]:
        """Release branch ``key`` (or its whole session) and unregister it as
        a live fork: a parent whose last child ended keeps its own deadline,
        but at least ``min_retain_s`` more, since it usually resumes now."""
        in_session = [
            self._retentions[key.sibling(br)]
            for br in self._sessions.get((key.tenant, key.sid), ())
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

    def _insert(self, r: Retention) -> None:
        self._retentions[r.key] = r
        self._sessions.setdefault((r.key.tenant, r.key.sid), set()).add(r.key.br)
        self._ledger.add(r.key.tenant, r.block_ids)
        self._holds += 1
        self._schedule(r)

    def _drop(self, r: Retention, reason: ReleaseReason) -> tuple[Release, list[int], list[int]]:
        """Forget ``r``; return its Release and the blocks no longer held
        globally and by its tenant. Its heap entry goes stale."""
        key = r.key
        del self._retentions[key]
        branches = self._sessions[(key.tenant, key.sid)]
        branches.discard(key.br)
        if not branches:
            del self._sessions[(key.tenant, key.sid)]
        freed, tenant_freed = self._ledger.remove(key.tenant, r.block_ids)
        self._released[reason] += 1
        if r.warmed and reason not in (ReleaseReason.REPLACED, ReleaseReason.RESET):
            self._prefetch.add(reason is ReleaseReason.RETURNED)
        return Release(key, r.block_ids, reason), freed, tenant_freed

    def _schedule(self, r: Retention) -> None:
        """Make a fresh heap entry ``r``'s only valid one."""
        r.token = next(self._tokens)
        heapq.heappush(self._heap, (r.effective_deadline, r.token, r.key))
        if len(self._heap) > 2 * len(self._retentions) + 64:
            self._heap = [(x.effective_deadline, x.token, x.key) for x in self._retentions.values()]
            heapq.heapify(self._heap)


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

    def add(self, predicted_s: float, actual_s: float) -> None:
        error = abs(math.log2(max(actual_s, MIN_GAP_S) / max(predicted_s, MIN_GAP_S)))
        self.returns += 1
        self.log2_error_sum += error
        self.within_2x += error <= 1.0


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


def _evict_reason(r: Retention, now: float, live: ReleaseReason) -> ReleaseReason:
    """Label an eviction ``expired`` when the victim was due anyway."""
    return ReleaseReason.EXPIRED if r.effective_deadline <= now else live
