"""Which retentions give way when blocks are short or a budget is full."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ._actions import Action, ReleaseReason
from ._config import PolicyConfig
from ._keys import BranchKey
from ._order import VictimOrder
from ._retention import Retention
from ._table import RetentionTable

__all__ = ["MAX_DROPS", "MAX_ROOM_CALLS", "MAX_SKIPS", "Evictor"]

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


class Evictor:
    """Chooses the retentions that give way, and how much of each: under
    allocation pressure (``make_room``), for a newcomer over a budget
    (``admit``) or over its tenant's count (``evict_own``).

    It exists apart from the table because these are the policy's fairness
    and cost rules, not bookkeeping: expired first, then victim order
    (Belady with predicted next use); a tenant within its fair share of the
    budget loses nothing to another's newcomer; no call releases more than
    ``MAX_DROPS`` retentions nor passes over more than ``MAX_SKIPS``. The
    table does the releasing.

    Args:
        table: The live retentions it releases from.
        config: The budgets (``held_cap``, ``tenant_cap``).
    """

    def __init__(self, table: RetentionTable, config: PolicyConfig) -> None:
        self._table = table
        self._config = config

    def make_room(
        self,
        blocks_needed: int,
        now: float,
        spare: BranchKey | None = None,
        sooner_than: float | None = None,
    ) -> list[Action]:
        """``RetentionPolicy.make_room`` at ``now``."""
        if blocks_needed <= 0:
            return []
        table = self._table
        actions, freed = table.expire(now)
        if freed >= blocks_needed:
            return actions
        table.ranking.rerank_due(now)
        fair = self._fair_share()
        over_share = table.ledger.most_held() > fair
        for within_share in (self._within(fair), None) if over_share else (None,):
            with self._candidates(table.ranking.order, passed_over=within_share) as victims:
                for victim in victims:
                    if victim.key == spare:
                        continue
                    if sooner_than is not None and not victim.evicts_for(sooner_than, now):
                        break
                    release, released, _ = table.drop(victim, ReleaseReason.PRESSURE)
                    actions.append(release)
                    freed += len(released)
                    if freed >= blocks_needed:
                        return actions
        return actions

    def releasable_for(
        self, expected_return: float, now: float, spare: BranchKey, enough: int
    ) -> int:
        """``RetentionPolicy.releasable_for``."""
        table = self._table
        total = 0
        with table.ranking.order.scan(table.ranking.rank_back) as keys:
            for r in map(table.retentions.__getitem__, keys):
                if total >= enough or not r.evicts_for(expected_return, now):
                    break
                if r.key != spare:
                    total += len(r.block_ids)
        return total

    def admit(
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
        table, ledger = self._table, self._table.ledger
        expired, _ = table.expire(now)
        actions += expired
        cap, tenant_cap = self._config.held_cap, self._config.tenant_cap
        new, new_tenant = ledger.new_blocks(tenant, blocks)
        over = ledger.held + new - cap
        over_tenant = ledger.tenant_held(tenant) + new_tenant - tenant_cap
        if over <= 0 and over_tenant <= 0:
            return len(blocks)
        table.ranking.rerank_due(now)
        wanted = frozenset(blocks)
        for own_only in (True, False):
            if (over_tenant if own_only else over) <= 0:
                continue
            order = table.ranking.order_of(tenant) if own_only else table.ranking.order
            fair = self._fair_share(tenant)
            others_within = self._within(fair, but=tenant)
            with self._candidates(order, passed_over=others_within) as victims:
                for victim in victims:
                    if not victim.evicts_for(expected_return, now):
                        break  # the rest are due back sooner than the newcomer
                    theirs = victim.key.tenant
                    # Another tenant gives up no more than it holds over its share.
                    excess = ledger.tenant_held(theirs) - math.ceil(fair)
                    short = over_tenant if own_only else over
                    if theirs != tenant and min(excess, short) < len(victim.block_ids):
                        keep = len(victim.block_ids) - max(min(excess, short), 0)
                        release, freed, tenant_freed = table.trim(victim, keep)
                    else:
                        release, freed, tenant_freed = table.drop(victim, ReleaseReason.BUDGET)
                    actions.append(release)
                    over -= _count_outside(freed, wanted)
                    if theirs == tenant:
                        over_tenant -= _count_outside(tenant_freed, wanted)
                    if (over_tenant if own_only else over) <= 0:
                        break
        if over > 0 or over_tenant > 0:
            return ledger.fitting_prefix(tenant, blocks, cap, tenant_cap)
        return len(blocks)

    def evict_own(self, tenant: str, now: float) -> list[Action]:
        """Make room for one more retention of ``tenant`` (at its count cap):
        its own first victim goes."""
        self._table.ranking.rerank_due(now)
        with self._candidates(self._table.ranking.order_of(tenant)) as victims:
            for victim in victims:
                return [self._table.drop(victim, ReleaseReason.BUDGET)[0]]
        return []

    @contextmanager
    def _candidates(
        self, order: VictimOrder, passed_over: Callable[[Retention], bool] | None = None
    ) -> Iterator[Iterator[Retention]]:
        """The retentions of ``order`` in victim order, for the caller to
        release: at most ``MAX_DROPS`` of them, passing over those that
        ``passed_over`` protects (at most ``MAX_SKIPS``)."""
        retentions = self._table.retentions
        with order.scan(self._table.ranking.rank_back) as keys:

            def victims() -> Iterator[Retention]:
                skips = 0
                for taken, key in enumerate(keys):
                    r = retentions[key]
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
        ledger = self._table.ledger

        def within(r: Retention) -> bool:
            tenant = r.key.tenant
            return tenant != but and ledger.tenant_held(tenant) <= fair

        return within

    def _fair_share(self, newcomer: str | None = None) -> float:
        """The global cap split evenly over the tenants holding blocks (and
        ``newcomer``): a tenant within it keeps what it holds."""
        return self._config.held_cap / max(self._table.ledger.tenant_count(newcomer), 1)


def _count_outside(blocks: list[int], wanted: frozenset[int]) -> int:
    return sum(b not in wanted for b in blocks)
