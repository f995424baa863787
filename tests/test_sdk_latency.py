"""LatencyEstimator: priors, quantiles, drift, pooling, persistence."""

from __future__ import annotations

import pytest

from agentsdk import LatencyEstimator, LatencyStats


def test_unseen_tools_use_their_prior() -> None:
    estimator = LatencyEstimator(prior_seconds=2.0)
    assert estimator.estimate({}) is None
    assert estimator.estimate({"t": None}) == 2.0
    assert estimator.estimate({"t": 30.0}) == 30.0


def test_quantiles_follow_observations_within_a_bin() -> None:
    estimator = LatencyEstimator(quantile=0.5)
    for _ in range(20):
        estimator.observe("build", 40.0)
    assert estimator.estimate({"build": None}) == pytest.approx(40.0, rel=0.13)
    p90 = LatencyEstimator(estimator.stats, quantile=0.9)
    for seconds in [1.0] * 10 + [100.0] * 3:
        p90.observe("mixed", seconds)
    assert p90.estimate({"mixed": 1.0}) == pytest.approx(100.0, rel=0.13)
    assert LatencyEstimator(p90.stats).estimate({"mixed": 1.0}) == pytest.approx(1.0, rel=0.13)


def test_recent_durations_outweigh_old_ones() -> None:
    estimator = LatencyEstimator(decay=0.8)
    for _ in range(30):
        estimator.observe("t", 1.0)
    for _ in range(10):
        estimator.observe("t", 10.0)
    assert estimator.estimate({"t": None}) == pytest.approx(10.0, rel=0.13)
    assert len(estimator.stats.tools["t"]) == 2  # decayed weights stay bounded, not per call


def test_pooled_estimate_weights_tools_by_use() -> None:
    estimator = LatencyEstimator()
    for _ in range(10):
        estimator.observe("grep", 0.05)
    estimator.observe("test", 60.0)
    pooled = estimator.estimate({"grep": None, "test": None})
    assert pooled == pytest.approx(0.05, rel=0.13)  # grep dominates recent waits


def test_a_new_session_starts_from_what_the_agents_earlier_sessions_learned() -> None:
    shared = LatencyStats()
    first = LatencyEstimator(shared=shared)
    for _ in range(5):
        first.observe("pytest", 20.0)
    second = LatencyEstimator(shared=shared)  # a new session: its own stats are empty
    assert second.estimate({"pytest": None}) == pytest.approx(20.0, rel=0.13)
    assert LatencyEstimator().estimate({"pytest": None}) == 1.0  # the prior, without
    # Its own calls weigh twice (they are in both): 3 of its own at 2 s outweigh
    # the 5 shared ones at 20 s.
    for _ in range(3):
        second.observe("pytest", 2.0)
    assert second.estimate({"pytest": None}) == pytest.approx(2.0, rel=0.13)
    assert LatencyEstimator(shared=shared).estimate({"pytest": None}) == pytest.approx(
        20.0, rel=0.13
    )


def test_the_loops_own_time_adds_to_every_tools_estimate() -> None:
    estimator = LatencyEstimator()
    for _ in range(5):
        estimator.observe("grep", 0.05)
        estimator.observe("test", 10.0)
    assert estimator.estimate({"grep": None}) == pytest.approx(0.05, rel=0.13)
    for seconds in (0.02, 0.03, 0.02):
        estimator.observe_around(seconds)
    # Its own quantile, once, on top of the tools' (pooled or not).
    assert estimator.estimate({"grep": None}) == pytest.approx(0.07, rel=0.13)
    assert estimator.estimate({"test": None}) == pytest.approx(10.02, rel=0.13)
    assert estimator.estimate({}) is None
    restored = LatencyEstimator(LatencyStats.model_validate_json(estimator.stats.model_dump_json()))
    assert restored.estimate({"grep": None}) == estimator.estimate({"grep": None})
    # Stats stored before the loop's time was kept apart still load.
    old = LatencyStats.model_validate_json('{"tools": {"grep": {"12": 1.0}}}')
    assert old.around == {}


def test_extreme_values_are_clamped_to_protocol_bounds() -> None:
    estimator = LatencyEstimator()
    estimator.observe("t", 0.0)
    estimator.observe("u", 10**9)
    assert 0 < (estimator.estimate({"t": 1e-9}) or 0) < 0.002
    assert estimator.estimate({"u": 10**9}) == 86_400.0


def test_stats_round_trip_as_json() -> None:
    estimator = LatencyEstimator()
    estimator.observe("t", 3.0)
    restored = LatencyEstimator(LatencyStats.model_validate_json(estimator.stats.model_dump_json()))
    assert restored.estimate({"t": None}) == estimator.estimate({"t": None})


def test_invalid_settings() -> None:
    with pytest.raises(ValueError, match="quantile"):
        LatencyEstimator(quantile=1.0)
    with pytest.raises(ValueError, match="decay"):
        LatencyEstimator(decay=0.0)
