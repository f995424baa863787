"""Lifecycle callbacks with the OpenAI Agents SDK's ``RunHooks`` signatures.

Hooks written for that SDK run here unchanged (``on_agent_start``, ``on_agent_end``,
``on_llm_start``, ``on_llm_end``, ``on_tool_start``, ``on_tool_end``); ``on_fork`` is
this SDK's own. There are no handoffs, so no ``on_handoff``.
"""

from __future__ import annotations

from typing import Any

from openai.types.chat import ChatCompletion

from ._agent import Agent
from ._context import RunContext
from ._items import Message
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
from ._tool import Tool

__all__ = ["RunHooks", "dispatch"]


class RunHooks:
    """Override the callbacks you need; all are async no-ops by default.

    They run inline in the agent loop (a slow hook delays the run) and fire for every
    branch: ``context.branch`` tells sub-agents apart. In the tool callbacks
    ``context.tool_call`` is the call (its id, name and raw arguments).
    """

    async def on_agent_start(self, context: RunContext[Any], agent: Agent) -> None:
        """An agent starts on ``context.branch``."""

    async def on_agent_end(self, context: RunContext[Any], agent: Agent, output: Any) -> None:
        """An agent finished its branch with ``output`` (its ``final_output``)."""

    async def on_llm_start(
        self,
        context: RunContext[Any],
        agent: Agent,
        system_prompt: str | None,
        input_items: list[Message],
    ) -> None:
        """A model call is about to be sent: the system prompt, then ``input_items``."""

    async def on_llm_end(
        self, context: RunContext[Any], agent: Agent, response: ChatCompletion
    ) -> None:
        """A model call returned."""

    async def on_tool_start(self, context: RunContext[Any], agent: Agent, tool: Tool) -> None:
        """A validated tool call starts."""

    async def on_tool_end(
        self, context: RunContext[Any], agent: Agent, tool: Tool, result: str
    ) -> None:
        """A tool call finished; ``result`` is what the model is told (``Error: ...`` for
        exceptions and timeouts)."""

    async def on_fork(self, context: RunContext[Any], agent: Agent, children: list[str]) -> None:
        """Sub-agents fork from ``context.branch`` onto the branches ``children``."""


async def dispatch(hooks: RunHooks, event: StreamEvent) -> None:
    """Call the hook that matches ``event``."""
    context, agent = event.context, event.agent
    match event:
        case AgentStartEvent():
            await hooks.on_agent_start(context, agent)
        case LLMStartEvent(messages=messages):
            system = messages[0] if messages and messages[0].get("role") == "system" else None
            prompt = system.get("content") if system is not None else None
            items = messages[1:] if system is not None else messages
            await hooks.on_llm_start(context, agent, prompt, items)
        case LLMEndEvent(response=response):
            await hooks.on_llm_end(context, agent, response)
        case ToolStartEvent(tool=tool):
            await hooks.on_tool_start(context, agent, tool)
        case ToolEndEvent(tool=tool, item=item):
            await hooks.on_tool_end(context, agent, tool, item.output)
        case ForkEvent(children=children):
            await hooks.on_fork(context, agent, children)
        case AgentEndEvent(result=result):
            await hooks.on_agent_end(context, agent, result.final_output)
        case RunItemEvent():
            pass  # a stream-only view: the hooks see the same facts as llm/tool events
