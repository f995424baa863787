"""Admission headroom, on vLLM's own scheduler (in-process, no model).

A request decodes in a pool that another, admitted beside it, would fill: vLLM
admits the second (its prompt fits the free blocks now), and a few steps later
the first needs a block and vLLM preempts the second, throwing its prefill
away. The extension's headroom is armed by that preemption: the next time, the
second waits until the first is done, and nothing is preempted. Unarmed,
admission is vLLM's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from vllm.v1.core.sched.scheduler import Scheduler
from vllm_scheduler import BLOCK, preempted, request, scheduler, step

from server_ext._headroom import (
    ARMED_ADMISSIONS,
    MAX_ARMED_ADMISSIONS,
    Headroom,
    blocks_to_grow,
)

CONFIGS = {"plain": None, "extension": {}, "no-headroom": {"headroom": False}}


def _fill_the_pool(s: Scheduler, round_: int) -> set[str]:
    """The scenario once: the requests vLLM preempted (each finishes)."""
    first = request(f"first-{round_}", 10 * round_ + 1, prompt_blocks=3, max_tokens=20)
    s.add_request(first)
    while first.num_output_tokens == 0:
        step(s)  # its prefill: 3 blocks; its decode needs a 4th, then a 5th
    s.add_request(request(f"second-{round_}", 10 * round_ + 2, prompt_blocks=7, max_tokens=20))
    victims = set(preempted(s, 60))
    assert not s.running and not s.waiting, "every request finishes"
    return victims


@pytest.mark.parametrize("step_tokens", [256, 2 * BLOCK], ids=["one-step-prefill", "chunked"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_after_a_preemption_an_admission_that_fills_the_pool_is_held_back(
    test_model_dir: Path, config: str, step_tokens: int
) -> None:
    """Chunked, the second's first chunk and the first's next block fit: vLLM
    checks the second's whole prompt, and the headroom is added to that too."""
    s = scheduler(test_model_dir, CONFIGS[config], step_tokens=step_tokens)  # 11 usable blocks
    assert _fill_the_pool(s, 1) == {"second-1"}, "unarmed, admission is vLLM's"
    again = _fill_the_pool(s, 2)
    if config == "extension":
        assert again == set()
    else:
        assert again == {"second-2"}


def test_an_admission_that_loads_from_a_tier_keeps_the_room_unarmed(test_model_dir: Path) -> None:
    """Blocks loaded from a tier are admitted whole in one step, where plain
    vLLM would prefill them chunk by chunk: the extension's own doing, so such
    an admission leaves the running request its room before any preemption;
    the same admission computed is vLLM's."""
    s = scheduler(test_model_dir, {})
    first = request("first", 1, prompt_blocks=3, max_tokens=20)
    s.add_request(first)
    while first.num_output_tokens == 0:
        step(s)  # it holds 3 of the 11 usable blocks and will need 2 more
    second, loaded = request("second", 2, prompt_blocks=7, max_tokens=20), 4 * BLOCK
    manager = s.kv_cache_manager
    assert manager.allocate_slots(second, 3 * BLOCK, num_external_computed_tokens=loaded) is None
    assert manager.allocate_slots(second, 7 * BLOCK) is not None


def test_a_request_needing_the_whole_pool_is_admitted_alone(test_model_dir: Path) -> None:
    s = scheduler(test_model_dir, {})
    s.add_request(request("whole", 1, prompt_blocks=10, max_tokens=8))
    assert step(s) == {"whole": 10 * BLOCK}


@dataclass
class _Running:
    request_id: str
    num_prompt_tokens: int
    num_tokens: int
    max_tokens: int | None


