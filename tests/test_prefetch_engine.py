"""Engine side of a prefetch warm-up: not a return, re-retains, cancelled by an end."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from server_ext._engine import HINTS_KEY, PREFETCH_FLAG, EngineRetention, hint_params
from server_ext.policy import BranchKey, PolicyConfig, RetentionPolicy

KEY = BranchKey("t", "s")
HINTS = {"sid": "s", "br": None, "gap": 10.0, "end": False, "prio": 3}


class Pool:
    def __init__(self) -> None:
        self.refs: Counter[int] = Counter()

    def hold(self, block_ids: Sequence[int]) -> None:
        self.refs.update(block_ids)

    def release(self, block_ids: Sequence[int]) -> None:
        self.refs.subtract(block_ids)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def engine() -> tuple[EngineRetention, Pool, Clock]:
    clock = Clock()
    pool = Pool()
    policy = RetentionPolicy(PolicyConfig(total_blocks=100, max_held_fraction=1.0), clock=clock)
    return EngineRetention(policy, pool), pool, clock


def params(prefetch: object = None) -> dict[str, object]:
    """A request's ``kv_transfer_params``, marked as a warm-up when ``prefetch``."""
    entry = dict(hint_params("t", HINTS)[HINTS_KEY])  # type: ignore[call-overload]
    if prefetch is not None:
        entry[PREFETCH_FLAG] = prefetch
    return {HINTS_KEY: entry}


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
    clock.now = 12.0
    run(e, "r2", [4, 5, 6, 7])  # the real return releases the warmed retention
    assert e.stats.returns == 1
    # The gap learned is the real one (12 s), not the time since the warm-up (3 s).
    estimate = e.policy.estimator.predict("t", "s", None, None)
    assert estimate.expected_s > 8.0


def test_end_while_warming_cancels_its_retention() -> None:
    e, pool, _ = engine()
    run(e, "r1", [1, 2])
    assert e.request_added("w1", params(prefetch=True))
    e.request_scheduled("w1")
    e.control({"tenant": "t", "sid": "s", "events": [{"type": "end"}]})
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
