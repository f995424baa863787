"""Hints for pydantic-ai agents (``pip install 'agent-hints[pydantic-ai]'``).

One line: ``Agent(model, capabilities=[AgentHintsCapability(client)])`` (or the same in
``agent.run(..., capabilities=[...])``), with the openai client of the model's provider.
pydantic-ai's own ``conversation_id`` (given, inherited from ``message_history``, or
generated per run) becomes the hint session; each model request, streamed or not
(``run``, ``run_stream``, ``run_stream_events``, ``iter``), carries it and ``gap`` (the
expected wait on the tools it offers); each tool call is reported as ``tool_start`` (with
an ETA) and ``tool_end``; a run ends with the wait on the user (a conversation may
continue), or the session's ``end`` with ``end_session=True``.

An agent run from a tool of a hinted run (delegation: ``helper.run(..., usage=ctx.usage)``)
is a sub-agent: a child branch of the calling run's branch in the same session, announced
by a ``fork`` delivered before its first request and ended (``end``) when it returns. A
run inside another active ``hint_scope`` joins that scope's session.

A ``HintedAsyncOpenAI`` carries the hints through its ``hint_scope``; a plain client gets
them as request headers. Importing this module imports ``pydantic_ai``; ``agentsdk``
itself never does.
"""

from __future__ import annotations

import dataclasses
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from openai import AsyncOpenAI, OpenAI
from pydantic_ai import RunContext
from pydantic_ai.capabilities import (
    AbstractCapability,
    WrapRunHandler,
    WrapToolExecuteHandler,
)
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import ToolDefinition

from hints_spec import ROOT_BRANCH, ControlEvent, End, Fork, ToolEnd, ToolStart

from .._client import HintedAsyncOpenAI, HintedOpenAI, hint_headers
from .._config import DEFAULT_USER_WAIT_PRIOR
from .._control import ControlChannel
from .._errors import UserError
from .._latency import LatencyEstimator, user_wait
from .._scope import branch_slug, child_branch, current_hints, hint_scope, session_id_for

__all__ = ["AgentHintsCapability"]


@dataclass(eq=False)
class _Branch:
    """A hinted run's session and branch, and how many sub-agents it started per name."""

    sid: str
    branch: str
    counts: dict[str, int] = field(default_factory=dict)

    def child(self, name: str) -> _Branch:
        slug = branch_slug(name)
        n = self.counts[slug] = self.counts.get(slug, 0) + 1
        return _Branch(self.sid, child_branch(self.branch, slug, n))


# The hinted run whose tool is running here: an agent run started now is its sub-agent.
_CALLER: ContextVar[_Branch | None] = ContextVar("agentsdk_pydantic_ai_caller", default=None)
# The hinted run of this context (its tools' caller).
_RUN: ContextVar[_Branch | None] = ContextVar("agentsdk_pydantic_ai_run", default=None)


class AgentHintsCapability(AbstractCapability[Any]):
    """A pydantic-ai capability that tells the server the run's session and tool waits.

    ``estimator`` learns tool durations across runs (the ETAs and ``gap`` it sends).
    """

    def __init__(
        self,
        client: OpenAI | AsyncOpenAI,
        *,
        estimator: LatencyEstimator | None = None,
        end_session: bool = False,
    ) -> None:
        if not isinstance(client, OpenAI | AsyncOpenAI):
            raise UserError(
                f"AgentHintsCapability: client must be an openai client (the provider's),"
                f" got {type(client).__name__}"
            )
        self.estimator = estimator if estimator is not None else LatencyEstimator()
        self.end_session = end_session
        self._channel = ControlChannel(client)
        self._headers = not isinstance(client, HintedOpenAI | HintedAsyncOpenAI)

    async def wrap_run(
        self, ctx: RunContext[Any], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        caller, ambient = _CALLER.get(), current_hints()
        if caller is not None:  # delegated from a tool of a hinted run: a sub-agent
            name = getattr(ctx.agent, "name", None) or "agent"
            run = caller.child(name)
            self._channel.submit(
                run.sid, [Fork(parent=_wire(caller.branch), children=[run.branch])]
            )
            await self._channel.flush()  # before the sub-agent's first request
            scope = hint_scope(session=run.sid, branch=run.branch, parent=caller.branch)
            last: list[ControlEvent] = [End(br=run.branch)]
        elif ambient is not None and ambient.sid is not None:  # the scope's session
            run = _Branch(ambient.sid, ambient.br or ROOT_BRANCH)
            scope, last = hint_scope(), []
        else:
            run = _Branch(session_id_for(ctx.conversation_id or ctx.run_id or "run"), ROOT_BRANCH)
            scope, last = hint_scope(session=run.sid, branch=None), [self._last_word()]
        tokens = (_RUN.set(run), _CALLER.set(None))
        try:
            with scope:
                return await handler()
        finally:
            _CALLER.reset(tokens[1])
            _RUN.reset(tokens[0])
            if last:
                self._channel.submit(run.sid, last)
            await self._channel.flush()

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        """Put ``gap`` in the request's scope. Set here, not around the handler: pydantic-ai
        carries what this hook sets over to the task that opens a streamed request."""
        tools = request_context.model_request_parameters.function_tools
        gap = self.estimator.estimate({t.name: None for t in tools})
        hints = hint_scope(gap=round(gap, 3) if gap is not None else None).__enter__()
        if self._headers:
            settings: dict[str, Any] = dict(request_context.model_settings or {})
            settings["extra_headers"] = {
                **hint_headers(hints),
                **settings.get("extra_headers", {}),
            }
            request_context = dataclasses.replace(
                request_context,
                model_settings=settings,  # type: ignore[arg-type]
            )
        return request_context

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        run = _RUN.get()
        eta = self.estimator.estimate({tool_def.name: None})
        if run is not None:
            start = ToolStart(br=_wire(run.branch), tool=tool_def.name, eta=round(eta or 0.0, 3))
            self._channel.submit(run.sid, [start])
        started = time.monotonic()
        token = _CALLER.set(run)
        try:
            return await handler(args)
        finally:
            _CALLER.reset(token)
            self.estimator.observe(tool_def.name, time.monotonic() - started)
            if run is not None:
                self._channel.submit(run.sid, [ToolEnd(br=_wire(run.branch), tool=tool_def.name)])

    def _last_word(self) -> ToolStart | End:
        if self.end_session:
            return End()
        return user_wait(self.estimator, DEFAULT_USER_WAIT_PRIOR)


def _wire(branch: str) -> str | None:
    """Branch id as sent: the root branch is the protocol's default, so it is omitted."""
    return None if branch == ROOT_BRANCH else branch
