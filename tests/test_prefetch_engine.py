"""Engine side of retention: a prefetch warm-up (not a return, re-retains,
cancelled by an end), and what a fault in the policy leaves behind."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from hints_spec import AgentHints
from hints_spec.core import EndEvent, ForkEvent, ToolEndEvent, ToolStartEvent
from server_ext._contract import (
    PREFETCH_KEY,
    ControlMessage,
    HintedParams,
    RequestParams,
    control_params,
    hint_params,
    read_control,
    read_hint_params,
    read_params,
)
from server_ext._engine import EngineRetention
from server_ext._requests import RequestTable
from server_ext.policy import (
    AdmissionTrial,
    BranchKey,
    PolicyConfig,
    Release,
    ReleaseReason,
    RetentionPolicy,
    WarmFirstGate,
)
from server_ext.testing import FakeBlockPool, ManualClock

KEY = BranchKey("t", "s")
HINTS = AgentHints(sid="s", gap=10.0)


def engine(gate: WarmFirstGate | None = None) -> tuple[EngineRetention, FakeBlockPool, ManualClock]:
    clock = ManualClock()
    pool = FakeBlockPool()
    policy = RetentionPolicy(PolicyConfig(total_blocks=100, max_held_fraction=1.0), clock=clock)
    return EngineRetention(policy, pool, gate, clock=clock), pool, clock


def lowered(prefetch: object = None) -> dict[str, object]:
    """A request's ``kv_transfer_params``, marked as a warm-up when ``prefetch``."""
    params = hint_params("t", HINTS)
    if prefetch is not None:
        params[PREFETCH_KEY] = prefetch
    return params


def params(prefetch: object = None) -> HintedParams | None:
    """What the engine reads of ``lowered(prefetch)``."""
    return read_params(lowered(prefetch)).hinted


def _warmup(e: EngineRetention, request_id: str) -> bool:
    """Whether ``e``'s record of ``request_id`` is a warm-up's."""
    record = e.requests.get(request_id)
    return record is not None and record.warmup


def run(e: EngineRetention, request_id: str, blocks: list[int], prefetch: bool = False) -> None:
    assert e.request_added(request_id, params(True if prefetch else None))
    e.request_scheduled(request_id)
    e.request_finished(request_id, blocks)


def test_warmup_is_not_a_return_and_retains_again() -> None:
    e, pool, clock = engine()
    run(e, "r1", [1, 2, 3])
    e.make_room(3)  # evicted under pressure
    assert e.stats.held_blocks == 0
    clock.now = 9.0
    run(e, "w1", [4, 5, 6], prefetch=True)
    assert e.stats.returns == 0
    assert e.stats.held_blocks == 3 and pool.refs[4] == 1
    # It is the retention the branch had: due back 10 s after it left, not
    # 10 s after the warm-up.
    warmed = e.policy.retention(KEY)
    assert warmed is not None
    assert (warmed.plan.since, warmed.expected_return) == (0.0, pytest.approx(10.0))
    clock.now = 12.0
    run(e, "r2", [4, 5, 6, 7])  # the real return releases the warmed retention
    assert e.stats.returns == 1
    # The gap learned is the real one (12 s), not the time since the warm-up (3 s).
    estimate = e.policy.estimator.predict("t", "s", None, None)
    assert estimate.expected_s > 8.0


def test_retention_fills_the_record_the_connector_keeps_and_takes_it_off() -> None:
    clock = ManualClock()
    policy = RetentionPolicy(PolicyConfig(total_blocks=100, max_held_fraction=1.0), clock=clock)
    requests = RequestTable()
    e = EngineRetention(policy, FakeBlockPool(), clock=clock, requests=requests)
    control = requests.add("c", params=read_params(control_params("t", "s", [])))
    arrived = {rid: requests.add(rid) for rid in ("r1", "w1")}
    assert e.request_added("r1", params()) and e.request_added("w1", params(True))
    assert requests.get("r1") is arrived["r1"] and requests.get("w1") is arrived["w1"]
    assert (requests.real, requests.warmups) == (1, 1)
    assert arrived["r1"].key == KEY and arrived["w1"].warmup and not control.real
    e.request_scheduled("r1")
    e.request_scheduled("c")  # not retention's: no count moves
    assert requests.real_running == 1 and not control.running
    e.request_finished("r1", [1, 2])
    e.request_finished("w1", [1, 2])
    assert requests.get("r1") is None and requests.get("w1") is None
    assert (requests.real, requests.real_running, requests.warmups) == (0, 0, 0)
    assert requests.get("c") is control  # the connector takes control messages off


