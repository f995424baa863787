"""The run as its tools and hooks see it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic

from typing_extensions import TypeVar

from ._items import Message, ToolCall
from ._usage import Usage

__all__ = ["RunContext", "TContext"]

TContext = TypeVar("TContext", default=Any)
"""The type of the object passed as ``Runner.run(context=...)``."""


@dataclass(eq=False, kw_only=True)
class RunContext(Generic[TContext]):
    """What a tool (first parameter ``ctx: RunContext``) and a hook are given.

    ``context`` is the object passed to ``Runner.run(context=...)``, shared by every
    branch (the OpenAI Agents SDK's ``RunContextWrapper.context``). ``messages`` is the
    prompt of the branch's latest model call, system message included: what
    ``Runner.fan_out`` children start from so that their requests share the parent's
    cached prefix. ``usage`` counts this branch and its finished children. ``tool_call``
    is the call being run, in a tool and in the tool hooks (None elsewhere). ``depth``
    counts forks from the root branch (0).
    """

    context: TContext
    agent_name: str
    model: str
    session_id: str
    branch: str
    parent_branch: str | None
    depth: int
    usage: Usage
    messages: list[Message] = field(default_factory=list)
    tool_call: ToolCall | None = None
