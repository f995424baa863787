"""Warm-first admission: short prefills first among hinted requests, never starving."""

from __future__ import annotations

import pytest

from hints_spec import AgentHints
from server_ext._config import ExtensionConfig, ExtensionConfigError
from server_ext._contract import HintedParams, hint_params, read_hint_params
from server_ext._engine import EngineRetention
from server_ext.policy import (
    AdmissionConfig,
    AdmissionTrial,
    BranchHints,
    BranchKey,
    PolicyConfig,
    RetentionPolicy,
    StepTimer,
    WarmFirstGate,
)
from server_ext.testing import FakeBlockPool, ManualClock


def due(within_s: float) -> bool:
    """A ``warm_return_due`` for which some retained branch is always due."""
    return True


def gate(max_defer_s: float = 10.0, timer: StepTimer | None = None) -> WarmFirstGate:
    return WarmFirstGate(
        AdmissionConfig(max_defer_s=max_defer_s, min_gain_blocks=4),
        AdmissionTrial(fixed_share=1.0),
        timer,
    )


def test_a_cold_request_waits_for_a_much_cheaper_one() -> None:
    g = gate()
    g.arrived("cold", now=0.0)
    g.arrived("warm", now=0.5, uncached_blocks=2)  # its branch's blocks are retained
    assert g.defer("cold", 100, now=1.0)
    assert not g.defer("warm", 2, now=1.0)
    g.left("warm")  # scheduled
    assert not g.defer("cold", 100, now=1.5)
    assert g.deferrals == 1


def test_no_deferral_for_small_gains_or_unknown_costs() -> None:
    g = gate()
    g.arrived("a", now=0.0)
    g.arrived("unknown", now=0.0)  # not considered yet, nothing retained
    assert not g.defer("a", 100, now=0.1)
    g.arrived("similar", now=0.0, uncached_blocks=60)  # more than half of 100
    assert not g.defer("a", 100, now=0.2)
    g.arrived("cheap", now=0.0, uncached_blocks=3)
    g.arrived("b", now=0.0)
    assert not g.defer("b", 6, now=0.2)  # 3 blocks saved: below min_gain_blocks
    assert not g.defer("unhinted", 100, now=0.2)  # never entered the gate
    assert g.defer("a", 100, now=0.3)


def test_a_request_is_never_deferred_past_its_bound() -> None:
    g = gate(max_defer_s=2.0)
    g.arrived("cold", now=0.0)
    g.arrived("warm", now=0.0, uncached_blocks=0)
    assert g.defer("cold", 50, now=1.9)
    assert not g.defer("cold", 50, now=2.0)


def test_costs_learned_when_considered_are_used_for_others() -> None:
    g = gate()
    g.arrived("first", now=0.0)
    g.arrived("second", now=0.0)
    assert not g.defer("second", 1, now=0.0)  # considered: its cost is now known
    assert g.defer("first", 80, now=0.1)
    g.left("second")
    g.left("first")
    assert g.waiting == 0


def test_zero_disables_and_bad_bounds_are_rejected() -> None:
    g = gate(max_defer_s=0.0)
    g.arrived("cold", now=0.0)
    g.arrived("warm", now=0.0, uncached_blocks=0)
    assert not g.defer("cold", 100, now=0.0)
    with pytest.raises(ValueError, match="max_defer_s"):
        AdmissionConfig(max_defer_s=-1.0)


def test_the_engine_estimates_a_returning_branch_from_its_retained_blocks() -> None:
    clock = ManualClock()
    policy = RetentionPolicy(PolicyConfig(total_blocks=100, max_held_fraction=1.0), clock)
    engine = EngineRetention(policy, FakeBlockPool(), gate(), clock=clock)
    warm = hinted(sid="warm", gap=1.0)
    assert engine.request_added("w1", warm, prompt_blocks=10)
    engine.request_scheduled("w1")
    engine.request_finished("w1", list(range(10)))  # 10 blocks retained
    assert engine.request_added("c1", hinted(sid="cold"), prompt_blocks=90)
    clock.now = 1.0
    assert engine.request_added("w2", warm, prompt_blocks=12)  # ~2 blocks to compute
    assert engine.defers("c1", 90)
    assert not engine.defers("w2", 2)
    engine.request_scheduled("w2")
    assert not engine.defers("c1", 90) and engine.deferrals == 1
    assert not engine.defers("plain-request", 90)  # unhinted: never deferred


