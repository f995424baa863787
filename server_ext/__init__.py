"""vLLM extension: agent hints become KV retention with deadlines, fork reuse and release.

Enable it with ``python -m server_ext serve MODEL [vllm args]``, or add the flags
that ``extension_flags()`` returns to your own vLLM launch. The retention policy
itself lives in ``server_ext.policy`` and has no vLLM import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._config import ExtensionConfig, ExtensionConfigError
from ._launcher import extension_flags, offloading_transfer, transfer_config, vllm_command
from ._local import LocalServer, ServerStartError, local_server, stop_local_servers
from ._testmodel import make_test_model

if TYPE_CHECKING:
    from ._middleware import AgentHintsMiddleware
    from .connector import AgentHintsConnector

__all__ = [
    "AgentHintsConnector",
    "AgentHintsMiddleware",
    "ExtensionConfig",
    "ExtensionConfigError",
    "LocalServer",
    "ServerStartError",
    "extension_flags",
    "local_server",
    "make_test_model",
    "offloading_transfer",
    "stop_local_servers",
    "transfer_config",
    "vllm_command",
]

_LAZY = {"AgentHintsConnector": ".connector", "AgentHintsMiddleware": "._middleware"}


def __getattr__(name: str) -> Any:
    # The middleware and the connector import vLLM; they load on first use, so clients, tests and
    # the policy import this package fast and without vLLM installed.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
