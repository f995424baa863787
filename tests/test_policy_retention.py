"""RetentionPolicy: deadlines, replacement, end, fork, control, tenant isolation."""

from __future__ import annotations

from typing import Any

import pytest

from hints_spec import ROOT_BRANCH
from server_ext.policy import (
    Action,
    BranchHints,
    BranchKey,
    EndEvent,
    ForkEvent,
    Hold,
    Outcome,
    PolicyConfig,
    Reason,
    Release,
    ReleaseReason,
    RetentionPolicy,
    ToolEndEvent,
    ToolStartEvent,
)
from server_ext.testing import ManualClock

ROOT_A = BranchKey("A", "s1")
BLOCKS = (1, 2, 3, 4)


def policy() -> RetentionPolicy:
    return RetentionPolicy(PolicyConfig(total_blocks=1000), clock=lambda: 0.0)


def retain(
    p: RetentionPolicy,
    key: BranchKey = ROOT_A,
    now: float = 0.0,
    blocks: tuple[int, ...] = BLOCKS,
    **hints: Any,
) -> list[Action]:
    return p.on_request_finished(key, blocks, BranchHints(**hints), True, now=now).actions


def test_gap_hint_sets_expected_return_and_p90_deadline_with_slack() -> None:
    p = policy()
    pred = p.estimator.predict("A", "s1", "bash", 10.0)
    d = p.on_request_finished(ROOT_A, BLOCKS, BranchHints(gap=10.0, tool="bash"), True, now=100.0)
    assert d.actions == [Hold(ROOT_A, BLOCKS)]
    assert d.outcome is Outcome.ACCEPTED
    r = p.retention(ROOT_A)
    assert r is not None
    assert r.expected_return == pytest.approx(100.0 + pred.expected_s) == pytest.approx(110.0)
    assert r.deadline == pytest.approx(100.0 + 2.0 * pred.deadline_s)
    assert pred.deadline_s > pred.expected_s
    assert r.horizon == 100.0 + 600.0


def test_unhinted_tool_call_is_bounded_by_default_ttl() -> None:
    p = policy()
    retain(p, now=0.0)
    r = p.retention(ROOT_A)
    assert r is not None and r.deadline == pytest.approx(60.0)


def test_ttl_hint_bounds_the_deadline_even_below_min_retain() -> None:
    p = policy()
    retain(p, ttl=2)
    r = p.retention(ROOT_A)
    assert r is not None and r.deadline == pytest.approx(2.0)


def test_min_retain_floors_tiny_gaps() -> None:
    p = policy()
    retain(p, gap=0.1)
    r = p.retention(ROOT_A)
    assert r is not None and r.deadline == pytest.approx(5.0)


def test_ttl_above_cap_is_clipped() -> None:
    p = policy()
    d = p.on_request_finished(ROOT_A, BLOCKS, BranchHints(gap=500.0, ttl=3600), True, now=0.0)
    assert (d.outcome, d.reason) == (Outcome.CLIPPED, Reason.TTL_CAPPED)
    r = p.retention(ROOT_A)
    assert r is not None and r.horizon == 600.0 and r.deadline == 600.0


def test_gap_beyond_own_ttl_is_reported_clipped() -> None:
    p = policy()
    d = p.on_request_finished(ROOT_A, BLOCKS, BranchHints(gap=100.0, ttl=30), True, now=0.0)
    assert (d.outcome, d.reason) == (Outcome.CLIPPED, Reason.TTL_CAPPED)
    r = p.retention(ROOT_A)
    assert r is not None and r.deadline == 30.0


def test_no_tool_call_and_no_gap_is_not_retained() -> None:
    p = policy()
    d = p.on_request_finished(ROOT_A, BLOCKS, BranchHints(), tool_calls=False, now=0.0)
    assert d.actions == [] and p.retained_branches == 0


def test_gap_hint_alone_retains_and_ttl_zero_does_not() -> None:
    p = policy()
    assert p.on_request_finished(ROOT_A, BLOCKS, BranchHints(gap=3.0), False, now=0.0).actions
    key = BranchKey("A", "s2")
    assert p.on_request_finished(key, BLOCKS, BranchHints(ttl=0), True, now=0.0).actions == []
    assert p.retention(key) is None


def test_replacement_holds_new_then_releases_old() -> None:
    p = policy()
    retain(p, blocks=(1, 2))
    actions = retain(p, now=5.0, blocks=(1, 2, 3))
    assert actions == [Hold(ROOT_A, (1, 2, 3)), Release(ROOT_A, (1, 2), ReleaseReason.REPLACED)]
    assert p.held_blocks == 3 and p.retained_branches == 1


