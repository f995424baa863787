"""Lifecycle callbacks, shaped like the OpenAI Agents SDK's ``RunHooks``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from openai.types.chat import ChatCompletion

from ._context import RunContext
from ._items import Message, ToolCall, ToolCallOutputItem
from ._result import RunResult
from ._stream import (
    AgentEndEvent,
    AgentStartEvent,
    ForkEvent,
    LLMEndEvent,
    LLMStartEvent,
    RunItemEvent,
    StreamEvent,
    ToolEndEvent,
    ToolStartEvent,
)

if TYPE_CHECKING:
    from ._agent import Agent
    from ._tool import Tool

__all__ = ["RunHooks", "dispatch"]


class RunHooks:
    """Override the callbacks you need; all are async no-ops by default.

    They run inline in the agent loop (a slow hook delays the run) and fire for every
    branch: ``context.branch`` tells sub-agents apart.
    """

    async def on_agent_start(self, context: RunContext, agent: Agent) -> None:
        """An agent starts on ``context.branch``."""

    async def on_llm_start(
        self, context: RunContext, agent: Agent, messages: list[Message]
    ) -> None:
        """A model call is about to be sent."""

    async def on_llm_end(self, context: RunContext, agent: Agent, response: ChatCompletion) -> None:
        """A model call returned."""

    async def on_tool_start(
        self, context: RunContext, agent: Agent, tool: Tool, call: ToolCall
    ) -> None:
        """A validated tool call starts."""

    async def on_tool_end(
        self, context: RunContext, agent: Agent, tool: Tool, result: ToolCallOutputItem
    ) -> None:
        """A tool call finished (``result.is_error`` for exceptions and timeouts)."""

    async def on_fork(self, context: RunContext, agent: Agent, children: list[str]) -> None:
        """Sub-agents fork from ``context.branch`` onto the branches ``children``."""

    async def on_end(self, context: RunContext, agent: Agent, result: RunResult) -> None:
        """An agent finished its branch."""


async def dispatch(hooks: RunHooks, event: StreamEvent) -> None:
    """Call the hook that matches ``event``."""
    context = event.context
    agent = context.agent
    match event:
        case AgentStartEvent():
            await hooks.on_agent_start(context, agent)
        case LLMStartEvent(messages=messages):
            await hooks.on_llm_start(context, agent, messages)
        case LLMEndEvent(response=response):
            await hooks.on_llm_end(context, agent, response)
        case ToolStartEvent(tool=tool, call=call):
            await hooks.on_tool_start(context, agent, tool, call)
        case ToolEndEvent(tool=tool, item=item):
            await hooks.on_tool_end(context, agent, tool, item)
        case ForkEvent(children=children):
            await hooks.on_fork(context, agent, children)
        case AgentEndEvent(result=result):
            await hooks.on_end(context, agent, result)
        case RunItemEvent():
            pass  # a stream-only view: the hooks see the same facts as llm/tool events
