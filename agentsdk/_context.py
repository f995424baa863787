"""The state a run shares with its tools, hooks and sub-agents."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hints_spec import MAX_ID_LENGTH

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from ._agent import Agent
    from ._config import RunConfig
    from ._items import Message
    from ._latency import LatencyEstimator
    from ._model import ControlSender, ModelClient
    from ._stream import StreamEvent
    from ._tool import Tool
    from ._usage import Usage

__all__ = ["RunContext", "RunEnv"]

_SLUG = re.compile(r"[^A-Za-z0-9._~-]+")


@dataclass(eq=False)
class RunEnv:
    """What every branch of one run shares: the client, the estimator, the event sinks."""

    client: ModelClient
    config: RunConfig
    emit: Callable[[StreamEvent], Awaitable[None]]
    control: ControlSender | None
    estimator: LatencyEstimator
    tracer: Tracer
    _forks: dict[tuple[str, str], int] = field(default_factory=dict)

    def new_branch(self, parent: str, agent_name: str) -> str:
        """A deterministic child id: ``{parent}/{agent}-{n}``, n counting from 1 per parent.

        Ids past the protocol's 128 characters (deep nesting) keep their last segment and
        a digest of the full path, so they stay unique and reproducible.
        """
        slug = _SLUG.sub("-", agent_name).strip("-")[:48] or "agent"
        n = self._forks[parent, slug] = self._forks.get((parent, slug), 0) + 1
        branch = f"{parent}/{slug}-{n}"
        if len(branch) > MAX_ID_LENGTH:
            branch = f"{slug}-{n}~{hashlib.sha256(branch.encode()).hexdigest()[:32]}"
        return branch


@dataclass(eq=False)
class RunContext:
    """The run as a tool sees it (declare a first parameter ``ctx: RunContext``).

    ``messages`` is the prompt of the branch's latest model call, system message
    included: what ``Runner.fan_out`` children start from so that their requests share
    the parent's cached prefix. ``usage`` counts this branch and its finished children.
    """

    agent: Agent
    model: str
    session_id: str
    branch: str
    parent_branch: str | None
    usage: Usage
    tools: Sequence[Tool]
    messages: list[Message] = field(default_factory=list)
    _env: RunEnv = field(repr=False, kw_only=True)