def test_end_while_warming_cancels_its_retention() -> None:
    e, pool, _ = engine()
    run(e, "r1", [1, 2])
    assert e.request_added("w1", params(prefetch=True))
    e.request_scheduled("w1")
    e.control(ControlMessage("t", "s", (EndEvent(),)))
    e.request_finished("w1", [1, 2, 3])
    assert e.stats.held_blocks == 0
    assert +pool.refs == Counter()


@pytest.mark.parametrize("flag", [False, "yes", 1])
def test_only_a_literal_true_marks_a_warmup(flag: object) -> None:
    e, _, _ = engine()
    run(e, "r1", [1])
    e.request_added("r2", params(flag))
    e.request_scheduled("r2")
    assert e.stats.returns == 1


def other_params(sid: str, gap: float, prefetch: bool = False) -> HintedParams | None:
    params = hint_params("t", AgentHints(sid=sid, gap=gap))
    if prefetch:
        params[PREFETCH_KEY] = True
    return read_hint_params(params)


def test_a_warmup_takes_room_only_from_branches_due_back_later() -> None:
    e, pool, clock = engine()
    run(e, "r1", [1, 2, 3])  # session s: gap 10 s, due back at ~10 s
    e.make_room(3)
    assert e.request_added("soon", other_params("soon", 2.0))
    e.request_finished("soon", [20, 21])  # due back at ~2 s: sooner than s
    assert e.request_added("late", other_params("late", 60.0))
    e.request_finished("late", [30, 31])  # due back at ~60 s
    clock.now = 1.0
    assert e.request_added("w1", params(prefetch=True))
    assert e.make_room(4, "w1")  # ``late`` gives way
    assert not e.make_room(4, "w1")  # ``soon`` does not
    assert pool.refs[20] == 1 and pool.refs[30] == 0
    # A real request of the same branch takes any room.
    assert e.request_added("r2", params())
    assert e.make_room(4, "r2") and pool.refs[20] == 0


def test_an_overdue_branchs_warmup_spares_a_branch_due_back_before_it() -> None:
    e, pool, clock = engine()
    run(e, "r1", [1, 2, 3])  # session s: gap 10 s, planned back at ~10 s
    e.make_room(3)
    clock.now = 29.0
    assert e.request_added("soon", other_params("soon", 4.0))
    e.request_finished("soon", [20, 21])  # due back at ~33 s
    clock.now = 30.0
    # Three times its planned gap away, s is now expected back after ``soon``.
    due = e.policy.next_return(KEY, 30.0)
    assert due is not None and due > 33.0
    assert e.request_added("w1", params(prefetch=True))
    assert not e.make_room(4, "w1")
    assert pool.refs[20] == 1


def test_an_arrived_request_keeps_its_branch_until_scheduled() -> None:
    e, pool, clock = engine()
    run(e, "r1", [1, 2, 3])
    assert e.request_added("other", other_params("o", 1.0))
    e.request_finished("other", [7, 8])
    clock.now = 2.0
    assert e.request_added("r2", params())  # queued behind a long prefill
    assert e.make_room(2)  # the other branch goes first, though due back sooner
    assert pool.refs[1] == 1 and pool.refs[7] == 0
    assert not e.make_room(2, "r2")  # its own prefix is spared
    e.request_scheduled("r2")
    assert pool.refs[1] == 0 and e.stats.returns == 1


def test_a_warmup_waits_rather_than_take_a_sooner_branchs_blocks() -> None:
    e, pool, clock = engine()
    run(e, "r1", [1, 2, 3])  # session s: due back at ~10 s
    e.make_room(3)
    assert e.request_added("soon", other_params("soon", 2.0))
    e.request_finished("soon", [20, 21])  # due back sooner than s
    assert e.request_added("late", other_params("late", 60.0))
    e.request_finished("late", [30, 31, 32])  # due back later than s
    clock.now = 1.0
    assert e.request_added("w1", params(prefetch=True))
    pool.free = 2
    assert not e.defers("w1", 5)  # 2 free + 3 of ``late``: it fits
    assert e.defers("w1", 6)  # it would need a block of ``soon``
    pool.free = 6
    assert not e.defers("w1", 6)