def test_a_retained_branch_due_back_counts_as_a_free_waiting_request() -> None:
    g = gate(max_defer_s=5.0)
    g.arrived("cold", now=0.0)
    assert not g.defer("cold", 40, now=0.1)
    assert g.defer("cold", 40, now=0.2, warm_return_due=due)
    assert not g.defer("cold", 3, now=0.3, warm_return_due=due)  # too small to matter
    assert not g.defer("cold", 40, now=5.0, warm_return_due=due)  # its bound


def test_the_policy_says_when_a_retained_branch_is_due() -> None:
    p = RetentionPolicy(PolicyConfig(total_blocks=100, max_held_fraction=1.0), lambda: 0.0)
    soon, me = BranchKey("t", "soon"), BranchKey("t", "me")
    p.on_request_finished(soon, (1, 2), BranchHints(gap=2.0), True, now=0.0)
    p.on_request_finished(me, (3, 4), BranchHints(gap=0.5), True, now=0.0)
    expected = p.retention(soon).expected_return  # type: ignore[union-attr]
    assert p.return_due(expected - 0.5, 1.0, other_than=me)
    assert not p.return_due(expected + 5.0, 1.0, other_than=me)
    assert not p.return_due(0.5, 0.1, other_than=me)  # only ``me`` is due then
    p.on_request_arrived(soon, now=expected)
    assert not p.return_due(expected, 1.0, other_than=me)  # arrived: a real waiting request


def hinted(sid: str, **hints: object) -> HintedParams | None:
    """What the engine reads of a hinted request of tenant "t"."""
    return read_hint_params(hint_params("t", AgentHints(sid=sid, **hints)))  # type: ignore[arg-type]


def engine_with_a_retained_branch(
    timer: StepTimer | None = None,
) -> tuple[EngineRetention, ManualClock, float]:
    """An engine with 90 free blocks and branch "warm" retained (its gate
    reading ``timer``); its clock; and when that branch is due back."""
    clock = ManualClock()
    policy = RetentionPolicy(PolicyConfig(total_blocks=100, max_held_fraction=1.0), clock)
    engine = EngineRetention(policy, FakeBlockPool(free=90), gate(timer=timer), clock=clock)
    assert engine.request_added("w1", hinted(sid="warm", gap=1.0), 10)
    engine.request_scheduled("w1")
    engine.request_finished("w1", list(range(10)))
    retained = policy.retention(BranchKey("t", "warm"))
    assert retained is not None
    return engine, clock, retained.expected_return


def test_a_cold_prefill_waits_for_a_due_branch_while_the_engine_is_busy() -> None:
    engine, clock, due = engine_with_a_retained_branch()
    assert not engine.request_added("busy", None)  # another request runs
    engine.request_scheduled("busy")
    assert engine.request_added("c1", hinted(sid="cold"), prompt_blocks=30)
    clock.now = due
    assert engine.defers("c1", 30)
    clock.now += 5.0  # the branch did not come back when predicted
    assert not engine.defers("c1", 30)


def test_an_idle_engine_never_waits_for_a_due_branch() -> None:
    engine, clock, due = engine_with_a_retained_branch()
    assert engine.request_added("c1", hinted(sid="cold"), prompt_blocks=30)
    assert not engine.request_added("queued", None)  # waiting, not running: still idle
    clock.now = due
    assert not engine.defers("c1", 30)  # nothing runs: waiting would only idle the engine
    engine.request_scheduled("queued")
    assert engine.defers("c1", 30)
    engine.request_finished("queued", [])
    assert not engine.defers("c1", 30)


