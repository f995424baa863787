"""RetentionPolicy under budgets and allocation pressure, and lazy expiry."""

from __future__ import annotations

import time
from typing import Any

import pytest

from server_ext.policy import (
    Action,
    BranchHints,
    BranchKey,
    Hold,
    Outcome,
    PolicyConfig,
    Reason,
    Release,
    ReleaseReason,
    RetentionPolicy,
    ToolStartEvent,
)


def policy(total_blocks: int = 40) -> RetentionPolicy:
    """total 40 blocks: global cap 20, tenant cap 10."""
    return RetentionPolicy(PolicyConfig(total_blocks=total_blocks), clock=lambda: 0.0)


def key(tenant: str, sid: str, br: str = "root") -> BranchKey:
    return BranchKey(tenant, sid, br)


def retain(
    p: RetentionPolicy,
    k: BranchKey,
    blocks: range | tuple[int, ...],
    now: float = 0.0,
    **hints: Any,
) -> list[Action]:
    return p.on_request_finished(k, tuple(blocks), BranchHints(**hints), True, now=now).actions


def released(actions: list[Action]) -> list[tuple[BranchKey, ReleaseReason]]:
    return [(a.key, a.reason) for a in actions if isinstance(a, Release)]


def test_caps_follow_the_config() -> None:
    cfg = PolicyConfig(total_blocks=41, max_held_fraction=0.5, max_tenant_fraction=0.5)
    assert (cfg.held_cap, cfg.tenant_cap) == (20, 10)


def test_tenant_cap_evicts_own_furthest_return_first() -> None:
    p = policy()
    far, near, new = key("A", "far"), key("A", "near"), key("A", "new")
    retain(p, far, range(0, 4), gap=100.0)
    retain(p, near, range(4, 8), gap=10.0)
    retain(p, key("B", "b"), range(100, 108), gap=500.0)  # other tenant: untouched
    actions = retain(p, new, range(8, 12), gap=50.0)
    assert actions[0] == Hold(new, (8, 9, 10, 11))
    assert released(actions) == [(far, ReleaseReason.BUDGET)]
    assert p.tenant_held_blocks("A") == 8 and p.stats.budget_releases == 1


def test_budget_evicts_expired_first() -> None:
    p = policy()
    far, due = key("A", "far"), key("A", "due")
    retain(p, far, range(0, 4), gap=100.0)
    retain(p, due, range(4, 8), gap=1.0, ttl=5)
    actions = retain(p, key("A", "new"), range(8, 12), now=10.0, gap=50.0)
    assert released(actions) == [(due, ReleaseReason.EXPIRED)]


def test_global_cap_takes_from_the_furthest_tenant_only_what_it_holds_over_its_share() -> None:
    p = policy()
    retain(p, key("A", "a"), range(0, 8), gap=10.0)
    retain(p, key("B", "b"), range(10, 18), gap=300.0)
    decision = p.on_request_finished(
        key("C", "c"), tuple(range(20, 28)), BranchHints(gap=20.0), True, now=0.0
    )
    # Cap 20 over three tenants: B, due back last, keeps its share (7 blocks,
    # its prefix); A is due back before C; C gets what is left.
    assert released(decision.actions) == [(key("B", "b"), ReleaseReason.BUDGET)]
    b = p.retention(key("B", "b"))
    assert b is not None and b.block_ids == tuple(range(10, 17))
    assert p.tenant_held_blocks("C") == 5 and decision.outcome is Outcome.CLIPPED
    assert p.held_blocks == 20


def test_shared_prefix_counts_once() -> None:
    p = policy()
    parent, child = key("A", "s"), key("A", "s", "a")
    retain(p, parent, range(0, 8), gap=10.0)
    actions = retain(p, child, range(0, 10), gap=10.0, pbr="root")
    assert actions == [Hold(child, tuple(range(10)))]
    assert p.held_blocks == 10 and p.tenant_held_blocks("A") == 10


def test_a_retention_alone_over_the_cap_is_clipped_to_its_prefix() -> None:
    p = policy()
    d = p.on_request_finished(key("A", "s"), tuple(range(15)), BranchHints(), True, now=0.0)
    assert d.actions == [Hold(key("A", "s"), tuple(range(10)))]
    assert (d.outcome, d.reason) == (Outcome.CLIPPED, Reason.BUDGET_CLIPPED)
    assert p.stats.clipped == 1