def test_a_warmup_beside_retention_by_eviction_order_fits_in_unprotected_blocks() -> None:
    """A ``ShelfPort`` gives no retention's blocks up for room: an allocation
    short of unprotected ones takes protected blocks in LRU order, whichever
    branch is due back first, so a warm-up waits for free ones instead."""
    e, pool, clock = engine()
    pool.releases_for_room = False
    assert e.request_added("late", other_params("late", 60.0))
    e.request_finished("late", [30, 31, 32])
    run(e, "r1", [1, 2, 3])
    e.make_room(3)
    clock.now = 1.0
    assert e.request_added("w1", params(prefetch=True))
    pool.free = 2
    assert not e.defers("w1", 2)
    assert e.defers("w1", 3)  # a HoldPort could take it from ``late``


@dataclass
class Progress:
    num_prompt_tokens: int
    num_computed_tokens: int = 0


def test_a_warmup_waits_while_a_real_request_waits_or_prefills() -> None:
    e, pool, _ = engine(WarmFirstGate(trial=AdmissionTrial(fixed_share=1.0)))
    pool.free = 100
    run(e, "r1", [1, 2, 3])
    e.make_room(3)
    assert e.request_added("w1", params(prefetch=True))
    assert not e.defers("w1", 3)
    real = Progress(num_prompt_tokens=256)
    assert e.request_added("x1", other_params("x", 5.0), 4, real)  # a real request queues
    assert e.defers("w1", 3)
    e.request_scheduled("x1")
    real.num_computed_tokens = 128
    assert e.defers("w1", 3)  # ... and prefills
    real.num_computed_tokens = 257
    assert not e.defers("w1", 3)  # ... and decodes: the warm-up runs beside it
    e.request_finished("x1", [9])
    assert not e.request_added("u1", None, 2, Progress(128))  # unhinted traffic counts too
    assert e.defers("w1", 3)
    e.request_finished("u1", [])
    assert read_params(control_params("t", "s", [])).hinted is None  # not traffic
    assert not e.defers("w1", 3)
    assert e.deferrals == 0  # the metric counts real requests held back only


def test_running_warmups_yield_a_step_to_a_real_request_that_arrives() -> None:
    e, _, _ = engine()
    assert e.request_added("w1", params(prefetch=True))
    assert _warmup(e, "w1") and not e.warmups_yield  # a warm-up is not a real request
    e.request_scheduled("w1")
    e.step_scheduled({"w1": 128})
    assert not e.warmups_yield
    real = Progress(num_prompt_tokens=300)
    assert e.request_added("x1", other_params("x", 5.0), 5, real)
    assert e.warmups_yield and not _warmup(e, "x1")  # the next step is the arrival's
    e.request_scheduled("x1")
    e.step_scheduled({"x1": 128, "u0": 1})
    assert e.warmups_yield  # it has prefill left after this step
    real.num_computed_tokens = 128
    e.step_scheduled({"x1": 128})
    assert e.warmups_yield
    real.num_computed_tokens = 256
    e.step_scheduled({"x1": 44})
    assert not e.warmups_yield  # its last prefill chunk is in this step
    real.num_computed_tokens = 300
    e.step_scheduled({"x1": 1, "w1": 128})
    assert not e.warmups_yield  # it decodes: the warm-up runs beside it


def test_warmups_run_on_when_a_real_request_cannot_be_scheduled() -> None:
    """A request short of blocks (or held by the gate) must not pause the
    warm-ups: the engine would idle, or wait on the blocks they hold."""
    e, _, _ = engine()
    assert e.request_added("w1", params(prefetch=True))
    assert not e.request_added("u1", None, 8, Progress(512))  # unhinted traffic counts
    assert e.warmups_yield
    e.step_scheduled({})  # the scheduler could not admit it
    assert not e.warmups_yield
    e.request_finished("u1", [])
    e.step_scheduled({"w1": 128})
    assert not e.warmups_yield


