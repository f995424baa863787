"""Control events (between requests), mirrored from ``hints_spec`` without pydantic.

A ``None`` branch means the root branch; ending the root ends the session, as
the ``end`` hint does.
"""

from __future__ import annotations

from dataclasses import dataclass


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


ControlEvent = ToolStartEvent | ToolEndEvent | ForkEvent | EndEvent