def test_duplicate_block_ids_are_held_once() -> None:
    p = policy()
    assert retain(p, blocks=(7, 7, 8)) == [Hold(ROOT_A, (7, 8))]


def test_return_releases_and_teaches_the_estimator() -> None:
    p = policy()
    for t in range(0, 2000, 200):
        retain(p, now=float(t), gap=1.0, tool="build")
        assert p.on_request_started(ROOT_A, now=t + 150.0) == [
            Release(ROOT_A, BLOCKS, ReleaseReason.RETURNED)
        ]
    assert p.estimator.predict("A", "s1", "build", 1.0).expected_s > 30.0
    assert p.stats.returns == 10


def test_late_return_after_expiry_still_teaches() -> None:
    p = policy()
    retain(p, gap=1.0, tool="t")
    assert p.expire(now=1000.0)
    assert p.on_request_started(ROOT_A, now=1000.0) == []
    assert p.estimator.predict("A", "s1", "t", None).expected_s > 100.0


def test_end_on_a_branch_releases_only_that_branch() -> None:
    p = policy()
    child = ROOT_A.sibling("a")
    retain(p)
    retain(p, key=child, blocks=(1, 2, 9))
    d = p.on_request_finished(child, (1, 2, 9), BranchHints(end=True), False, now=1.0)
    assert d.actions == [Release(child, (1, 2, 9), ReleaseReason.END)]
    assert p.retention(ROOT_A) is not None


def test_end_on_root_releases_the_session() -> None:
    p = policy()
    retain(p)
    retain(p, key=ROOT_A.sibling("a"), blocks=(5,))
    retain(p, key=BranchKey("A", "other"), blocks=(6,))
    d = p.on_request_finished(ROOT_A, BLOCKS, BranchHints(end=True), False, now=1.0)
    assert {a.key.br for a in d.actions} == {ROOT_BRANCH, "a"}
    assert all(isinstance(a, Release) and a.reason is ReleaseReason.END for a in d.actions)
    assert p.retained_branches == 1


def test_control_end_without_branch_releases_session() -> None:
    p = policy()
    retain(p)
    retain(p, key=ROOT_A.sibling("a"), blocks=(5,))
    d = p.on_control("A", "s1", EndEvent(), now=1.0)
    assert len(d.actions) == 2 and p.retained_branches == 0 and p.stats.ends == 2


def test_tenant_cannot_touch_another_tenants_session() -> None:
    p = policy()
    retain(p)
    assert p.on_control("B", "s1", EndEvent(), now=1.0).actions == []
    assert p.on_control("B", "s1", EndEvent(br=ROOT_BRANCH), now=1.0).actions == []
    d = p.on_control("B", "s1", ToolStartEvent(tool="x", eta=500.0), now=1.0)
    assert (d.outcome, d.reason) == (Outcome.REJECTED, Reason.UNKNOWN_BRANCH)
    assert p.on_control("B", "s1", ForkEvent(children=("a",)), now=1.0).outcome is Outcome.REJECTED
    b_root = BranchKey("B", "s1")
    assert p.on_request_finished(b_root, BLOCKS, BranchHints(end=True), False, 1.0).actions == []
    assert p.on_request_started(b_root, now=2.0) == []
    r = p.retention(ROOT_A)
    assert r is not None and r.deadline == pytest.approx(60.0) and not r.children


def test_fork_keeps_parent_while_children_live_and_releases_after_last_end() -> None:
    p = policy()
    retain(p, gap=2.0)
    r = p.retention(ROOT_A)
    assert r is not None and r.deadline < 20.0
    assert p.on_control("A", "s1", ForkEvent(children=("a", "b")), now=1.0).actions == []
    assert p.expire(now=300.0) == []
    assert p.on_control("A", "s1", EndEvent(br="a"), now=300.0).actions == []
    assert p.expire(now=301.0) == []
    p.on_control("A", "s1", EndEvent(br="b"), now=302.0)
    assert r.deadline == pytest.approx(302.0 + 5.0)  # min_retain_s grace: the parent resumes
    assert p.expire(now=306.0) == []
    assert p.expire(now=308.0) == [Release(ROOT_A, BLOCKS, ReleaseReason.EXPIRED)]


def test_fork_parent_still_bounded_by_horizon() -> None:
    p = policy()
    retain(p, gap=2.0, ttl=100)
    p.on_control("A", "s1", ForkEvent(children=("a",)), now=1.0)
    assert p.expire(now=99.0) == []
    assert len(p.expire(now=100.0)) == 1