def test_a_request_of_unknown_progress_holds_warmups_until_it_finishes() -> None:
    e, pool, _ = engine()
    pool.free = 100
    assert e.request_added("w1", params(prefetch=True))
    assert not e.request_added("u1", None)
    e.request_scheduled("u1")
    assert e.defers("w1", 3)
    e.request_finished("u1", [])
    assert not e.defers("w1", 3)


def test_a_warmup_whose_branch_came_back_retains_nothing() -> None:
    e, pool, clock = engine()
    run(e, "r1", [1, 2, 3])
    e.make_room(3)
    clock.now = 9.0
    assert e.request_added("w1", params(prefetch=True))
    e.request_scheduled("w1")
    clock.now = 9.5
    assert e.request_added("r2", params())  # back while its warm-up runs
    e.request_scheduled("r2")
    e.request_finished("w1", [4, 5])  # aborted or done after the return
    assert e.stats.held_blocks == 0 and +pool.refs == Counter()
    e.request_finished("r2", [4, 5, 6])
    assert e.stats.held_blocks == 3


def test_a_warmup_keeps_what_its_branch_still_holds() -> None:
    e, pool, clock = engine()
    run(e, "r1", [1, 2, 3, 4])  # the prompt [1, 2, 3] and its response's block 4
    clock.now = 9.0
    run(e, "w1", [1, 2, 3], prefetch=True)  # the replayed prompt lacks the response
    held = e.policy.retention(KEY)
    assert held is not None and held.block_ids == (1, 2, 3, 4)
    assert +pool.refs == Counter({1: 1, 2: 1, 3: 1, 4: 1})


def test_a_warmup_cancelled_in_the_queue_changes_nothing() -> None:
    e, pool, clock = engine()
    run(e, "r1", [1, 2, 3])
    before = e.policy.retention(KEY)
    clock.now = 9.0
    assert e.request_added("w1", params(prefetch=True))
    e.request_finished("w1", [])  # aborted before it was scheduled
    assert e.policy.retention(KEY) is before
    assert +pool.refs == Counter({1: 1, 2: 1, 3: 1}) and e.stats.replacements == 0


def test_a_request_aborted_in_the_queue_leaves_its_branch_what_it_held() -> None:
    e, pool, clock = engine()
    run(e, "r1", [1, 2, 3])
    clock.now = 9.0
    assert e.request_added("r2", params())  # back, queued, then the client gives up
    e.request_finished("r2", [])
    held = e.policy.retention(KEY)
    assert held is not None and held.block_ids == (1, 2, 3) and held.arrived_at is None
    assert held.plan.since == 9.0  # away again from now
    assert +pool.refs == Counter({1: 1, 2: 1, 3: 1})


def test_a_warmup_that_ends_after_its_branch_arrived_keeps_it_the_last_victim() -> None:
    e, pool, clock = engine()
    run(e, "r1", [1, 2, 3])
    assert e.request_added("w1", params(prefetch=True))
    e.request_scheduled("w1")
    clock.now = 9.0
    assert e.request_added("r2", params())  # arrives (another API server) and queues
    e.request_finished("w1", [1, 2, 3])
    held = e.policy.retention(KEY)
    assert held is not None and held.arrived_at == 9.0
    assert e.request_added("other", other_params("o", 1.0))
    e.request_finished("other", [7, 8])
    assert e.make_room(2)  # the other branch goes first, though due back sooner
    assert pool.refs[1] == 1 and pool.refs[7] == 0


def test_a_warmup_whose_branch_is_not_expected_takes_no_room() -> None:
    e, pool, _ = engine()
    run(e, "r1", [1, 2, 3])  # session s, due back at ~10 s
    assert e.request_added("late", other_params("late", 100.0))
    e.request_finished("late", [30, 31, 32])
    assert e.request_added("w1", params(prefetch=True))
    e.control(ControlMessage("t", "s", (EndEvent(),)))  # s ended
    pool.free = 0
    assert e.defers("w1", 3)
    assert not e.make_room(3, "w1")
    assert pool.refs[30] == 1 and e.stats.held_blocks == 3


