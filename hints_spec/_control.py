"""The control endpoint: lifecycle events that happen between requests.

A request is judged in two layers: the envelope (version, session, event list) fails
as a whole, while each event fails alone, so one bad event never hides the others.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from ._errors import HintError, HintErrorCode
from ._model import (
    check_id,
    check_integer,
    check_optional_id,
    check_seconds,
)
from .core import (
    MAX_CHILDREN,
    MAX_EVENTS,
    PROTOCOL_VERSION,
    ROOT_BRANCH,
    EndEvent,
    Event,
    ForkEvent,
    Outcome,
    ToolEndEvent,
    ToolStartEvent,
)

RawEvent: TypeAlias = JsonValue
"""An event as received: validated one by one, after the envelope."""


def _required_id(kind: str, name: str, value: object) -> str:
    if value is None:
        raise HintError(HintErrorCode.INVALID_EVENT, f"{kind} needs {name}")
    return check_id(name, value)


def _optional_seconds(name: str, value: object) -> float | None:
    return None if value is None else check_seconds(name, value)


def _check_tool_start(m: Mapping[Any, object]) -> dict[str, Any]:
    return {
        "type": "tool_start",
        "br": check_optional_id("br", m.get("br")),
        "tool": _required_id("tool_start", "tool", m.get("tool")),
        "eta": _optional_seconds("eta", m.get("eta")),
    }


def _check_tool_end(m: Mapping[Any, object]) -> dict[str, Any]:
    return {
        "type": "tool_end",
        "br": check_optional_id("br", m.get("br")),
        "tool": check_optional_id("tool", m.get("tool")),
    }


def _check_fork(m: Mapping[Any, object]) -> dict[str, Any]:
    parent = check_optional_id("parent", m.get("parent"))
    children = m.get("children")
    if children is None:
        raise HintError(HintErrorCode.INVALID_EVENT, "fork needs children")
    if not isinstance(children, list | tuple):
        raise HintError(HintErrorCode.WRONG_TYPE, "children must be an array")
    if not children:
        raise HintError(HintErrorCode.OUT_OF_RANGE, "children must not be empty")
    if len(children) > MAX_CHILDREN:
        raise HintError(HintErrorCode.TOO_MANY_MEMBERS, f"more than {MAX_CHILDREN} children")
    ids = [check_id("children", child) for child in children]
    if len(set(ids)) != len(ids) or ROOT_BRANCH in ids or parent in ids:
        raise HintError(
            HintErrorCode.INVALID_COMBINATION, "children must be distinct, not root, not parent"
        )
    return {"type": "fork", "parent": parent, "children": ids}


def _check_end(m: Mapping[Any, object]) -> dict[str, Any]:
    return {"type": "end", "br": check_optional_id("br", m.get("br"))}


class _Event(BaseModel):
    """Shared plumbing: an event model validates with the same check as parse_control."""

    model_config = ConfigDict(frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: object) -> object:
        if not isinstance(data, Mapping):
            return data
        kind = cls.model_fields["type"].default
        if data.get("type", kind) != kind:
            raise HintError(HintErrorCode.INVALID_EVENT, f"type must be {kind}")
        return _EVENT_CHECKS[kind](data)


class ToolStart(_Event):
    """The branch is waiting on a tool expected to take ``eta`` seconds."""

    type: Literal["tool_start"] = "tool_start"
    br: str | None = None
    tool: str
    eta: float | None = None


class ToolEnd(_Event):
    """The tool returned: the branch's next request is imminent."""

    type: Literal["tool_end"] = "tool_end"
    br: str | None = None
    tool: str | None = None


class Fork(_Event):
    """``children`` branch off ``parent`` (the root when absent) and share its prefix."""

    type: Literal["fork"] = "fork"
    parent: str | None = None
    children: list[str]


class End(_Event):
    """The branch is done; without ``br`` the whole session is."""

    type: Literal["end"] = "end"
    br: str | None = None


ControlEvent: TypeAlias = Annotated[ToolStart | ToolEnd | Fork | End, Field(discriminator="type")]

_EVENT_TYPES: dict[str, type[ToolStart | ToolEnd | Fork | End]] = {
    "tool_start": ToolStart,
    "tool_end": ToolEnd,
    "fork": Fork,
    "end": End,
}
_EVENT_CHECKS: dict[str, Callable[[Mapping[Any, object]], dict[str, Any]]] = {
    "tool_start": _check_tool_start,
    "tool_end": _check_tool_end,
    "fork": _check_fork,
    "end": _check_end,
}


def _check_request(value: object) -> tuple[str, list[object]]:
    if not isinstance(value, Mapping):
        raise HintError(HintErrorCode.WRONG_TYPE, "a control request is a JSON object")
    v = value.get("v")
    if v is not None and check_integer("v", v) != PROTOCOL_VERSION:
        raise HintError(HintErrorCode.UNSUPPORTED_VERSION, "only v=1 is defined")
    sid = value.get("sid")
    if sid is None:
        raise HintError(HintErrorCode.BAD_ID, "sid is required")
    sid = check_id("sid", sid)
    events = value.get("events")
    if not isinstance(events, list):
        raise HintError(HintErrorCode.WRONG_TYPE, "events must be an array")
    if not events:
        raise HintError(HintErrorCode.OUT_OF_RANGE, "events must not be empty")
    if len(events) > MAX_EVENTS:
        raise HintError(HintErrorCode.TOO_MANY_MEMBERS, f"more than {MAX_EVENTS} events")
    return sid, events


class ControlRequest(BaseModel):
    """Body of ``POST /v1/agent-hints/events``; events stay raw, each is judged on its own."""

    model_config = ConfigDict(frozen=True)

    v: int = PROTOCOL_VERSION
    sid: str
    events: list[RawEvent]

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: object) -> object:
        if not isinstance(data, Mapping):
            return data
        sid, events = _check_request(data)
        return {"v": PROTOCOL_VERSION, "sid": sid, "events": events}


def to_event(event: ControlEvent) -> Event:
    """The plain form of a validated event, as the policy and the prefetcher read it."""
    if isinstance(event, ToolStart):
        return ToolStartEvent(tool=event.tool, br=event.br, eta=event.eta)
    if isinstance(event, ToolEnd):
        return ToolEndEvent(br=event.br)
    if isinstance(event, Fork):
        return ForkEvent(children=tuple(event.children), parent=event.parent)
    return EndEvent(br=event.br)


def _parse_event(raw: object) -> ControlEvent | HintError:
    kind = raw.get("type") if isinstance(raw, Mapping) else None
    if not isinstance(raw, Mapping) or not isinstance(kind, str) or kind not in _EVENT_TYPES:
        return HintError(HintErrorCode.INVALID_EVENT, "not an object with a known type")
    try:
        return _EVENT_TYPES[kind].model_construct(**_EVENT_CHECKS[kind](raw))
    except HintError as error:
        return error


def parse_control(value: object) -> tuple[str, list[ControlEvent | HintError]]:
    """The session id and, per event slot, the event or the error that rejects it.

    Raises HintError only when the envelope itself is invalid.
    """
    sid, events = _check_request(value)
    return sid, [_parse_event(event) for event in events]


class EventResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    outcome: Outcome
    reason: str | None = None


class ControlResponse(BaseModel):
    model_config = ConfigDict(frozen=True)

    v: int = PROTOCOL_VERSION
    results: list[EventResult]
