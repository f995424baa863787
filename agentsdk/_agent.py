"""``Agent``: instructions, a model and tools; stateless, so one agent serves many runs."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr, field_validator

from ._config import ModelSettings
from ._context import RunContext
from ._errors import UserError
from ._output import OutputSchema
from ._tool import Tool
from ._tool_schema import json_schema
from ._validated import Validated

__all__ = ["Agent", "AgentTool"]

_TOOL_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_HANDOFFS = (
    "handoffs are not supported (a new system prompt and tools would discard the cached"
    " prefix): give the other agent as a tool with other.as_tool(), or fork sub-agents with"
    " Runner.fan_out (docs/sdk.md, 'Handoffs')"
)


class _AgentToolInput(BaseModel):
    input: str = Field(description="The task for the agent, with everything it needs to know.")


class Agent(Validated):
    """An LLM with instructions and tools.

    ``instructions`` is the system prompt; it must not vary per request (no timestamps or
    ids), since it opens every prompt's cached prefix. ``model`` None means the model of
    the agent that runs this one as a sub-agent (the root agent needs one). Tools are
    rendered sorted by name, so their order never depends on how the list was built.
    ``output_type`` makes the final answer structured: the server is asked for JSON of its
    schema and ``RunResult.final_output`` is the validated value.
    """

    name: str = Field(min_length=1)
    instructions: str | None = None
    description: str | None = None
    model: str | None = Field(default=None, min_length=1)
    tools: Sequence[Tool] = ()
    model_settings: ModelSettings = Field(default_factory=ModelSettings)
    output_type: Any = None
    handoffs: Sequence[object] = ()
    _output: OutputSchema | None = PrivateAttr(default=None)

    @field_validator("tools", mode="before")
    @classmethod
    def _tools(cls, value: object) -> tuple[Tool, ...]:
        if not isinstance(value, list | tuple):
            raise ValueError(f"a list of tools expected, got {type(value).__name__}")
        for item in value:
            if not isinstance(item, Tool):
                name = getattr(item, "__name__", None)
                fix = (
                    f": decorate {name}() with @tool"
                    if callable(item) and name
                    else ": define it with agentsdk's @tool (tools of other SDKs do not mix)"
                )
                raise ValueError(f"{item!r:.60} is not a Tool{fix}")
        names = [t.name for t in value]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate tool names {duplicates}: give each a distinct name")
        return tuple(sorted(value, key=lambda t: t.name))

    @field_validator("handoffs")
    @classmethod
    def _no_handoffs(cls, value: Sequence[object]) -> Sequence[object]:
        if value:
            raise ValueError(_HANDOFFS)
        return value

    def model_post_init(self, context: Any) -> None:
        if self.output_type is not None and self.output_type is not str:
            self._output = OutputSchema(self.output_type)

    @property
    def output_schema(self) -> OutputSchema | None:
        """How the final answer is asked for and validated (None: plain text)."""
        return self._output

    def as_tool(
        self,
        name: str | None = None,
        description: str | None = None,
        *,
        fork_context: bool = False,
        recursive: bool = False,
        max_turns: int | None = None,
        timeout: float | None = None,
        expected_seconds: float | None = None,
    ) -> AgentTool:
        """This agent as a tool of another: each call runs it on a new child branch.

        The child's requests carry the parent branch (``pbr``) and the parent sends a
        ``fork`` control event first. With ``fork_context`` the child starts from the
        caller's prompt (same system prompt, tools and history, so the server reuses the
        cached prefix) and gets this agent's instructions as a user message; otherwise it
        starts fresh with its own system prompt, like the OpenAI Agents SDK's ``as_tool``.
        A forked child cannot call this tool itself unless ``recursive``.
        """
        for label, flag in (("fork_context", fork_context), ("recursive", recursive)):
            if not isinstance(flag, bool):
                raise UserError(f"as_tool({label}={flag!r}): True or False expected")
        if max_turns is not None and (
            not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1
        ):
            raise UserError(f"as_tool(max_turns={max_turns!r}): an int >= 1 or None expected")
        return AgentTool(
            name=name or _TOOL_NAME_UNSAFE.sub("_", self.name)[:64] or "agent",
            description=description
            or self.description
            or f"Hand a task to the {self.name} agent; returns its answer.",
            parameters=json_schema(_AgentToolInput),
            args_model=_AgentToolInput,
            function=_inside_a_run,
            timeout=timeout,
            expected_seconds=expected_seconds,
            agent=self,
            fork_context=fork_context,
            recursive=recursive,
            max_turns=max_turns,
        )


@dataclass(frozen=True, eq=False, kw_only=True)
class AgentTool(Tool):
    """``Agent.as_tool()``: the runner runs ``agent`` on a child branch for each call."""

    agent: Agent = field(repr=False)
    fork_context: bool = False
    recursive: bool = False
    max_turns: int | None = None

    def task(self, arguments: BaseModel) -> str:
        assert isinstance(arguments, _AgentToolInput)
        return arguments.input


async def _inside_a_run(context: RunContext[Any], arguments: BaseModel) -> object:
    raise UserError("an agent tool runs only inside Runner.run: it starts a sub-agent")
