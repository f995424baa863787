"""Warm-ups give way to real requests, on vLLM's own scheduler.

vLLM's scheduler runs in-process here (no model: the steps' outputs are made
up, one token per request), with the extension's connector as
``python -m server_ext serve`` configures it and prefetch on. The pool is small
enough that decoding requests outgrow it: vLLM must preempt. Its FCFS policy
takes the last running request, which is the real one admitted after a
warm-up; with the extension it takes the warm-up. And with a step budget of
one block, a warm-up's prefill spans steps: it sits out those of a real
request's prefill (vLLM would schedule the running warm-up first).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request
from vllm_scheduler import BLOCK, preempted, step
from vllm_scheduler import request as make_request
from vllm_scheduler import scheduler as make_scheduler

from hints_spec import AgentHints
from server_ext._contract import PREFETCH_KEY, hint_params


def scheduler(
    model_dir: Path, extension: bool, step_tokens: int = 256, headroom: bool = True
) -> Scheduler:
    extra = {"prefetch": True, "headroom": headroom} if extension else None
    return make_scheduler(model_dir, extra, step_tokens=step_tokens)


def request(name: str, seed: int, warmup: bool = False) -> Request:
    params = hint_params("default", AgentHints(sid=name, gap=5.0))
    if warmup:
        params[PREFETCH_KEY] = True
    return make_request(name, seed, kv_transfer_params=params)


@pytest.mark.parametrize("extension", [False, True], ids=["plain", "extension"])
def test_a_real_request_outgrowing_the_pool_preempts_the_warmup(
    test_model_dir: Path, extension: bool
) -> None:
    s = scheduler(test_model_dir, extension)
    s.add_request(request("first", 1))
    step(s)
    s.add_request(request("warmup", 2, warmup=True))
    step(s)
    s.add_request(request("late", 3))
    victims = set(preempted(s, 40))
    # Three requests of 3 prompt blocks grow past 11 blocks within 40 tokens.
    assert victims, "nothing was preempted: the pool is too large for the test"
    if extension:
        assert victims == {"warmup"}
    else:
        assert "late" in victims


def test_a_real_request_behind_a_running_warmup_waits_for_it(test_model_dir: Path) -> None:
    """The warm-up runs ahead: the real request sits out steps (vLLM passes over
    it) until the warm-up, growing too, is the one preempted. (Admission
    headroom would keep ``later`` waiting, and the pool from filling.)"""
    s = scheduler(test_model_dir, extension=True, headroom=False)
    s.add_request(request("warmup", 2, warmup=True))
    step(s)
    s.add_request(request("late", 3))
    s.add_request(request("later", 4))
    victims = set(preempted(s, 40))
    assert victims == {"warmup"}


@pytest.mark.parametrize("extension", [False, True], ids=["plain", "extension"])
def test_a_running_warmup_sits_out_the_steps_of_a_real_prefill(
    test_model_dir: Path, extension: bool
) -> None:
    s = scheduler(test_model_dir, extension, step_tokens=BLOCK)
    s.add_request(request("warmup", 2, warmup=True))
    assert step(s) == {"warmup": BLOCK}  # the first of its 3 prefill chunks
    s.add_request(request("real", 3))
    steps = [step(s) for _ in range(4)]
    if not extension:  # vLLM: the running warm-up first, it takes the budget
        assert steps[:2] == [{"warmup": BLOCK}] * 2
        return
    # The real request's 3 prefill chunks, then the warm-up resumes.
    assert steps[:3] == [{"real": BLOCK}] * 3
    assert steps[3].get("warmup") == BLOCK
