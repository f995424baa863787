"""What a run produces, as plain data.

Messages are the Chat Completions wire dicts (what sessions store and what the model is
sent back); run items are the typed view of the same events for callers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from ._errors import UserError

__all__ = [
    "AgentInput",
    "Message",
    "MessageOutputItem",
    "RunItem",
    "ToolCall",
    "ToolCallItem",
    "ToolCallOutputItem",
    "input_messages",
]

Message: TypeAlias = dict[str, Any]
"""One Chat Completions message (``{"role": ..., "content": ...}``), JSON-serialisable."""

AgentInput: TypeAlias = str | list[Message]
"""A user message, or messages to append to the conversation."""


def input_messages(input: object, where: str = "input") -> list[Message]:
    """``input`` as the messages it stands for; raises ``UserError`` for anything else."""
    if isinstance(input, str):
        return [{"role": "user", "content": input}]
    if isinstance(input, Mapping):
        raise UserError(f"{where}: a single message must be in a list: [{dict(input)!r:.80}]")
    if not isinstance(input, list | tuple):
        raise UserError(
            f"{where}: a str or a list of messages expected, got {type(input).__name__}"
        )
    for index, message in enumerate(input):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise UserError(
                f'{where}[{index}]: a message {{"role": ..., "content": ...}} expected,'
                f" got {message!r:.80}"
            )
    return [dict(message) for message in input]


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
