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

from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from hints_spec import AgentHints
from server_ext._config import CONNECTOR_MODULE, CONNECTOR_NAME
from server_ext._engine import PREFETCH_KEY, hint_params

BLOCK = 16
BLOCKS = 12  # one is vLLM's null block


def scheduler(model_dir: Path, extension: bool, step_tokens: int = 256) -> Scheduler:
    transfer = (
        KVTransferConfig(
            kv_connector=CONNECTOR_NAME,
            kv_connector_module_path=CONNECTOR_MODULE,
            kv_role="kv_producer",
            kv_connector_extra_config={"prefetch": True},
        )
        if extension
        else None
    )
    config = VllmConfig(
        model_config=ModelConfig(model=str(model_dir), max_model_len=512, dtype="float32"),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=step_tokens,
            max_model_len=512,
            is_encoder_decoder=False,
        ),
        kv_transfer_config=transfer,
    )
    config.cache_config.num_gpu_blocks = BLOCKS
    kv_cache = KVCacheConfig(
        num_blocks=BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=config.model_config.dtype
                ),
            )
        ],
    )
    return Scheduler(
        vllm_config=config,
        kv_cache_config=kv_cache,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
        log_stats=True,
    )


def request(name: str, seed: int, warmup: bool = False) -> Request:
    prompt = [(seed * 131 + i * 7) % 1900 + 8 for i in range(3 * BLOCK)]
    params = hint_params("default", AgentHints(sid=name, gap=5.0))
    if warmup:
        params[PREFETCH_KEY] = True
    init_none_hash(sha256)
    return Request(
        request_id=name,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(
            max_tokens=100, ignore_eos=True, extra_args={"kv_transfer_params": params}
        ),
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK, sha256),
    )


def step(s: Scheduler) -> dict[str, int]:
    """One engine step; the tokens it scheduled per request."""
    out = s.schedule()
    ids = list(out.num_scheduled_tokens)
    runner = ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[[11] for _ in ids],
    )
    s.update_from_output(out, runner)
    return dict(out.num_scheduled_tokens)


def preempted(s: Scheduler, steps: int) -> Iterator[str]:
    for _ in range(steps):
        step(s)
        yield from (r.request_id for r in s.waiting if r.num_preemptions)


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
    it) until the warm-up, growing too, is the one preempted."""
    s = scheduler(test_model_dir, extension=True)
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
