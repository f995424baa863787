"""GapEstimator: the client's gap is the prior, observations take over."""

from __future__ import annotations

import math

import pytest

from server_ext.policy import (
    BranchHints,
    BranchKey,
    EstimatorConfig,
    GapEstimator,
    PolicyConfig,
    RetentionPolicy,
    ToolStartEvent,
    median_given_elapsed,
)


def test_client_prior_dominates_without_observations() -> None:
    est = GapEstimator()
    p = est.predict("t", "s", "bash", client_gap=12.0)
    assert p.expected_s == pytest.approx(12.0)
    assert 12.0 < p.deadline_s < 12.0 * 3


def test_population_prior_without_hint() -> None:
    cfg = EstimatorConfig(prior_gap_s=10.0, prior_sigma=1.6, quantile=0.9)
    p = GapEstimator(cfg).predict("t", "s", None, client_gap=None)
    assert p.expected_s == pytest.approx(10.0)
    assert p.deadline_s == pytest.approx(10.0 * math.exp(1.2815515655446004 * 1.6))


def test_long_gaps_grow_the_deadline_despite_a_short_hint() -> None:
    est = GapEstimator()
    before = est.predict("t", "s", "build", client_gap=5.0)
    for _ in range(20):
        est.observe("t", "s", "build", 300.0)
    after = est.predict("t", "s", "build", client_gap=5.0)
    assert after.deadline_s > 5 * before.deadline_s
    assert after.expected_s > 100.0


def test_tool_statistics_carry_to_new_sessions_of_the_same_tenant_only() -> None:
    est = GapEstimator()
    for i in range(10):
        est.observe("a", f"s{i}", "test", 120.0)
    fresh = est.predict("a", "new", "test", client_gap=None)
    other_tool = est.predict("a", "new", "grep", client_gap=None)
    other_tenant = est.predict("b", "new", "test", client_gap=None)
    assert fresh.expected_s > 60.0
    assert other_tool.expected_s == pytest.approx(10.0)
    assert other_tenant.expected_s == pytest.approx(10.0)


def test_consistent_gaps_narrow_the_spread() -> None:
    est = GapEstimator()
    for _ in range(32):
        est.observe("t", "s", "bash", 8.0)
    p = est.predict("t", "s", "bash", client_gap=8.0)
    assert p.expected_s == pytest.approx(8.0)
    assert p.deadline_s < 8.0 * 1.3


def test_forgetting_follows_drift() -> None:
    est = GapEstimator(EstimatorConfig(memory=8))
    for _ in range(50):
        est.observe("t", "s", None, 1.0)
    for _ in range(50):
        est.observe("t", "s", None, 100.0)
    assert est.predict("t", "s", None, client_gap=None).expected_s > 50.0


def test_memory_is_bounded_lru() -> None:
    est = GapEstimator(EstimatorConfig(max_sessions=3, max_tools=2))
    for i in range(10):
        est.observe("t", f"s{i}", f"tool{i}", 30.0)
    assert est.tracked_sessions == 3
    assert est.tracked_tools == 2
    est.forget_session("t", "s9")
    assert est.tracked_sessions == 2


def test_zero_gap_is_floored() -> None:
    est = GapEstimator()
    est.observe("t", "s", None, 0.0)
    assert est.predict("t", "s", None, client_gap=0.0).expected_s > 0.0


def test_the_policy_checks_each_predicted_return_against_the_actual_gap() -> None:
    p = RetentionPolicy(PolicyConfig(total_blocks=100), clock=lambda: 0.0)
    key = BranchKey("t", "s")
    p.on_request_finished(key, (1, 2), BranchHints(gap=4.0), True, now=0.0)
    predicted = p.next_return(key, 0.0)
    assert predicted is not None and 3.0 < predicted < 5.0
    p.on_request_arrived(key, now=2 * predicted)  # twice as late as predicted
    assert p.stats.return_log2_error_sum == pytest.approx(1.0)
    p.on_request_finished(key, (1, 2), BranchHints(gap=4.0), True, now=10.0)
    second = (p.next_return(key, 10.0) or 0.0) - 10.0
    p.on_request_arrived(key, now=10.0 + 100.0)  # far off
    stats = p.stats
    assert stats.predicted_returns == 2 and stats.returns_within_2x == 1
    assert stats.return_log2_error_sum == pytest.approx(1.0 + math.log2(100.0 / second))
    assert p.next_return(key, 0.0) is None  # back: no longer expected


