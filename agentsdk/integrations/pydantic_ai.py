"""Hints for pydantic-ai agents (``pip install 'agent-hints[pydantic-ai]'``).

One line: ``Agent(model, capabilities=[AgentHintsCapability(client)])`` (or the same in
``agent.run(..., capabilities=[...])``), with the openai client of the model's provider.
pydantic-ai's own ``conversation_id`` (given, inherited from ``message_history``, or
generated per run) becomes the hint session; each model request carries it and ``gap``
(the expected wait on the tools it offers); each tool call is reported as ``tool_start``
(with an ETA) and ``tool_end``; a run ends with the wait on the user (a conversation may
continue), or the session's ``end`` with ``end_session=True``.

A ``HintedAsyncOpenAI`` carries the hints through its ``hint_scope``; a plain client gets
them as request headers. Importing this module imports ``pydantic_ai``; ``agentsdk``
itself never does.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from openai import AsyncOpenAI, OpenAI
from pydantic_ai import RunContext
from pydantic_ai.capabilities import (
    AbstractCapability,
    WrapModelRequestHandler,
    WrapRunHandler,
    WrapToolExecuteHandler,
)
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import ToolDefinition

from hints_spec import End, ToolEnd, ToolStart

from .._client import HintedAsyncOpenAI, HintedOpenAI, hint_headers
from .._config import DEFAULT_USER_WAIT_PRIOR
from .._control import ControlChannel
from .._errors import UserError
from .._latency import LatencyEstimator, user_wait
from .._scope import current_hints, hint_scope, session_id_for

__all__ = ["AgentHintsCapability"]


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
        sid = session_id_for(ctx.conversation_id or ctx.run_id or "run")
        try:
            with hint_scope(session=sid, branch=None):
                return await handler()
        finally:
            self._channel.submit(sid, [self._last_word()])
            await self._channel.flush()

    async def wrap_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        tools = request_context.model_request_parameters.function_tools
        gap = self.estimator.estimate({t.name: None for t in tools})
        with hint_scope(gap=round(gap, 3) if gap is not None else None) as hints:
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
            return await handler(request_context)

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        hints = current_hints()
        sid = hints.sid if hints is not None else None
        eta = self.estimator.estimate({tool_def.name: None})
        if sid is not None:
            start = ToolStart(tool=tool_def.name, eta=round(eta or 0.0, 3))
            self._channel.submit(sid, [start])
        started = time.monotonic()
        try:
            return await handler(args)
        finally:
            self.estimator.observe(tool_def.name, time.monotonic() - started)
            if sid is not None:
                self._channel.submit(sid, [ToolEnd(tool=tool_def.name)])

    def _last_word(self) -> ToolStart | End:
        if self.end_session:
            return End()
        return user_wait(self.estimator, DEFAULT_USER_WAIT_PRIOR)
