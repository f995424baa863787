"""The hint as one action of vLLM's own hint envelope (SPEC.md section 5.2).

vLLM carries orchestrator hints on ``Request.kv_hints`` (a ``KvHintsEnvelope`` of
``KvHintAction``) all the way into the KV offloading layer's ``ReqContext.kv_hints``,
so a cache policy or a storage tier can read a session hint there without knowing
about ``kv_transfer_params``. This module works on the envelope's JSON form, the plain
dicts that ``msgspec.to_builtins(envelope)`` gives, because the protocol package has
no vLLM (nor msgspec) dependency; the server converts the dicts to vLLM's structs.

Every parser here raises :class:`HintError` and nothing else, like the rest of the
package, so a consumer treats a malformed action as no hint with one ``except``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final, NamedTuple

from ._body import parse_body
from ._errors import HintError, HintErrorCode
from ._model import AgentHints, check_optional_id
from .core import MAX_ID_LENGTH

__all__ = [
    "KV_HINTS_ACTION_TYPE",
    "KV_HINTS_ACTION_VERSION",
    "KV_HINTS_PROTOCOL_VERSION",
    "SessionAction",
    "find_session_action",
    "from_kv_hints_action",
    "to_kv_hints_action",
    "to_kv_hints_envelope",
]

KV_HINTS_PROTOCOL_VERSION: Final = "1"
"""The envelope's ``protocol_version`` this codec emits; vLLM's, never interpreted here."""
KV_HINTS_ACTION_TYPE: Final = "agent-hints.session"
KV_HINTS_ACTION_VERSION: Final = "1"
"""The action's version; a reader accepts any ``1.<minor>`` (minors only add members)."""

_DEFAULT_ACTION_ID: Final = "agent-hints"
_MAX_TENANT_LENGTH: Final = 2 * MAX_ID_LENGTH
"""256 characters: a server's tenant name (such as ``key:`` and a digest of the API
key) fits with room to spare, and a consumer keying tables by tenant stays bounded."""
_SERVER_MEMBERS: Final = ("tenant", "tool")
_VERSION_1 = re.compile(r"1(?:\.[0-9]{1,9})?").fullmatch


class SessionAction(NamedTuple):
    """What an ``agent-hints.session`` action says about its request."""

    hints: AgentHints
    """The hint, valid, as ``parse_body`` would give."""
    tenant: str | None
    """The tenant the server scoped the session to. Set by the server, never by a
    client: vLLM components reading ``kv_hints`` see no authentication, yet must key
    every session by tenant (SPEC.md section 8.1), so the tenant travels with the hint."""
    tool: str | None
    """The tool this branch waits on when the response ends in a tool call, if known."""


def _check_tenant(value: object) -> str | None:
    """An opaque name chosen by the server, so any characters; only its length is bounded."""
    if value is None:
        return None
    if type(value) is not str:
        raise HintError(HintErrorCode.WRONG_TYPE, "tenant must be a string")
    if not 0 < len(value) <= _MAX_TENANT_LENGTH:
        raise HintError(
            HintErrorCode.OUT_OF_RANGE, f"tenant must be 1-{_MAX_TENANT_LENGTH} characters"
        )
    return value


def to_kv_hints_action(
    hints: AgentHints,
    *,
    tenant: str | None = None,
    tool: str | None = None,
    action_id: str = _DEFAULT_ACTION_ID,
) -> dict[str, object]:
    """The ``KvHintAction`` (as a dict) that carries ``hints`` for ``tenant``.

    The payload is the normalized hint, so a consumer needs no defaults of its own, plus
    ``tenant`` and ``tool``. Both are checked here as :func:`from_kv_hints_action` checks
    them (``HintError`` otherwise), so this never emits an action its readers reject.
    """
    payload: dict[str, object] = hints.normalized()
    payload["tenant"] = _check_tenant(tenant)
    payload["tool"] = check_optional_id("tool", tool)
    return {
        "action_id": action_id,
        "action_type": KV_HINTS_ACTION_TYPE,
        "action_version": KV_HINTS_ACTION_VERSION,
        "payload": payload,
    }


def to_kv_hints_envelope(
    hints: AgentHints, *, message_id: str, tenant: str | None = None, tool: str | None = None
) -> dict[str, object]:
    """A ``KvHintsEnvelope`` (as a dict) holding only the hint's action.

    For a request that has no envelope yet; a request that has one gets the action of
    :func:`to_kv_hints_action` appended, as other actions must survive (SPEC.md 5.2).
    """
    return {
        "protocol_version": KV_HINTS_PROTOCOL_VERSION,
        "message_id": message_id,
        "actions": [to_kv_hints_action(hints, tenant=tenant, tool=tool)],
    }


def from_kv_hints_action(action: object) -> SessionAction:
    """Validate an ``agent-hints.session`` action in the order of SPEC.md section 5.2.

    The hint members of the payload are judged exactly as the body form is (the same
    codes, unknown members ignored, ``null`` as absent); ``action_id`` is not read.
    """
    if not isinstance(action, Mapping):
        raise HintError(HintErrorCode.WRONG_TYPE, "an action must be a JSON object")
    if action.get("action_type") != KV_HINTS_ACTION_TYPE:  # as an unknown event type (6.1)
        raise HintError(HintErrorCode.INVALID_EVENT, f"action_type must be {KV_HINTS_ACTION_TYPE}")
    version = action.get("action_version")
    if type(version) is not str:
        raise HintError(HintErrorCode.WRONG_TYPE, "action_version must be a string")
    if _VERSION_1(version) is None:  # first, as a later payload must not meet v1 rules
        raise HintError(HintErrorCode.UNSUPPORTED_VERSION, "only action_version 1 is defined")
    payload = action.get("payload")
    if not isinstance(payload, Mapping):
        raise HintError(HintErrorCode.WRONG_TYPE, "payload must be a JSON object")
    members = {key: value for key, value in payload.items() if key not in _SERVER_MEMBERS}
    hints = parse_body(members)
    tenant = _check_tenant(payload.get("tenant"))
    tool = check_optional_id("tool", payload.get("tool"))
    return SessionAction(hints, tenant, tool)


def find_session_action(envelope: object) -> SessionAction | None:
    """The first ``agent-hints.session`` action of an envelope, validated, else None.

    Other actions are skipped without a look at their payload: they belong to other
    components. An envelope that is not vLLM's shape (an object whose ``actions`` is an
    array of objects with a string ``action_type``) raises ``wrong_type``.
    """
    if envelope is None:
        return None
    if not isinstance(envelope, Mapping):
        raise HintError(HintErrorCode.WRONG_TYPE, "kv_hints must be a JSON object")
    actions = envelope.get("actions")
    if not isinstance(actions, list | tuple):
        raise HintError(HintErrorCode.WRONG_TYPE, "kv_hints.actions must be an array")
    for action in actions:
        if not isinstance(action, Mapping) or type(action.get("action_type")) is not str:
            raise HintError(HintErrorCode.WRONG_TYPE, "an action needs a string action_type")
        if action["action_type"] == KV_HINTS_ACTION_TYPE:
            return from_kv_hints_action(action)
    return None