@pytest.mark.parametrize(
    ("prompt", "tokens", "max_tokens", "allocated", "step_tokens", "grow"),
    [
        (48, 49, 20, 4, 256, 1),  # decoding: its next block
        (48, 49, 16, 4, 256, 0),  # ... unless max_tokens ends it inside its blocks
        (128, 128, 20, 3, 256, 6),  # mid-prefill: the rest of its prompt, then a block
        (128, 128, 20, 3, 32, 3),  # a long prefill: its next step's chunk, then a block
        (48, 70, None, 5, 256, 1),  # no max_tokens: one block ahead
        (48, 49, 20, 9, 256, 0),  # holds more than it needs
    ],
)
def test_blocks_to_grow(
    prompt: int, tokens: int, max_tokens: int | None, allocated: int, step_tokens: int, grow: int
) -> None:
    running = _Running("r", prompt, tokens, max_tokens)
    assert blocks_to_grow(running, allocated, BLOCK, step_tokens) == grow


@dataclass
class _AsyncRunning(_Running):
    """A request as vLLM 0.33 holds it under async scheduling and speculation."""

    num_tokens_with_spec: int = 0
    num_output_placeholders: int = 0


def test_blocks_to_grow_counts_what_vllm_allocates_ahead() -> None:
    """Under async scheduling a step in flight adds output placeholders; with
    speculative decoding draft tokens and lookahead slots: vLLM allocates for
    each, so the headroom keeps room for them too (one block per running
    request too little otherwise)."""
    decoding = _Running("r", 48, 63, None)  # one slot left in its 4th block
    assert blocks_to_grow(decoding, 4, BLOCK, 256) == 1
    in_flight = _AsyncRunning("r", 48, 63, None, num_tokens_with_spec=63, num_output_placeholders=2)
    assert blocks_to_grow(in_flight, 4, BLOCK, 256) == 2
    drafting = _AsyncRunning("r", 48, 63, None, num_tokens_with_spec=66)
    assert blocks_to_grow(drafting, 4, BLOCK, 256) == 2
    assert blocks_to_grow(decoding, 4, BLOCK, 256, lookahead=BLOCK) == 2


def test_headroom_is_summed_once_a_step_and_grows_with_admissions() -> None:
    held = {"a": 4, "b": 3}
    headroom = Headroom(BLOCK, 256, held.__getitem__)
    running = [_Running("a", 48, 49, 20), _Running("b", 48, 48, 20)]
    assert headroom.reserve(running) == 0, "unarmed"
    assert headroom.reserve(running, loads=True) == 1 + 1, "unarmed, for a tier's load"
    headroom.new_step()
    headroom.short()
    assert headroom.reserve(running) == 1 + 1
    running.append(_Running("c", 48, 48, 20))
    assert headroom.reserve(running) == 2, "summed at the step's first admission"
    held["c"] = 3
    headroom.admitted(running[-1])
    assert headroom.reserve(running) == 3
    headroom.new_step()
    held["a"] = 5
    assert headroom.reserve(running) == 2


def test_the_armed_window_counts_admissions_and_grows_while_shortfalls_recur() -> None:
    headroom = Headroom(BLOCK, 256, lambda _: 4)
    newcomer = _Running("n", 48, 48, 20)

    def admit(count: int) -> None:
        for _ in range(count):
            headroom.admitted(newcomer)

    assert not headroom.armed
    headroom.short()
    assert (headroom.armed_for, headroom.window) == (ARMED_ADMISSIONS, ARMED_ADMISSIONS)
    admit(ARMED_ADMISSIONS - 1)
    assert headroom.armed
    admit(1)
    assert not headroom.armed, "the window ended"
    admit(ARMED_ADMISSIONS - 1)
    headroom.new_step()
    headroom.short()  # soon after: the workload keeps needing it
    assert headroom.armed_for == headroom.window == 2 * ARMED_ADMISSIONS
    headroom.short()  # the same step: vLLM preempting until one fits
    assert headroom.window == 2 * ARMED_ADMISSIONS
    headroom.new_step()
    headroom.short()  # while armed: longer still
    assert headroom.window == 4 * ARMED_ADMISSIONS
    for _ in range(10):
        headroom.new_step()
        headroom.short()
    assert headroom.window == MAX_ARMED_ADMISSIONS
    admit(MAX_ARMED_ADMISSIONS + MAX_ARMED_ADMISSIONS)
    headroom.new_step()
    headroom.short()  # long after the last window: it starts over
    assert headroom.armed_for == headroom.window == ARMED_ADMISSIONS
