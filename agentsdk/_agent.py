"""``Agent``: instructions, a model and tools; stateless, so one agent serves many runs."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from ._config import ModelSettings
from ._context import RunContext
from ._errors import ToolDefinitionError
from ._run import spawn
from ._tool import Tool, json_schema

__all__ = ["Agent"]

_TOOL_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


class _AgentToolInput(BaseModel):
    input: str = Field(description="The task for the agent, with everything it needs to know.")


@dataclass(frozen=True, kw_only=True)
class Agent:
    """An LLM with instructions and tools.

    ``instructions`` is the system prompt; it must not vary per request (no timestamps or
    ids), since it opens every prompt's cached prefix. ``model`` None means the model of
    the agent that runs this one as a sub-agent (the root agent needs one). Tools are
    rendered sorted by name, so their order never depends on how the list was built.
    """

    name: str
    instructions: str | None = None
    model: str | None = None
    tools: Sequence[Tool] = ()
    model_settings: ModelSettings = field(default_factory=ModelSettings)

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ToolDefinitionError(f"agent {self.name!r}: duplicate tool names {duplicates}")
        object.__setattr__(self, "tools", tuple(sorted(self.tools, key=lambda t: t.name)))

    def as_tool(
        self,
        name: str | None = None,
        description: str | None = None,
        *,
        fork_context: bool = False,
        max_turns: int | None = None,
        timeout: float | None = None,
        expected_seconds: float | None = None,
    ) -> Tool:
        """This agent as a tool of another: each call runs it on a new child branch.

        The child's requests carry the parent branch (``pbr``) and the parent sends a
        ``fork`` control event first. With ``fork_context`` the child starts from the
        caller's prompt (same system prompt, tools and history, so the server reuses the
        cached prefix) and gets this agent's instructions as a user message; otherwise it
        starts fresh with its own system prompt, like the OpenAI Agents SDK's ``as_tool``.
        """

        async def run(context: RunContext, arguments: BaseModel) -> object:
            assert isinstance(arguments, _AgentToolInput)
            [result] = await spawn(context, [(self, arguments.input)], fork_context, max_turns)
            return result.final_output

        return Tool(
            name=name or _TOOL_NAME_UNSAFE.sub("_", self.name)[:64] or "agent",
            description=description or f"Hand a task to the {self.name} agent; returns its answer.",
            parameters=json_schema(_AgentToolInput),
            args_model=_AgentToolInput,
            function=run,
            timeout=timeout,
            expected_seconds=expected_seconds,
        )
