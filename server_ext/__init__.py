"""vLLM extension: agent hints become KV retention with deadlines, fork reuse and release.

Enable it with ``python -m server_ext serve MODEL [vllm args]``, or add the flags
that ``extension_flags()`` returns to your own vLLM launch. The retention policy
itself lives in ``server_ext.policy`` and has no vLLM import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._config import ExtensionConfig, ExtensionConfigError
from ._testmodel import make_test_model

if TYPE_CHECKING:
    from ._launcher import extension_flags, vllm_command
    from ._middleware import AgentHintsMiddleware

__all__ = [
    "AgentHintsMiddleware",
    "ExtensionConfig",
    "ExtensionConfigError",
    "extension_flags",
    "make_test_model",
    "vllm_command",
]

_LAZY = {
    "AgentHintsMiddleware": "._middleware",
    "extension_flags": "._launcher",
    "vllm_command": "._launcher",
}


def __getattr__(name: str) -> Any:
    # vLLM-importing names load on first use, so the policy and the test model
    # stay importable (and fast) without vLLM installed.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