def warm_sessions(e: EngineRetention, clock: ManualClock, count: int, pay: bool) -> None:
    """``count`` new sessions, each warmed while away, then back while the
    warmed retention is held (``pay``) or ended first."""
    for i in range(count):
        sid, block = f"{'paid' if pay else 'wasted'}{i}", 1000 + 2 * i + 10_000 * pay
        assert e.request_added(f"{sid}-r", other_params(sid, 5.0))
        e.request_finished(f"{sid}-r", [block])
        assert e.request_added(f"{sid}-w", other_params(sid, 5.0, prefetch=True))
        e.request_scheduled(f"{sid}-w")
        e.request_finished(f"{sid}-w", [block, block + 1])
        if pay:
            assert e.request_added(f"{sid}-back", other_params(sid, 5.0))
            e.request_scheduled(f"{sid}-back")
        else:
            e.control(ControlMessage("t", sid, (EndEvent(),)))
        clock.now += 0.01


def test_warmed_retentions_are_scored_by_how_they_end() -> None:
    e, _, clock = engine()
    run(e, "r1", [1, 2])
    run(e, "w1", [1, 2, 3], prefetch=True)
    clock.now = 10.0
    run(e, "r2", [1, 2, 3, 4])  # back while held: the warm-up paid
    assert (e.stats.warmups_returned, e.stats.warmups_wasted) == (1, 0)
    warm_sessions(e, clock, 1, pay=False)  # released by the session's end first
    assert (e.stats.warmups_returned, e.stats.warmups_wasted) == (1, 1)
    # A warm-up that recomputed nothing the branch did not hold is not scored.
    run(e, "w2", [1, 2], prefetch=True)
    run(e, "r3", [1, 2, 3, 4, 5])
    assert (e.stats.warmups_returned, e.stats.warmups_wasted) == (1, 1)


def test_wasted_warmups_lose_the_right_to_evict_and_free_blocks_win_it_back() -> None:
    e, pool, clock = engine()
    run(e, "r1", [1, 2, 3])  # session s, due back at ~10 s
    e.make_room(3)
    assert e.request_added("late", other_params("late", 600.0))
    e.request_finished("late", [30, 31, 32])
    assert e.policy.warmups_take_room
    warm_sessions(e, clock, 6, pay=False)
    assert e.policy.prefetch_accuracy < 0.5 and not e.policy.warmups_take_room
    assert e.request_added("w1", params(prefetch=True))
    pool.free = 0
    assert e.defers("w1", 3)  # it would have to evict ``late``
    assert not e.make_room(3, "w1")
    assert pool.refs[30] == 1
    pool.free = 3
    assert not e.defers("w1", 3)  # free blocks are still its to use
    real = Progress(num_prompt_tokens=64, num_computed_tokens=65)
    assert e.request_added("x1", other_params("x", 5.0), 1, real)
    e.request_scheduled("x1")  # a real request decodes
    assert e.defers("w1", 3)  # ... so it waits for an idle engine
    e.request_finished("x1", [])
    assert not e.defers("w1", 3)
    e.request_scheduled("w1")
    e.request_finished("w1", [1, 2, 3])
    warm_sessions(e, clock, 20, pay=True)  # warm-ups on free blocks that pay win it back
    assert e.policy.warmups_take_room


def test_warmups_always_take_room_at_a_minimum_accuracy_of_zero() -> None:
    clock = ManualClock()
    config = PolicyConfig(total_blocks=100, max_held_fraction=1.0, prefetch_min_accuracy=0.0)
    e = EngineRetention(RetentionPolicy(config, clock=clock), FakeBlockPool(), None, clock=clock)
    run(e, "r1", [1, 2, 3])
    e.make_room(3)
    assert e.request_added("late", other_params("late", 600.0))
    e.request_finished("late", [30, 31, 32])
    warm_sessions(e, clock, 10, pay=False)
    assert e.request_added("w1", params(prefetch=True))
    assert e.make_room(3, "w1")


@pytest.mark.parametrize(
    "bad", [{"pbr": ["x"]}, {"ttl": "60"}, {"gap": True}, {"prio": 9}, {"br": 7}]
)
def test_a_malformed_lowered_hint_is_no_hint(bad: dict[str, object]) -> None:
    # The middleware lowers only valid hints; the engine does not rely on it: a
    # hint it cannot use must neither fault half-way (leaving the policy holding
    # blocks the pool never took) nor reach the policy.
    e, pool, clock = engine()
    malformed = lowered()
    malformed["agent_hints"] = {**AgentHints(sid="s", gap=10.0).normalized(), **bad}
    read = read_params(malformed)
    assert read == RequestParams()
    assert not e.request_added("r1", read.hinted)
    e.request_scheduled("r1")
    e.request_finished("r1", [1, 2, 3])
    clock.now = 1000.0
    e.step_scheduled({})
    assert e.faults == 0 and e.stats.held_blocks == 0 and +pool.refs == Counter()
    assert all(v >= 0 for v in pool.refs.values())


