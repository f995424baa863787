"""Run events: one vocabulary for ``RunHooks`` callbacks and ``Runner.run_streamed``."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeAlias

import anyio
from anyio.abc import TaskGroup
from openai.types.chat import ChatCompletion

from ._agent import Agent
from ._context import RunContext
from ._errors import UserError
from ._items import Message, RunItem, ToolCall, ToolCallOutputItem
from ._result import RunResult
from ._tool import Tool

__all__ = [
    "AgentEndEvent",
    "AgentStartEvent",
    "ForkEvent",
    "LLMEndEvent",
    "LLMStartEvent",
    "Publish",
    "RunItemEvent",
    "RunResultStreaming",
    "StreamEvent",
    "ToolEndEvent",
    "ToolStartEvent",
]


@dataclass(frozen=True, slots=True)
class AgentStartEvent:
    """An agent starts on a branch (the root run, or a sub-agent)."""

    context: RunContext[Any]
    agent: Agent


@dataclass(frozen=True, slots=True)
class LLMStartEvent:
    """A model call is about to be sent with ``messages`` (system prompt included)."""

    context: RunContext[Any]
    agent: Agent
    messages: list[Message]


@dataclass(frozen=True, slots=True)
class LLMEndEvent:
    """A model call returned."""

    context: RunContext[Any]
    agent: Agent
    response: ChatCompletion


@dataclass(frozen=True, slots=True)
class RunItemEvent:
    """A new item of the run: text, a tool call, or what the model is told about a call.

    Every ``RunResult.new_items`` entry is streamed as one of these as it happens,
    including the errors of calls that never ran (unknown tool, bad arguments).
    """

    context: RunContext[Any]
    agent: Agent
    item: RunItem


@dataclass(frozen=True, slots=True)
class ToolStartEvent:
    """A validated tool call starts running (``context.tool_call`` is ``call``)."""

    context: RunContext[Any]
    agent: Agent
    tool: Tool
    call: ToolCall


@dataclass(frozen=True, slots=True)
class ToolEndEvent:
    """A tool call finished; ``item`` is what the model will be told."""

    context: RunContext[Any]
    agent: Agent
    tool: Tool
    item: ToolCallOutputItem


@dataclass(frozen=True, slots=True)
class ForkEvent:
    """Sub-agents are about to start on the branches ``children``."""

    context: RunContext[Any]
    agent: Agent
    children: list[str]


@dataclass(frozen=True, slots=True)
class AgentEndEvent:
    """An agent finished its branch with ``result``."""

    context: RunContext[Any]
    agent: Agent
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

Publish: TypeAlias = Callable[[StreamEvent], None]


class RunResultStreaming:
    """Events of a run as they happen, then its ``result``: ``Runner.run_streamed``'s.

    Two ways to drive it. ``async with Runner.run_streamed(...) as stream:`` then
    ``async for event in stream``: the block owns the running agent, so leaving it early
    cancels the run instead of leaking it. Or, as in the OpenAI Agents SDK, ``stream =
    Runner.run_streamed(...)`` then ``async for event in stream.stream_events()``: the run
    starts with the iteration, in a task of the running asyncio loop, and is cancelled
    when the iteration is closed (or by ``cancel()``). Iteration ends when the run does
    and re-raises the run's error, if any.
    """

    def __init__(self, run: Callable[[Publish], Awaitable[RunResult]]) -> None:
        self._run = run
        self._send, self._receive = anyio.create_memory_object_stream[StreamEvent](math.inf)
        self._result: RunResult | None = None
        self._error: BaseException | None = None
        self._group: TaskGroup | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RunResultStreaming:
        self._claim()
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        self._group.start_soon(self._drive)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._group is not None
        self._group.cancel_scope.cancel()  # no-op once the run is over
        # The run's own errors are kept for the reader: the group only ever sees a
        # cancellation, and the caller's exception (if any) propagates as itself.
        try:
            await self._group.__aexit__(None, None, None)
        finally:
            self._receive.close()  # events nobody read are dropped with it

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self.stream_events()

    async def stream_events(self) -> AsyncIterator[StreamEvent]:
        """The run's events in order (starting the run if no ``async with`` did)."""
        owned = self._group is None and self._task is None
        if owned:
            self._claim()
            self._task = asyncio.get_running_loop().create_task(self._drive())
        try:
            with contextlib.suppress(anyio.ClosedResourceError):  # iterated before
                async for event in self._receive:
                    yield event
        finally:
            self._receive.close()  # one iteration per stream (a later one sees none)
            if owned:
                await self.cancel()
        if self._error is not None:
            raise self._error

    async def cancel(self) -> None:
        """Stop a run started by ``stream_events`` (an ``async with`` stops its own)."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def result(self) -> RunResult:
        """The run's result; raises the run's error, or RuntimeError while it is running."""
        if self._error is not None:
            raise self._error
        if self._result is None:
            raise RuntimeError("the run has not finished: iterate over the stream first")
        return self._result

    @property
    def final_output(self) -> Any:
        """``result.final_output``."""
        return self.result.final_output

    @property
    def is_complete(self) -> bool:
        return self._result is not None or self._error is not None

    def _claim(self) -> None:
        if self._group is not None or self._task is not None:
            raise UserError(
                "this stream is already running: use either `async with` or stream_events(),"
                " once per Runner.run_streamed(...) call"
            )

    def _publish(self, event: StreamEvent) -> None:
        """Queue ``event`` for the reader; unbounded, so a slow reader never stalls the run."""
        with contextlib.suppress(anyio.BrokenResourceError):  # the reader left early
            self._send.send_nowait(event)

    async def _drive(self) -> None:
        """Run to completion, keeping the outcome for the reader, then close the stream."""
        with self._send:
            try:
                self._result = await self._run(self._publish)
            except Exception as err:
                self._error = err
