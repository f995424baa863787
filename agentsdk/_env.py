"""What every branch of one run shares (``RunEnv``), what the loop needs of a branch
(``Branch``) and the ``RunContext`` a run hands out (``BranchContext``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry.trace import Tracer

from hints_spec import (
    ROOT_BRANCH,
    ControlEvent,
)

from ._agent import Agent
from ._config import RunConfig
from ._context import RunContext
from ._control import ControlSender
from ._errors import (
    ModelCallLimitExceeded,
    RunLimitExceeded,
    UserError,
)
from ._items import (
    Message,
)
from ._latency import LatencyEstimator
from ._model import ModelClient
from ._result import RunResult
from ._scope import branch_slug, child_branch
from ._session import Session
from ._stream import (
    StreamEvent,
)
from ._tool import Tool
from ._tracing import (
    ClientMetrics,
)
from ._usage import Usage

__all__ = [
    "DEFAULT_MAX_TURNS",
    "FATAL",
    "Branch",
    "BranchContext",
    "RunEnv",
    "root_context",
    "system_prompt",
    "wire",
]


DEFAULT_MAX_TURNS = 10


# Errors that end the whole run rather than becoming a tool message for the model.
FATAL = (RunLimitExceeded, UserError)


class RunBranch(Protocol):
    """Runs one branch to its answer: ``_loop.run_agent``."""

    def __call__(
        self,
        context: BranchContext,
        prompt: list[Message],
        new_input: list[Message],
        max_turns: int,
        session: Session | None,
        /,
    ) -> Awaitable[RunResult]: ...


@dataclass(eq=False)
class RunEnv:
    """What every branch of one run shares: the client, the estimator, the event sinks."""

    client: ModelClient
    config: RunConfig
    emit: Callable[[StreamEvent], Awaitable[None]]
    session_id: str
    control: ControlSender | None
    estimator: LatencyEstimator
    tracer: Tracer
    metrics: ClientMetrics
    server: tuple[str, int] | None
    run_branch: RunBranch  # the loop (``_loop.run_agent``), for forks to run children
    capture_content: bool = False  # message content on chat spans (opted in)
    calls: int = 0
    _forks: dict[tuple[str, str], int] = field(default_factory=dict)

    def new_branch(self, parent: str, agent_name: str) -> str:
        """A deterministic child id (``child_branch``), n counting from 1 per parent."""
        slug = branch_slug(agent_name)
        n = self._forks[parent, slug] = self._forks.get((parent, slug), 0) + 1
        return child_branch(parent, slug, n)

    def count_call(self) -> None:
        """One more model call of the run; raises once ``max_model_calls`` are spent."""
        if self.calls >= self.config.max_model_calls:
            raise ModelCallLimitExceeded(self.config.max_model_calls)
        self.calls += 1

    def submit(self, events: Sequence[ControlEvent]) -> None:
        if self.control is not None:
            self.control.submit(self.session_id, events)

    async def delivered(self) -> None:
        """Wait until the events submitted so far are posted (each POST is bounded)."""
        if self.control is not None:
            await self.control.flush()


@dataclass(frozen=True, eq=False)
class Branch:
    """What the loop needs of one branch: its agent, what it renders and what it may call."""

    agent: Agent
    definitions: tuple[Tool, ...]  # rendered, in this order (the prompt's tool prefix)
    tools: dict[str, Tool]  # callable by name: a subset of definitions
    env: RunEnv


@dataclass(eq=False, kw_only=True)
class BranchContext(RunContext[Any]):
    """The ``RunContext`` a run hands out; ``Runner.fan_out`` finds its branch in it.

    ``_trace`` is the trace context of the branch's ``invoke_agent`` span, for the events
    sent once it has ended (the session's ``end``).
    """

    _branch: Branch = field(repr=False)
    _trace: otel_context.Context | None = field(default=None, repr=False)


def root_context(
    agent: Agent, model: str, session_id: str, user_context: Any, env: RunEnv
) -> BranchContext:
    tools = {t.name: t for t in agent.tools}
    return BranchContext(
        context=user_context,
        agent_name=agent.name,
        model=model,
        session_id=session_id,
        branch=ROOT_BRANCH,
        parent_branch=None,
        depth=0,
        usage=Usage(),
        _branch=Branch(agent, tuple(agent.tools), tools, env),
    )


def wire(branch: str) -> str | None:
    """Branch id as sent: the root branch is the protocol's default, so it is omitted."""
    return None if branch == ROOT_BRANCH else branch


def system_prompt(instructions: str | None) -> list[Message]:
    return [{"role": "system", "content": instructions}] if instructions else []
