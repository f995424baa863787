"""A request's Agent-Hints as vLLM's offloading code sees it: in ``kv_hints``.

The extension's connector lowers every hinted request to one
``agent-hints.session`` action in vLLM's own envelope (``Request.kv_hints``,
SPEC 5.2), so any vLLM component that reads ``kv_hints`` gets the hints in
vLLM's format. A policy running without that connector in front of it (a
``MultiConnector`` that lists vLLM's offloading first, or none at all) still
finds them in ``kv_transfer_params``, where the middleware puts them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import msgspec
from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope

from hints_spec import (
    KV_HINTS_ACTION_TYPE,
    KV_HINTS_PROTOCOL_VERSION,
    HintError,
    SessionAction,
    find_session_action,
    to_kv_hints_action,
)

from .._contract import read_hint_params

__all__ = ["lower_to_envelope", "session_action"]


def session_action(kv_hints: object, kv_transfer_params: object) -> SessionAction | None:
    """The request's session hint: its ``kv_hints`` action, else what the
    middleware lowered into ``kv_transfer_params``; None for an unhinted
    request or a malformed hint (served as unhinted, SPEC 5.2)."""
    if kv_hints is not None:
        try:
            found = find_session_action(msgspec.to_builtins(kv_hints))
        except (HintError, TypeError):
            found = None
        if found is not None:
            return found
    read = read_hint_params(kv_transfer_params)
    if read is None:
        return None
    return SessionAction(read.hints, read.tenant, None)


def lower_to_envelope(
    existing: KvHintsEnvelope | None, params: Mapping[str, Any] | None
) -> KvHintsEnvelope | None:
    """``existing`` with the hinted request's ``agent-hints.session`` action
    (from the middleware's ``kv_transfer_params``) in place of any action of
    that type it had: only the server sets the tenant, so an action of this
    type that came from elsewhere is dropped (SPEC 5.2). Other actions keep
    their order. None when there is nothing to carry."""
    read = read_hint_params(params)
    kept = [
        a for a in (existing.actions if existing else ()) if a.action_type != KV_HINTS_ACTION_TYPE
    ]
    if read is None:
        if existing is None or len(kept) == len(existing.actions):
            return existing
        return (
            KvHintsEnvelope(existing.protocol_version, existing.message_id, kept) if kept else None
        )
    action = to_kv_hints_action(read.hints, tenant=read.tenant)
    ours = KvHintAction(
        action_id=str(action["action_id"]),
        action_type=str(action["action_type"]),
        action_version=str(action["action_version"]),
        payload=dict(action["payload"]),  # type: ignore[call-overload]
    )
    if existing is None:
        return KvHintsEnvelope(KV_HINTS_PROTOCOL_VERSION, uuid.uuid4().hex, [ours])
    return KvHintsEnvelope(existing.protocol_version, existing.message_id, [*kept, ours])