def test_the_operator_sets_the_admission_bounds() -> None:
    gate_ = ExtensionConfig.from_mapping(
        {"max_defer_s": 20, "defer_lookahead_s": 3}
    ).admission_gate(64)
    assert gate_ is not None and gate_.config == AdmissionConfig(
        max_defer_s=20.0, lookahead_s=3.0, block_size=64
    )
    assert ExtensionConfig.from_mapping({"max_defer_s": 0}).admission_gate(64) is None
    assert ExtensionConfig().admission_gate(64) is None  # off by default
    tiered = ExtensionConfig(max_defer_s=10).admission_gate(64, tiered=True)
    assert tiered is not None and tiered.config.lookahead_s == 0.0


def test_lookahead_zero_never_waits_for_a_due_branch() -> None:
    g = WarmFirstGate(AdmissionConfig(lookahead_s=0.0), AdmissionTrial(fixed_share=1.0))
    g.arrived("cold", now=0.0)
    assert not g.defer("cold", 40, now=0.1, warm_return_due=due)
    g.arrived("warm", now=0.1, uncached_blocks=1)
    assert g.defer("cold", 40, now=0.2)  # shortest prefill first still applies
    with pytest.raises(ExtensionConfigError, match="defer_lookahead_s"):
        ExtensionConfig.from_mapping({"defer_lookahead_s": -1})


def test_the_step_timer_learns_seconds_per_token_from_busy_steps() -> None:
    t = StepTimer(smoothing=0.5)
    assert t.seconds(1000) is None  # nothing timed yet
    t.step(0.0, {"a": 1000})
    t.step(0.1, {"a": 1000, "b": 8})  # "a" ran on: the engine was busy
    assert t.seconds_per_token == pytest.approx(1e-4)
    t.step(0.4, {"b": 8})  # 1,008 tokens in 0.3 s
    assert t.seconds_per_token == pytest.approx(0.5 * 1e-4 + 0.5 * 0.3 / 1008)
    learned = t.seconds_per_token
    t.step(9.0, {"c": 1000})  # too few tokens before: mostly fixed overhead
    t.step(20.0, {"d": 1000})  # nothing ran on from the previous step: it may have idled
    t.step(20.0, {"d": 1000})  # no time passed
    assert t.seconds_per_token == learned
    assert t.seconds(2000) == pytest.approx(2000 * learned)
    # Busy time: the intervals after which a request ran on (0.1 + 0.3 s),
    # not the gaps after which none did (the engine may have idled).
    assert t.busy_s == pytest.approx(0.4)
    t.step(20.5, {"d": 1})  # a decode step is busy time too
    assert t.busy_s == pytest.approx(0.9)
    with pytest.raises(ValueError, match="smoothing"):
        StepTimer(smoothing=0.0)


def test_a_due_branch_holds_back_only_a_prefill_it_would_queue_behind() -> None:
    """The window around a due return is the held prefill's own duration, as
    the engine's steps measure it, capped by ``lookahead_s``."""
    g = WarmFirstGate(
        AdmissionConfig(lookahead_s=2.5, block_size=64), AdmissionTrial(fixed_share=1.0)
    )
    assert g.lookahead(40) == 2.5  # untimed: the cap
    g.timer.step(0.0, {"a": 2048})  # the engine's timer, stepped by its owner
    g.timer.step(0.2, {"a": 2048})  # ~1e-4 s per token
    assert g.lookahead(40) == pytest.approx(40 * 64 * 0.2 / 2048)
    assert g.lookahead(10_000) == 2.5
    off = WarmFirstGate(AdmissionConfig(lookahead_s=0.0), timer=g.timer)
    assert off.lookahead(40) == 0.0
    g.arrived("cold", now=0.0)
    asked: list[float] = []
    assert g.defer("cold", 40, now=0.3, warm_return_due=lambda s: asked.append(s) or True)
    assert asked == [pytest.approx(0.25)]