def test_zero_budget_rejects() -> None:
    p = policy(total_blocks=1)
    d = p.on_request_finished(key("A", "s"), (1, 2), BranchHints(), True, now=0.0)
    assert d.actions == [] and (d.outcome, d.reason) == (Outcome.REJECTED, Reason.OVER_BUDGET)


def test_make_room_expired_first_then_furthest_return() -> None:
    p = policy(total_blocks=1000)
    soon, later, latest = key("A", "soon"), key("B", "later"), key("C", "latest")
    due = key("D", "due")
    retain(p, soon, range(0, 4), gap=5.0)
    retain(p, later, range(4, 8), gap=50.0)
    retain(p, latest, range(8, 12), gap=200.0)
    retain(p, due, range(12, 16), gap=300.0, ttl=1)
    assert released(p.make_room(5, now=2.0)) == [
        (due, ReleaseReason.EXPIRED),
        (latest, ReleaseReason.PRESSURE),
    ]
    assert released(p.make_room(1, now=2.0)) == [(later, ReleaseReason.PRESSURE)]
    assert p.make_room(0, now=2.0) == []
    assert p.stats.pressure_releases == 2 and p.stats.expiries == 1


def test_make_room_prio_breaks_ties() -> None:
    p = policy(total_blocks=1000)
    keep, drop = key("A", "keep"), key("A", "drop")
    retain(p, keep, range(0, 4), gap=30.0, prio=1)
    retain(p, drop, range(4, 8), gap=30.0, prio=6)
    assert released(p.make_room(1, now=0.0)) == [(drop, ReleaseReason.PRESSURE)]


def test_make_room_counts_only_blocks_no_longer_held() -> None:
    p = policy(total_blocks=1000)
    parent, child = key("A", "s"), key("A", "s", "a")
    retain(p, parent, range(0, 8), gap=5.0)
    retain(p, child, range(0, 10), gap=100.0)
    # The child goes first but frees only its 2 own blocks; the parent must follow.
    assert released(p.make_room(3, now=0.0)) == [
        (child, ReleaseReason.PRESSURE),
        (parent, ReleaseReason.PRESSURE),
    ]
    assert p.held_blocks == 0


def test_make_room_with_nothing_held_returns_nothing() -> None:
    assert policy().make_room(10, now=0.0) == []


def test_expire_is_lazy_and_the_indexes_hold_each_retention_once() -> None:
    p = policy(total_blocks=100_000)
    keys = [key("A", f"s{i}") for i in range(200)]
    for i, k in enumerate(keys):
        retain(p, k, (i,), gap=30.0)
    for step in range(20):
        for k in keys:
            p.on_control("A", k.sid, ToolStartEvent(tool="t", eta=30.0 + step), now=float(step))
    # Re-planned 20 times each, every retention is still in each index once.
    assert len(p._table.deadlines) == len(p._table.ranking.order) == len(keys)
    assert p.expire(now=20.0) == []
    assert len(p._table.deadlines) == len(keys)
    start = time.perf_counter()
    for _ in range(10_000):
        p.expire(now=20.0)
    assert time.perf_counter() - start < 0.5
    assert len(p.expire(now=10_000.0)) == len(keys)
    assert len(p._table.deadlines) == len(p._table.ranking.order) == 0 and p.held_blocks == 0


def test_expire_skips_entries_of_replaced_or_extended_retentions() -> None:
    p = policy()
    a, b = key("A", "a"), key("A", "b")
    retain(p, a, (1,), ttl=10)
    retain(p, a, (1,), now=5.0, ttl=100)  # replaced: the old deadline (10) is stale
    retain(p, b, (2,), gap=1.0)
    p.on_control("A", "b", ToolStartEvent(tool="t", eta=200.0), now=1.0)  # extended
    assert p.expire(now=50.0) == []
    assert released(p.expire(now=105.0)) == [(a, ReleaseReason.EXPIRED)]