@pytest.mark.parametrize("raw", [0, 7, "x", ["a"], {1: 2}, None])
def test_kv_transfer_params_that_are_not_a_mapping_are_no_hint(raw: object) -> None:
    # vLLM lets a client set kv_transfer_params to a scalar through vllm_xargs:
    # it must neither fault (a fault drops every tenant's retentions) nor count.
    e, _, _ = engine()
    run(e, "r1", [1, 2])
    read = read_params(raw)
    assert read == RequestParams()
    assert not e.request_added("x", read.hinted)
    e.request_scheduled("x")
    e.request_finished("x", [5])
    assert e.faults == 0 and e.stats.retained_branches == 1


def retain_two(e: EngineRetention) -> None:
    run(e, "r1", [1, 2, 3])
    assert e.request_added("r2", other_params("s2", 10.0))
    e.request_scheduled("r2")
    e.request_finished("r2", [1, 2, 4])  # shares blocks 1 and 2 with r1
    assert e.stats.retained_branches == 2


def test_a_policy_fault_drops_every_retention_and_gives_each_reference_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    e, pool, _ = engine()
    retain_two(e)
    assert pool.refs == Counter({1: 2, 2: 2, 3: 1, 4: 1})
    holds = e.stats.holds

    def half_done(now: float | None = None) -> list[object]:
        e.policy._table.retentions.popitem()  # stops half-way through an update
        raise RuntimeError("policy bug")

    monkeypatch.setattr(e.policy, "expire", half_done)
    e.step_scheduled({})  # contained: the engine step goes on
    assert e.faults == 1
    assert +pool.refs == Counter() and min(pool.refs.values()) == 0  # each once
    assert e.stats.retained_branches == 0 and e.stats.held_blocks == 0
    assert e.stats.holds == holds  # counters carry on: metrics never go back
    monkeypatch.undo()
    run(e, "r3", [7, 8])  # and the next hint retains again
    assert pool.refs[7] == 1 and e.stats.retained_branches == 1


def test_a_release_of_a_reference_never_held_is_refused_before_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    e, pool, _ = engine()
    retain_two(e)
    bogus = Release(BranchKey("t", "s"), [3, 9], ReleaseReason.EXPIRED)
    monkeypatch.setattr(e.policy, "expire", lambda now=None: [bogus])
    e.step_scheduled({})
    assert e.faults == 1
    # Block 9 was never held: releasing it would have freed a block some request
    # owns. Nothing of the bad batch reached the pool; recovery gave back the rest.
    assert +pool.refs == Counter() and min(pool.refs.values()) == 0


def test_a_pool_that_fails_during_recovery_still_leaves_the_engine_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    e, pool, _ = engine()
    retain_two(e)

    def broken(block_ids: Sequence[int]) -> None:
        raise RuntimeError("block pool bug")

    monkeypatch.setattr(pool, "release", broken)
    monkeypatch.setattr(e.policy, "expire", lambda now=None: 1 / 0)
    e.step_scheduled({})  # neither the fault nor the failed recovery escapes
    assert e.faults == 1 and e.stats.retained_branches == 0


def test_a_control_message_reaches_the_engine_as_the_plain_events_sent() -> None:
    events = (
        ToolStartEvent(tool="build", br="b", eta=3.0),
        ToolEndEvent(br="b"),
        ForkEvent(children=("c1", "c2"), parent="b"),
        EndEvent(),
    )
    params = control_params("t", "s", events, learned=True)
    json.loads(json.dumps(params))  # what vLLM carries between processes
    assert read_control(params) == ControlMessage("t", "s", events, learned=True)
    params["agent_hints_control"]["events"].append({"type": "nap"})  # type: ignore[index]
    assert read_control(params) == ControlMessage("t", "s", (*events, None), learned=True)
