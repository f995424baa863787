"""Session and cache fields of other APIs, mapped onto the same hint model.

Servers honour what clients already send (vLLM, OpenAI, Anthropic, Dynamo) and let an
explicit ``Agent-Hints`` refine it key by key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from ._errors import HintError, HintErrorCode
from ._model import AgentHints, build_hints, trusted_hints

OTEL_CONVERSATION_ID: Final = "gen_ai.conversation.id"
SESSION_HEADER: Final = "X-Session-ID"
"""vLLM's session header, which routers with session affinity hash on (vllm-router's
``consistent_hash``): a client sends it with ``sid`` so a session stays on one instance."""

_DURATION = re.compile(r"([0-9]{1,6})([smh])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}
_IN_MEMORY = frozenset({"in_memory", "in-memory"})
_ANTHROPIC_DEFAULT_TTL = 300  # cache_control without ttl means Anthropic's 5 minutes
_DEFAULTS: Final = AgentHints().normalized()


def _duration(name: str, value: object) -> int:
    """``<n>s|m|h`` as in Anthropic's ``"5m"``/``"1h"`` and OpenAI's ``"24h"``."""
    match = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise HintError(HintErrorCode.WRONG_TYPE, f"{name} must look like 5m, 1h or 30s")
    return int(match[1]) * _UNIT_SECONDS[match[2]]


def _present(*values: object) -> object:
    """The first value that is set; an empty string counts as unset, as vLLM treats it."""
    return next((value for value in values if value is not None and value != ""), None)


def _ttl(body: Mapping[str, object]) -> int | None:
    retention = body.get("prompt_cache_retention")
    if retention is not None:
        if isinstance(retention, str) and retention in _IN_MEMORY:
            return None
        return _duration("prompt_cache_retention", retention)
    cache_control = body.get("cache_control")
    if cache_control is None:
        return None
    if not isinstance(cache_control, Mapping):
        raise HintError(HintErrorCode.WRONG_TYPE, "cache_control must be an object")
    ttl = cache_control.get("ttl")
    return _ANTHROPIC_DEFAULT_TTL if ttl is None else _duration("cache_control.ttl", ttl)


def from_interop(headers: Mapping[str, str], body: Mapping[str, object]) -> AgentHints | None:
    """The hint implied by other APIs' fields, or None when the request carries none.

    Session id sources, first set wins: ``X-Dynamo-Session-ID``, body ``session_id`` then
    ``X-Session-ID`` (vLLM's own order), body ``prompt_cache_key``. A Dynamo sub-agent
    session becomes a branch named by its own id whose parent branch is the parent id.
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    dynamo = _present(lowered.get("x-dynamo-session-id"))
    fields: dict[str, Any] = {
        "sid": _present(
            dynamo,
            body.get("session_id"),
            lowered.get(SESSION_HEADER.lower()),
            body.get("prompt_cache_key"),
        ),
        "ttl": _ttl(body),
    }
    parent = _present(lowered.get("x-dynamo-parent-session-id"))
    if dynamo is not None and parent is not None and parent != dynamo:
        fields["br"], fields["pbr"] = dynamo, parent
    final = _present(lowered.get("x-dynamo-session-final"))
    if final is not None:
        flag = final.strip().lower() if isinstance(final, str) else None
        if flag not in ("true", "false"):
            raise HintError(HintErrorCode.WRONG_TYPE, "X-Dynamo-Session-Final is true or false")
        fields["end"] = flag == "true"
    if all(value is None or value is False for value in fields.values()):
        return None
    return build_hints(fields)


def merge_hints(explicit: AgentHints | None, interop: AgentHints | None) -> AgentHints | None:
    """Key by key, a value the explicit hint sets (differs from its default) wins.

    br and pbr move together, so a merge can never pair one source's pbr with the
    other's br and break the pbr rules.
    """
    if explicit is None:
        return interop
    if interop is None:
        return explicit
    fields: dict[str, Any] = interop.normalized()
    for key, value in explicit.normalized().items():
        if value != _DEFAULTS[key]:
            fields[key] = value
    if explicit.br is not None:
        fields["pbr"] = explicit.pbr
    return trusted_hints(fields)
