"""Lowering a hint to the request fields vLLM already understands."""

from __future__ import annotations

from ._model import AgentHints
from .core import BODY_FIELD


def to_vllm_fields(hints: AgentHints) -> dict[str, object]:
    """``session_id`` (vLLM's own session key) and the hint inside ``kv_transfer_params``.

    kv_transfer_params travels untouched from the API server to the KV connector in the
    engine, which is where retention is decided.
    """
    fields: dict[str, object] = {} if hints.sid is None else {"session_id": hints.sid}
    fields["kv_transfer_params"] = {BODY_FIELD: hints.normalized()}
    return fields