def test_child_request_with_pbr_registers_on_parent() -> None:
    p = policy()
    retain(p, gap=2.0)
    child = ROOT_A.sibling("a")
    retain(p, key=child, now=1.0, blocks=(*BLOCKS, 9), gap=3.0, pbr=ROOT_BRANCH)
    parent = p.retention(ROOT_A)
    assert parent is not None and parent.children == {"a"}
    assert p.on_request_started(child, now=5.0)  # child returned: still live
    assert p.expire(now=200.0) == []
    p.on_control("A", "s1", EndEvent(br="a"), now=200.0)
    assert len(p.expire(now=206.0)) == 1


def test_fork_of_unretained_parent_is_rejected() -> None:
    p = policy()
    d = p.on_control("A", "s1", ForkEvent(children=("a",)), now=0.0)
    assert (d.outcome, d.reason) == (Outcome.REJECTED, Reason.UNKNOWN_BRANCH)


def test_fork_children_are_bounded() -> None:
    p = policy()
    retain(p)
    kids = tuple(f"c{i}" for i in range(300))
    d = p.on_control("A", "s1", ForkEvent(children=kids), now=0.0)
    assert (d.outcome, d.reason) == (Outcome.CLIPPED, Reason.TOO_MANY_CHILDREN)


def test_tool_start_eta_moves_expected_return_and_deadline() -> None:
    p = policy()
    retain(p, gap=5.0)
    d = p.on_control("A", "s1", ToolStartEvent(tool="build", eta=100.0), now=10.0)
    assert d.outcome is Outcome.ACCEPTED
    r = p.retention(ROOT_A)
    pred = p.estimator.predict("A", "s1", "build", 100.0)
    assert r is not None
    assert r.expected_return == pytest.approx(110.0)
    assert r.deadline == pytest.approx(10.0 + 2.0 * pred.deadline_s)
    d = p.on_control("A", "s1", ToolStartEvent(tool="build", eta=5000.0), now=20.0)
    assert (d.outcome, d.reason) == (Outcome.CLIPPED, Reason.TTL_CAPPED)
    assert r.deadline == pytest.approx(600.0)


def test_tool_start_names_the_tool_the_gap_is_learned_for() -> None:
    p = policy()
    retain(p, gap=5.0)
    p.on_control("A", "s1", ToolStartEvent(tool="slow"), now=0.0)
    p.on_request_started(ROOT_A, now=200.0)
    assert p.estimator.predict("A", "other", "slow", None).expected_s > 40.0  # prior: 10


def test_tool_end_means_coming_back_now() -> None:
    p = policy()
    retain(p, gap=100.0)
    r = p.retention(ROOT_A)
    assert r is not None and r.deadline > 100.0
    assert p.on_control("A", "s1", ToolEndEvent(), now=3.0).outcome is Outcome.ACCEPTED
    assert r.expected_return == 3.0


def test_expire_uses_the_injected_clock() -> None:
    clock = ManualClock()
    p = RetentionPolicy(PolicyConfig(total_blocks=100), clock=clock)
    p.on_request_finished(ROOT_A, BLOCKS, BranchHints(ttl=10), True)
    clock.now = 9.0
    assert p.expire() == []
    clock.now = 10.0
    assert p.expire() == [Release(ROOT_A, BLOCKS, ReleaseReason.EXPIRED)]
    assert p.stats.expiries == 1 and p.held_blocks == 0


def test_tool_events_of_an_evicted_branch_still_update_its_return() -> None:
    p = policy()
    retain(p, gap=5.0)
    p.make_room(len(BLOCKS), now=1.0)
    d = p.on_control("A", "s1", ToolStartEvent(tool="slow", eta=300.0), now=2.0)
    assert (d.outcome, d.reason) == (Outcome.REJECTED, Reason.UNKNOWN_BRANCH)
    assert p.next_return(ROOT_A, 2.0) == pytest.approx(302.0)
    p.on_request_started(ROOT_A, now=302.0)  # the gap is learned under its tool
    assert p.estimator.predict("A", "other", "slow", None).expected_s > 40.0  # prior: 10
    retain(p, now=310.0, gap=5.0)
    p.make_room(len(BLOCKS), now=311.0)
    p.on_control("A", "s1", ToolEndEvent(), now=312.0)
    assert p.next_return(ROOT_A, 312.0) == 312.0


def test_tool_events_of_a_branch_never_seen_change_nothing() -> None:
    p = policy()
    d = p.on_control("A", "s1", ToolStartEvent(tool="slow", eta=300.0), now=2.0)
    assert (d.outcome, d.reason) == (Outcome.REJECTED, Reason.UNKNOWN_BRANCH)
    assert p.next_return(ROOT_A, 2.0) is None
