"""PrefetchPlanner with a fake clock: due times, cancellation, learning, calibration, bounds."""

from __future__ import annotations

import pytest

from server_ext.policy import BranchKey, GapEstimator, PrefetchPlanner
from server_ext.testing import ManualClock

A = BranchKey("t", "s", "root")
B = BranchKey("t", "s", "b")
C = BranchKey("t", "other", "root")


def planner(**kw: object) -> tuple[PrefetchPlanner, ManualClock]:
    clock = ManualClock()
    return PrefetchPlanner(clock=clock, margin_s=0.5, seconds_per_token=0.001, **kw), clock  # type: ignore[arg-type]


def test_warmup_is_due_lead_time_before_the_hinted_return() -> None:
    p, clock = planner()
    plan = p.depart(A, 0.0, gap_hint=10.0, tokens=1000)
    assert plan.expected_return == pytest.approx(10.0)
    assert plan.warm_at == pytest.approx(10.0 - (1.0 + 0.5))
    assert plan.deadline > plan.expected_return
    assert p.due(8.4) == []
    assert p.due(8.51) == [A]
    assert p.due(9.0) == []  # at most once
    clock.now = 20.0
    assert p.due() == []


def test_due_is_ordered_by_expected_return() -> None:
    p, _ = planner()
    p.depart(A, 0.0, gap_hint=10.0, tokens=5000)  # warm at 4.5, back at 10
    p.depart(B, 0.0, gap_hint=6.0, tokens=0)  # warm at 5.5, back at 6
    p.depart(C, 0.0, gap_hint=60.0)
    assert p.due(6.0) == [B, A]


def test_return_and_end_cancel() -> None:
    p, _ = planner()
    p.depart(A, 0.0, gap_hint=5.0)
    p.depart(B, 0.0, gap_hint=5.0)
    p.depart(C, 0.0, gap_hint=5.0)
    p.returned(A, 1.0)
    p.ended(C)
    assert p.plan(A) is None and p.plan(C) is None
    assert p.due(10.0) == [B]


def test_root_end_cancels_the_whole_session() -> None:
    p, _ = planner()
    for key in (A, B, C):
        p.depart(key, 0.0, gap_hint=5.0)
    p.ended(BranchKey("t", "s"))
    assert p.due(10.0) == [C]
    assert p.stats.tracked == 1


def test_tool_start_eta_moves_the_warmup_and_rearms_it() -> None:
    p, _ = planner()
    p.depart(A, 0.0, gap_hint=5.0)
    assert p.due(5.0) == [A]
    p.tool_start(A, eta=30.0, tool="build", now=5.0)
    plan = p.plan(A)
    assert plan is not None and plan.expected_return == pytest.approx(35.0)
    assert p.due(34.0) == []
    assert p.due(34.5) == [A]


def test_a_branch_planned_without_warm_up_is_never_due_but_still_learns() -> None:
    p, _ = planner()
    p.depart(A, 0.0, gap_hint=5.0)
    p.tool_start(A, eta=30.0, tool="user", now=1.0, warm=False)
    plan = p.plan(A)
    assert plan is not None and plan.expected_return == pytest.approx(31.0)
    assert p.due(1000.0) == []
    p.returned(A, 61.0)
    assert p.stats.returns == 1 and p.stats.mean_error_s == pytest.approx(30.0)


def test_tool_end_makes_it_due_at_once() -> None:
    p, _ = planner()
    p.depart(A, 0.0, gap_hint=60.0)
    p.tool_end(A, now=3.0)
    assert p.due(3.0) == [A]


def test_returns_teach_the_estimator_the_session_gap() -> None:
    estimator = GapEstimator()
    p, _ = planner(estimator=estimator)
    now = 0.0
    for _ in range(20):  # the client says 5 s; the tool really takes 40 s
        p.depart(A, now, gap_hint=5.0, tool="test")
        now += 40.0
        p.returned(A, now)
    plan = p.depart(A, now, gap_hint=5.0, tool="test")
    assert plan.expected_return - now > 25.0


def test_lead_time_learns_the_warmup_cost() -> None:
    p, _ = planner(smoothing=0.5)
    assert p.lead_time(1000) == pytest.approx(1.5)
    for _ in range(20):
        p.observe_warmup(2.0, 1000)  # 2 ms per token
    assert p.lead_time(1000) == pytest.approx(2.5, rel=1e-3)
    assert p.stats.seconds_per_token == pytest.approx(0.002, rel=1e-3)
    p.observe_warmup(1.0, 0)  # no size: nothing to learn
    assert p.lead_time(1000) == pytest.approx(2.5, rel=1e-3)


def test_calibration_stats() -> None:
    p, _ = planner()
    p.depart(A, 0.0, gap_hint=10.0)
    p.returned(A, 4.0)  # 6 s early, before its warm-up
    p.depart(C, 0.0, gap_hint=10.0)  # another session: A's gap taught it nothing
    assert p.due(10.0) == [C]
    p.returned(C, 12.0)  # 2 s late, after it
    s = p.stats
    assert (s.returns, s.early_returns, s.fired) == (2, 1, 1)
    assert s.mean_abs_error_s == pytest.approx(4.0)
    assert s.mean_error_s == pytest.approx(-2.0)
    assert s.early_fraction == pytest.approx(0.5)
    p.returned(B, 1.0)  # never departed: no sample
    assert p.stats.returns == 2


def test_memory_is_bounded_lru() -> None:
    p, _ = planner(max_branches=3, tenant_share=1.0)
    keys = [BranchKey("t", f"s{i}") for i in range(10)]
    for i, key in enumerate(keys):
        p.depart(key, float(i), gap_hint=1.0)
        if i == 8:
            p.tool_start(keys[7], eta=1.0, now=8.0)  # refreshes keys[7]
    assert p.stats.tracked == 3
    assert [k for k in keys if p.plan(k) is not None] == keys[7:]
    assert sorted(p.due(100.0), key=keys.index) == keys[7:]
    # Churn never grows the heap without bound.
    for i in range(1000):
        p.tool_start(keys[9], eta=float(i), now=0.0)
    assert len(p._heap) <= 2 * 3 + 64 + 1


def test_one_tenant_cannot_push_another_tenants_plans_out() -> None:
    p, _ = planner(max_branches=8, tenant_share=0.25)
    kept = BranchKey("victim", "v")
    p.depart(kept, 0.0, gap_hint=1.0)
    for i in range(100):
        p.depart(BranchKey("flood", f"s{i}"), 1.0 + i, gap_hint=1.0)
    assert p.plan(kept) is not None
    assert sum(p.plan(BranchKey("flood", f"s{i}")) is not None for i in range(100)) == 2


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        PrefetchPlanner(max_branches=0)
    with pytest.raises(ValueError):
        PrefetchPlanner(smoothing=0.0)