@pytest.mark.parametrize(("seconds_per_step", "held"), [(0.001, False), (1.0, True)])
def test_the_engine_times_its_steps_for_the_gate(seconds_per_step: float, held: bool) -> None:
    """A branch due back 0.1 s ago holds a 30-block cold prefill on an engine
    that takes 1 s per 1,000 tokens (the prefill: ~0.5 s), not on one 1,000
    times faster (~0.5 ms: the branch is not coming back within it)."""
    timer = StepTimer()
    engine, clock, due = engine_with_a_retained_branch(timer)
    assert not engine.request_added("busy", None)
    engine.request_scheduled("busy")
    timer.step(due - 1.0, {"busy": 1000})
    clock.now = due - 1.0 + seconds_per_step
    timer.step(clock.now, {"busy": 1000})
    assert engine.request_added("c1", hinted(sid="cold"), prompt_blocks=30)
    clock.now = due + 0.1
    assert engine.defers("c1", 30) is held


def test_the_trial_learns_which_side_waits_less_and_keeps_probing_the_other() -> None:
    trial = AdmissionTrial(epoch=4, min_samples=8, seed=1)
    assert trial.gated_share == 0.5
    for _ in range(20):
        trial.record(True, 2.0)  # holding back made first tokens slower
        trial.record(False, 1.0)
    assert trial.gated_share == 0.125
    sides = [trial.assign() for _ in range(4000)]
    assert 0.05 < sum(sides) / len(sides) < 0.2  # mostly open, gated now and then
    assert all(len(set(sides[i : i + 4])) == 1 for i in range(0, 4000, 4))  # whole epochs
    for _ in range(200):
        trial.record(True, 0.5)  # the workload changed: now it pays
    assert trial.gated_share == 0.875


def test_a_request_on_the_open_side_is_never_held_back() -> None:
    g = WarmFirstGate(AdmissionConfig(), AdmissionTrial(fixed_share=0.0))
    g.arrived("cold", 0.0, 100, gated=False)
    g.arrived("warm", 0.0, 1, gated=False)
    assert not g.defer("cold", 100, now=0.1)
    g.arrived("cold2", 0.0, 100, gated=True)
    assert g.defer("cold2", 100, now=0.1)  # the cheap open-side one still goes first


def test_a_prefill_that_fits_one_step_is_never_held_back() -> None:
    g = WarmFirstGate(
        AdmissionConfig(block_size=64, step_tokens=2048), AdmissionTrial(fixed_share=1.0)
    )
    g.arrived("mid", 0.0, 30)  # 1,920 tokens: one step takes it beside the cheap one
    g.arrived("long", 0.0, 100)
    g.arrived("cheap", 0.0, 1)
    assert not g.defer("mid", 30, now=0.1)
    assert g.defer("long", 100, now=0.1)


def test_the_engine_reports_each_requests_wait_for_its_first_token_to_its_side() -> None:
    clock = ManualClock()
    trial = AdmissionTrial(fixed_share=1.0)
    e = EngineRetention(
        RetentionPolicy(PolicyConfig(total_blocks=100), clock=clock),
        FakeBlockPool(),
        WarmFirstGate(trial=trial),
        clock=clock,
    )

    class Progress:
        num_computed_tokens = 0
        num_prompt_tokens = 100

    progress = Progress()
    assert not e.request_added("plain", None, 2, progress)  # unhinted requests count too
    e.request_scheduled("plain")
    clock.now = 0.25
    e.step_scheduled({"plain": 60})  # prefill not done yet
    assert trial.mean_wait_s(True) is None
    progress.num_computed_tokens = 60
    clock.now = 0.5
    e.step_scheduled({"plain": 40})
    assert trial.mean_wait_s(True) == pytest.approx(0.5)
    e.step_scheduled({"plain": 1})  # a decode: counted once
    assert trial.mean_wait_s(True) == pytest.approx(0.5) and trial.mean_wait_s(False) is None
