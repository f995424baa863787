"""What a run produces, as plain data.

Messages are the Chat Completions wire dicts (what sessions store and what the model is
sent back); run items are the typed view of the same events for callers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

__all__ = [
    "Message",
    "MessageOutputItem",
    "RunItem",
    "ToolCall",
    "ToolCallItem",
    "ToolCallOutputItem",
]

Message: TypeAlias = dict[str, Any]
"""One Chat Completions message (``{"role": ..., "content": ...}``), JSON-serialisable."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call as the model wrote it; ``arguments`` is the raw string, possibly garbage."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class MessageOutputItem:
    """Text the model wrote."""

    agent_name: str
    branch: str
    content: str


@dataclass(frozen=True, slots=True)
class ToolCallItem:
    """A tool call the model asked for."""

    agent_name: str
    branch: str
    call: ToolCall


@dataclass(frozen=True, slots=True)
class ToolCallOutputItem:
    """What the model was told about a tool call: the tool's output or the error."""

    agent_name: str
    branch: str
    call: ToolCall
    output: str
    is_error: bool
    duration: float


RunItem: TypeAlias = MessageOutputItem | ToolCallItem | ToolCallOutputItem