def test_a_sessions_rare_long_waits_are_not_drowned_by_its_short_tool_gaps() -> None:
    est = GapEstimator()
    for _ in range(30):
        est.observe("t", "s", None, 1.0)
    for _ in range(2):
        est.observe("t", "s", "user", 200.0)
    assert est.predict("t", "s", "user", client_gap=100.0).expected_s > 100.0
    assert est.predict("t", "s", None, client_gap=1.0).expected_s == pytest.approx(1.0)


def test_the_operator_sets_how_much_a_client_gap_counts() -> None:
    from server_ext import ExtensionConfig, ExtensionConfigError

    def predicted(config: EstimatorConfig) -> float:
        est = GapEstimator(config)
        for _ in range(20):
            est.observe("t", "s", None, 1.0)  # the session's gaps so far: 1 s
        return est.predict("t", "s", None, client_gap=30.0).expected_s

    default = ExtensionConfig().estimator_config()
    trusting = ExtensionConfig.from_mapping({"gap_hint_weight": 1000}).estimator_config()
    assert predicted(default) < 3.0  # 20 observations outweigh 4 pseudo-observations
    assert predicted(trusting) > 25.0  # an accurate client is believed
    assert (
        ExtensionConfig.from_mapping({"gap_hint_weight": 1000}).policy_config(64).estimator
        == trusting
    )
    with pytest.raises(ExtensionConfigError, match=r"gap_hint_weight.*positive"):
        ExtensionConfig.from_mapping({"gap_hint_weight": 0}).estimator_config()


def test_the_longer_a_branch_is_away_the_later_it_is_expected_back() -> None:
    pred = GapEstimator().predict("A", "s", None, 2.0)
    assert pred.spread > 0
    assert median_given_elapsed(pred.expected_s, pred.spread, 0.0) == pred.expected_s
    elapsed = (0.5, 2.0, 8.0, 32.0)
    medians = [median_given_elapsed(2.0, 1.0, e) for e in elapsed]
    assert medians == sorted(medians)
    assert all(m > e for m, e in zip(medians, elapsed, strict=True))
    # A log-normal with median 2 s and spread 1: still away at 2 s (its
    # median), half of what remains returns by 2 * exp(z_0.75) = 3.93 s.
    assert medians[1] == pytest.approx(2.0 * math.exp(0.6745), rel=1e-3)
    assert median_given_elapsed(2.0, 0.0, 5.0) == 5.0  # certain: due now
    far = [median_given_elapsed(1.0, 1.0, e) for e in (1e3, 1e4, 1e5)]  # 7-12 sigma out
    assert far == sorted(far) and math.inf not in far
    assert median_given_elapsed(1.0, 0.1, 1e6) == math.inf  # beyond the fit


def test_a_tool_the_server_saw_its_response_call_keys_the_gap_unless_the_client_named_one() -> None:
    """The API server names the tools of its own response (``on_response_tool``):
    gaps are learned under them for a client that sends only a session id, and
    a new session's wait after the same tool is predicted from them. A client's
    own ``tool_start`` wins, before or after the server's."""
    p = RetentionPolicy(PolicyConfig(total_blocks=100), clock=lambda: 0.0)
    for i in range(6):  # each session: 60 s after "tests", once
        key = BranchKey("t", f"s{i}")
        p.on_request_finished(key, (i,), BranchHints(), True, now=0.0)
        p.on_response_tool(key, "tests", now=0.0)
        p.on_request_arrived(key, now=60.0)
    fresh = BranchKey("t", "new")
    p.on_request_finished(fresh, (50,), BranchHints(), True, now=100.0)
    unnamed = (p.next_return(fresh, 100.0) or 0.0) - 100.0
    p.on_response_tool(fresh, "tests", now=100.0)
    named = (p.next_return(fresh, 100.0) or 0.0) - 100.0
    assert named > 2 * unnamed and 30.0 < named < 120.0
    client = BranchKey("t", "client")
    p.on_request_finished(client, (60,), BranchHints(), True, now=200.0)
    p.on_control("t", "client", ToolStartEvent(tool="read"), now=200.0)
    p.on_response_tool(client, "tests", now=200.0)  # the client named its tool first
    assert (p.next_return(client, 200.0) or 0.0) - 200.0 == pytest.approx(unnamed, rel=0.01)
