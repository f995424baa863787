"""The contract between the API server and the engine core: what travels in
``kv_transfer_params``, written by one side and read by the other.

No vLLM import and no engine state: the middleware (API server), the prefetcher,
the connector, the offloading tier's cache policy and the tests all read it.

``kv_transfer_params`` is the only request field that reaches the connector
untouched. An inference request carries ``HINTS_KEY`` = the normalized hint and
``TENANT_KEY`` = the tenant the API server resolved (``hint_params``), and
``PREFETCH_KEY: true`` on the prefetcher's own warm-ups; a control message
carries ``CONTROL_KEY`` = ``{"tenant", "sid", "events"}`` (``control_params``;
``"learned": true`` when the API server wrote the events from its own response,
not the client). The middleware strips all four keys from client bodies first
(``RESERVED_KEYS``), so only it can set them. The engine reads them back with
``read_hint_params`` and ``read_control``, validating again: it never trusts
its input to keep its block accounting whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from hints_spec import BODY_FIELD, AgentHints, HintError, parse_body
from hints_spec.core import EndEvent, Event, ForkEvent, ToolEndEvent, ToolStartEvent

__all__ = [
    "CONTROL_KEY",
    "HINTS_KEY",
    "PREFETCH_KEY",
    "RESERVED_KEYS",
    "TENANT_KEY",
    "ControlMessage",
    "HintedParams",
    "RequestParams",
    "control_params",
    "hint_params",
    "read_control",
    "read_hint_params",
    "read_params",
    "without_hints",
]

HINTS_KEY = BODY_FIELD
TENANT_KEY = "agent_hints_tenant"
PREFETCH_KEY = "agent_hints_prefetch"
CONTROL_KEY = "agent_hints_control"
RESERVED_KEYS = (HINTS_KEY, TENANT_KEY, PREFETCH_KEY, CONTROL_KEY)


def hint_params(tenant: str, hints: AgentHints) -> dict[str, object]:
    """The ``kv_transfer_params`` members of a hinted request of ``tenant``."""
    return {HINTS_KEY: hints.normalized(), TENANT_KEY: tenant}


class HintedParams(NamedTuple):
    """What the engine reads of a hinted request's ``kv_transfer_params``."""

    tenant: str
    hints: AgentHints
    """The hint, valid, with a session (``sid`` is set)."""
    prefetch: bool


def without_hints(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``params`` without a hinted request's members (a control message's
    stays): what an engine should see of a request it will never serve."""
    if params is None:
        return None
    return {k: v for k, v in params.items() if k not in (HINTS_KEY, TENANT_KEY, PREFETCH_KEY)}


def read_hint_params(params: object) -> HintedParams | None:
    """The hint, tenant and warm-up flag of a request's ``kv_transfer_params``
    (anything a client could make it), or None if it has no usable hint (no
    session, not lowered by the middleware, not even a mapping).

    The hint is validated again with the codec (a few microseconds): the
    middleware lowers only valid hints, but the engine must not trust its
    input to keep its block accounting whole.
    """
    if not isinstance(params, Mapping) or not params:
        return None
    raw, tenant = params.get(HINTS_KEY), params.get(TENANT_KEY)
    if not isinstance(tenant, str):
        return None
    try:
        hints = parse_body(raw)
    except HintError:
        return None
    if hints.sid is None:
        return None
    return HintedParams(tenant, hints, params.get(PREFETCH_KEY) is True)


@dataclass(frozen=True, slots=True)
class ControlMessage:
    """A control message as the engine reads it: ``tenant``'s session
    ``sid``, its events (None where one is not an event), and whether the
    API server ``learned`` them from a response rather than the client."""

    tenant: str
    sid: str
    events: tuple[Event | None, ...]
    learned: bool = False


_EVENT_TYPES: dict[str, type[Event]] = {
    "tool_start": ToolStartEvent,
    "tool_end": ToolEndEvent,
    "fork": ForkEvent,
    "end": EndEvent,
}
_TYPE_NAMES = {cls: name for name, cls in _EVENT_TYPES.items()}


def _wire(event: Event) -> dict[str, object]:
    fields = {k: v for k, v in dataclasses.asdict(event).items() if v is not None}
    if isinstance(event, ForkEvent):
        fields["children"] = list(event.children)
    return {"type": _TYPE_NAMES[type(event)], **fields}


def _event(raw: object) -> Event | None:
    if not isinstance(raw, Mapping):
        return None
    cls = _EVENT_TYPES.get(raw.get("type"))  # type: ignore[arg-type]
    if cls is None:
        return None
    fields = {k: v for k, v in raw.items() if k != "type"}
    if "children" in fields:
        fields["children"] = tuple(fields["children"])
    try:
        return cls(**fields)
    except TypeError:
        return None


def control_params(
    tenant: str, sid: str, events: Sequence[Event], learned: bool = False
) -> dict[str, object]:
    """The ``kv_transfer_params`` of a control message (no inference);
    ``learned``: the API server's own ``tool_start`` from a response's tool
    calls, which gives way to the client's."""
    wire = [_wire(event) for event in events]
    message: dict[str, object] = {"tenant": tenant, "sid": sid, "events": wire}
    if learned:
        message["learned"] = True
    return {CONTROL_KEY: message}


@dataclass(frozen=True, slots=True)
class RequestParams:
    """What the engine reads of one request's ``kv_transfer_params``, once on
    arrival: a control message, or else a hinted request's hint (neither: an
    unhinted request)."""

    hinted: HintedParams | None = None
    control: ControlMessage | None = None


def read_params(params: object) -> RequestParams:
    """The one reading of a request's ``kv_transfer_params`` that the
    scheduler side keeps for the request's life."""
    control = read_control(params)
    if control is not None:
        return RequestParams(control=control)
    return RequestParams(hinted=read_hint_params(params))


def read_control(params: object) -> ControlMessage | None:
    """The control message in a request's ``kv_transfer_params``, if it is one."""
    if not isinstance(params, Mapping):
        return None
    control = params.get(CONTROL_KEY)
    if not isinstance(control, Mapping):
        return None
    tenant, sid, events = control.get("tenant"), control.get("sid"), control.get("events")
    if not (isinstance(tenant, str) and isinstance(sid, str) and isinstance(events, list)):
        return None
    return ControlMessage(
        tenant, sid, tuple(_event(raw) for raw in events), control.get("learned") is True
    )
