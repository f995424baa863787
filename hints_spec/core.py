"""The protocol's plain core: names, limits, outcomes and lifecycle events, stdlib only.

Everything here is plain Python, so the retention policy, simulators and the
benchmarks share these definitions without the codec's validation layer. The
wire models (``AgentHints``, ``ToolStart`` ...) validate to these limits, and a
parsed control event lowers to its ``Event`` here with ``to_event``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

__all__ = [
    "BODY_FIELD",
    "CONTROL_PATH",
    "DEFAULT_PRIO",
    "HEADER_NAME",
    "MAX_CHILDREN",
    "MAX_EVENTS",
    "MAX_HEADER_BYTES",
    "MAX_ID_LENGTH",
    "MAX_MEMBERS",
    "MAX_PRIO",
    "MAX_SECONDS",
    "PROTOCOL_VERSION",
    "ROOT_BRANCH",
    "USER_TOOL",
    "EndEvent",
    "Event",
    "ForkEvent",
    "Outcome",
    "ToolEndEvent",
    "ToolStartEvent",
]

HEADER_NAME: Final = "Agent-Hints"
BODY_FIELD: Final = "agent_hints"
CONTROL_PATH: Final = "/v1/agent-hints/events"
PROTOCOL_VERSION: Final = 1
USER_TOOL: Final = "user"
"""The ``tool`` of a ``tool_start`` whose branch waits on its user (Section 6.3)."""
ROOT_BRANCH: Final = "root"
"""The branch a request names by omitting ``br``: a session's main line."""

MAX_ID_LENGTH: Final = 128
MAX_HEADER_BYTES: Final = 1024
MAX_MEMBERS: Final = 32
MAX_SECONDS: Final = 86400
MAX_PRIO: Final = 7
DEFAULT_PRIO: Final = 3
MAX_EVENTS: Final = 64
"""Events per control request."""
MAX_CHILDREN: Final = 64
"""Children per fork event."""


class Outcome(StrEnum):
    """What a server did with one hint or control event."""

    ACCEPTED = "accepted"
    CLIPPED = "clipped"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class ToolStartEvent:
    """A tool started on ``br``; ``eta`` is the client's gap estimate in seconds."""

    tool: str
    br: str | None = None
    eta: float | None = None


@dataclass(frozen=True, slots=True)
class ToolEndEvent:
    """The tool on ``br`` finished: its next request is imminent."""

    br: str | None = None


@dataclass(frozen=True, slots=True)
class ForkEvent:
    """``children`` branched from ``parent`` and reuse its prefix."""

    children: tuple[str, ...]
    parent: str | None = None


@dataclass(frozen=True, slots=True)
class EndEvent:
    """Branch ``br`` is finished; ``None`` or the root branch: the whole session."""

    br: str | None = None


Event = ToolStartEvent | ToolEndEvent | ForkEvent | EndEvent
"""A validated control event; a ``None`` branch means the root branch."""
