"""vLLM's scheduler in-process, with the extension's connector or without.

No model runs: a step's outputs are made up, one token per scheduled request.
The pool is ``blocks`` blocks of ``BLOCK`` tokens (one is vLLM's null block),
small enough that decoding requests outgrow it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

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

from server_ext._config import CONNECTOR_MODULE, CONNECTOR_NAME
from server_ext.tier import TierConfig, kv_role

BLOCK = 16


def scheduler(
    model_dir: Path,
    extra: Mapping[str, object] | None,
    *,
    step_tokens: int = 256,
    blocks: int = 12,
) -> Scheduler:
    """vLLM's scheduler; with the extension's connector configured by ``extra``
    (its ``kv_connector_extra_config``: device only, unless it names a tier of
    the connector's own, Mooncake) unless that is None."""
    transfer = (
        KVTransferConfig(
            kv_connector=CONNECTOR_NAME,
            kv_connector_module_path=CONNECTOR_MODULE,
            kv_role=kv_role(TierConfig.from_mapping({"tier": "none", **extra})),
            kv_connector_extra_config={"tier": "none", **extra},
        )
        if extra is not None
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
    config.cache_config.num_gpu_blocks = blocks
    kv_cache = KVCacheConfig(
        num_blocks=blocks,
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


def request(
    name: str,
    seed: int,
    *,
    prompt_blocks: int = 3,
    max_tokens: int = 100,
    kv_transfer_params: Mapping[str, object] | None = None,
) -> Request:
    """A request of ``prompt_blocks`` full blocks of tokens drawn from ``seed``."""
    prompt = [(seed * 131 + i * 7) % 1900 + 8 for i in range(prompt_blocks * BLOCK)]
    init_none_hash(sha256)
    extra_args = {"kv_transfer_params": dict(kv_transfer_params)} if kv_transfer_params else None
    return Request(
        request_id=name,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args
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
    """Run ``steps`` steps; the requests waiting after a preemption, each step."""
    for _ in range(steps):
        step(s)
        yield from (r.request_id for r in s.waiting if r.num_preemptions)