def test_release_all_releases_everything_with_reset() -> None:
    p = policy()
    retain(p, key("A", "a"), range(0, 4), gap=10.0)
    retain(p, key("B", "b"), range(0, 4), gap=10.0)
    actions = p.release_all()
    assert sorted(released(actions), key=str) == sorted(
        [(key("A", "a"), ReleaseReason.RESET), (key("B", "b"), ReleaseReason.RESET)], key=str
    )
    assert p.held_blocks == 0 and p.retained_branches == 0 and p.stats.resets == 2
    assert p.expire(now=1e9) == []


def test_a_full_budget_admits_only_by_evicting_later_returns() -> None:
    p = policy()
    soon = key("A", "soon")
    retain(p, soon, range(0, 10), gap=5.0)
    # Due back after ``soon``: it may not take its budget, only what is left.
    d = p.on_request_finished(
        key("A", "late"), tuple(range(20, 24)), BranchHints(gap=60.0), True, now=0.0
    )
    assert d.actions == [] and (d.outcome, d.reason) == (Outcome.REJECTED, Reason.OVER_BUDGET)
    assert p.retention(soon) is not None and p.stats.budget_releases == 0
    # Due back sooner: ``soon`` (now the later one) gives way.
    assert released(retain(p, key("A", "sooner"), range(30, 34), gap=1.0)) == [
        (soon, ReleaseReason.BUDGET)
    ]


def test_a_queued_return_is_the_last_victim_and_does_not_expire() -> None:
    p = policy(total_blocks=1000)
    queued, overdue = key("A", "queued"), key("B", "overdue")
    retain(p, queued, range(0, 4), gap=1.0)
    retain(p, overdue, range(4, 8), gap=0.5)
    p.on_request_arrived(queued, now=2.0)
    # Expected back sooner than ``queued``, but that one is already here.
    assert released(p.make_room(1, now=2.0)) == [(overdue, ReleaseReason.PRESSURE)]
    assert p.expire(now=300.0) == []  # past its deadline: it waits in the queue
    assert p.on_request_started(queued, now=301.0) == [
        Release(queued, (0, 1, 2, 3), ReleaseReason.RETURNED)
    ]


def test_make_room_spares_the_branch_that_needs_the_room() -> None:
    p = policy(total_blocks=1000)
    mine, other = key("A", "mine"), key("A", "other")
    retain(p, mine, range(0, 4), gap=500.0)
    retain(p, other, range(4, 8), gap=5.0)
    assert released(p.make_room(8, now=0.0, spare=mine)) == [(other, ReleaseReason.PRESSURE)]
    assert p.make_room(8, now=0.0, spare=mine) == []
    assert p.retention(mine) is not None


def test_an_overdue_branch_is_a_victim_before_one_about_to_return() -> None:
    p = policy(total_blocks=1000)
    overdue, fresh = key("A", "overdue"), key("B", "fresh")
    retain(p, overdue, range(0, 4), gap=2.0)  # planned back at t=2
    retain(p, fresh, range(4, 8), now=7.5, gap=1.0)  # planned back at t=8.5
    r = p.retention(overdue)
    assert r is not None and r.expected_return == pytest.approx(2.0)
    assert r.effective_deadline > 8.0  # not expired at t=8
    # Still away at t=8, four times its planned gap: gaps are heavy-tailed, so
    # it is now expected back after ``fresh`` and goes first.
    assert r.next_use(8.0) > p.retention(fresh).next_use(8.0) > 8.5  # type: ignore[union-attr]
    assert released(p.make_room(1, now=8.0)) == [(overdue, ReleaseReason.PRESSURE)]


def test_an_overdue_branch_gives_its_budget_to_a_newcomer_due_sooner() -> None:
    p = policy()
    overdue = key("A", "overdue")
    retain(p, overdue, range(0, 10), gap=2.0)  # the tenant's whole budget
    # At t=0 a newcomer due at t=5 may not displace it (due at t=2) ...
    d = p.on_request_finished(key("A", "x"), (50, 51), BranchHints(gap=5.0), True, now=0.0)
    assert d.outcome is Outcome.REJECTED
    # ... at t=8, still away, it is expected back later than one due at t=9.
    actions = retain(p, key("A", "new"), range(20, 24), now=8.0, gap=1.0)
    assert released(actions) == [(overdue, ReleaseReason.BUDGET)]
