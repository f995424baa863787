"""Run events: one vocabulary for ``RunHooks`` callbacks and ``Runner.run_streamed``."""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from openai.types.chat import ChatCompletion

from ._context import RunContext
from ._items import Message, RunItem, ToolCall, ToolCallOutputItem
from ._result import RunResult

if TYPE_CHECKING:
    from ._tool import Tool

__all__ = [
    "AgentEndEvent",
    "AgentStartEvent",
    "ForkEvent",
    "LLMEndEvent",
    "LLMStartEvent",
    "RunItemEvent",
    "RunResultStreaming",
    "StreamEvent",
    "ToolEndEvent",
    "ToolStartEvent",
]


@dataclass(frozen=True, slots=True)
class AgentStartEvent:
    """An agent starts on a branch (the root run, or a sub-agent)."""

    context: RunContext


@dataclass(frozen=True, slots=True)
class LLMStartEvent:
    """A model call is about to be sent with ``messages``."""

    context: RunContext
    messages: list[Message]


@dataclass(frozen=True, slots=True)
class LLMEndEvent:
    """A model call returned."""

    context: RunContext
    response: ChatCompletion


@dataclass(frozen=True, slots=True)
class RunItemEvent:
    """A new item of the run: text, a tool call, or what the model is told about a call.

    Every ``RunResult.new_items`` entry is streamed as one of these as it happens,
    including the errors of calls that never ran (unknown tool, bad arguments).
    """

    context: RunContext
    item: RunItem


@dataclass(frozen=True, slots=True)
class ToolStartEvent:
    """A validated tool call starts running."""

    context: RunContext
    tool: Tool
    call: ToolCall


@dataclass(frozen=True, slots=True)
class ToolEndEvent:
    """A tool call finished; ``item`` is what the model will be told."""

    context: RunContext
    tool: Tool
    item: ToolCallOutputItem


@dataclass(frozen=True, slots=True)
class ForkEvent:
    """Sub-agents are about to start on the branches ``children``."""

    context: RunContext
    children: list[str]


@dataclass(frozen=True, slots=True)
class AgentEndEvent:
    """An agent finished its branch with ``result``."""

    context: RunContext
    result: RunResult


StreamEvent: TypeAlias = (
    AgentStartEvent
    | LLMStartEvent
    | LLMEndEvent
    | RunItemEvent
    | ToolStartEvent
    | ToolEndEvent
    | ForkEvent
    | AgentEndEvent
)


class RunResultStreaming:
    """Events of a run as they happen (``async for``), then its ``result``.

    Obtained from ``async with Runner.run_streamed(...) as stream``: the ``async with``
    owns the running agent, so leaving it early cancels the run instead of leaking it.
    Iteration ends when the run does and re-raises the run's error, if any.
    """

    def __init__(self) -> None:
        self._send: MemoryObjectSendStream[StreamEvent]
        self._send, self._receive = anyio.create_memory_object_stream[StreamEvent](math.inf)
        self._result: RunResult | None = None
        self._error: BaseException | None = None

    async def __aiter__(self) -> AsyncIterator[StreamEvent]:
        async for event in self._receive:
            yield event
        if self._error is not None:
            raise self._error

    @property
    def result(self) -> RunResult:
        """The run's result; raises the run's error, or RuntimeError while it is running."""
        if self._error is not None:
            raise self._error
        if self._result is None:
            raise RuntimeError("the run has not finished: iterate over the stream first")
        return self._result

    @property
    def is_complete(self) -> bool:
        return self._result is not None or self._error is not None

    def publish(self, event: StreamEvent) -> None:
        """Queue ``event`` for the reader; unbounded, so a slow reader never stalls the run."""
        with contextlib.suppress(anyio.BrokenResourceError):  # the reader left early
            self._send.send_nowait(event)

    async def drive(self, run: Callable[[], Awaitable[RunResult]]) -> None:
        """Run to completion, keeping the outcome for the reader, then close the stream."""
        with self._send:
            try:
                self._result = await run()
            except Exception as err:
                self._error = err
