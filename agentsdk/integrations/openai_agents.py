"""Hints for runs of the OpenAI Agents SDK (``pip install 'agent-hints[openai-agents]'``).

One line makes a run session-aware: ``Runner = HintedRunner(client)``, with the client
the agents' models use. Its ``run`` / ``run_sync`` / ``run_streamed`` take the SDK's own
arguments, and the SDK's own session becomes the hint session: ``session=`` (its
``session_id``) or ``conversation_id=``, else a session per run. Every model call then
carries the session (through the hinted client's ``hint_scope``, or request headers
for a plain client), tool calls are reported as ``tool_start`` (with an ETA) and
``tool_end`` control events by ``HintsRunHooks``, and the run ends with the session's
``end`` (no session to continue) or with the wait on the user (a kept session).

``HintsRunHooks`` alone serves runs already inside a ``hint_scope``. Importing this
module imports ``agents``; ``agentsdk`` itself never does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from agents import Agent, ModelSettings, RunConfig, RunContextWrapper, RunHooks, Runner, Tool
from agents.result import RunResult, RunResultStreaming
from openai import AsyncOpenAI, OpenAI

from hints_spec import (
    AgentHints,
    End,
    ToolEnd,
    ToolStart,
)

from .._client import HintedAsyncOpenAI, HintedOpenAI, hint_headers
from .._config import DEFAULT_USER_WAIT_PRIOR
from .._control import ControlChannel
from .._errors import NoSessionWarning, UserError, no_running_loop, warn_user
from .._latency import LatencyEstimator, user_wait
from .._scope import current_hints, hint_scope, session_id_for

__all__ = ["HintedRunner", "HintsRunHooks"]

# The keyword arguments of agents.Runner.run / run_streamed (the same names).
_RUN_ARGS = frozenset(inspect.signature(Runner.run).parameters) - {"starting_agent", "input"}


class HintsRunHooks(RunHooks[Any]):
    """``RunHooks`` that report tool starts (with ETA) and ends to the serving engine.

    The session is ``session_id``, else the enclosing ``hint_scope``'s (its branch too).
    Without either nothing can be reported: it warns once. Events are fire-and-forget;
    durations feed ``estimator``, so ETAs learn from the run (share one estimator across
    runs to keep learning).
    """

    def __init__(
        self,
        client: OpenAI | AsyncOpenAI,
        *,
        session_id: str | None = None,
        estimator: LatencyEstimator | None = None,
    ) -> None:
        if not isinstance(client, OpenAI | AsyncOpenAI):
            raise UserError(
                f"HintsRunHooks: client must be an openai client, got {type(client).__name__}"
            )
        self.estimator = estimator if estimator is not None else LatencyEstimator()
        self._channel = ControlChannel(client)
        self._session_id = session_id
        self._started: dict[str, float] = {}
        self._warned = False

    async def on_tool_start(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool
    ) -> None:
        self._started[_call_key(context, tool)] = time.monotonic()
        eta = self.estimator.estimate({tool.name: None})
        self._send(lambda br: ToolStart(br=br, tool=tool.name, eta=round(eta or 0.0, 3)))

    async def on_tool_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool, result: object
    ) -> None:
        started = self._started.pop(_call_key(context, tool), None)
        if started is not None:
            self.estimator.observe(tool.name, time.monotonic() - started)
        self._send(lambda br: ToolEnd(br=br, tool=tool.name))

    async def flush(self) -> None:
        """Wait for the events in flight (before closing the client or the loop)."""
        await self._channel.flush()

    def _send(self, event: Callable[[str | None], ToolStart | ToolEnd]) -> None:
        """Build the event for the scope's branch and submit it, if a session is known."""
        hints = current_hints()
        sid = self._session_id or (hints.sid if hints is not None else None)
        if sid is not None:
            self._channel.submit(sid, [event(hints.br if hints is not None else None)])
        elif not self._warned:
            self._warned = True
            warn_user(
                "HintsRunHooks: no session, so no tool events are sent: give session_id=,"
                " run inside hint_scope(session=...), or use HintedRunner",
                NoSessionWarning,
            )


class HintedRunner:
    """``agents.Runner`` whose runs tell the server their session and tool waits.

    ``client`` is the openai client the agents' models use (``HintedAsyncOpenAI`` adds
    per-request hints; a plain client gets the session as request headers). One
    ``estimator`` learns tool durations across the runs of this runner.
    """

    def __init__(
        self, client: OpenAI | AsyncOpenAI, *, estimator: LatencyEstimator | None = None
    ) -> None:
        if not isinstance(client, OpenAI | AsyncOpenAI):
            raise UserError(
                f"HintedRunner: client must be an openai client, got {type(client).__name__}"
            )
        self.client = client
        self.estimator = estimator if estimator is not None else LatencyEstimator()
        self._streams: dict[int, tuple[str, bool, HintsRunHooks]] = {}

    async def run(self, starting_agent: Agent[Any], input: Any, **kwargs: Any) -> RunResult:
        """``agents.Runner.run``, hinted; the session's last word is sent before it returns."""
        sid, kept, hooks, kwargs = self._prepare("run", kwargs)
        try:
            with hint_scope(session=sid, branch=None):
                return await Runner.run(starting_agent, input, **kwargs)
        finally:
            hooks._channel.submit(sid, [self._last_word(kept)])
            await hooks.flush()

    def run_sync(self, starting_agent: Agent[Any], input: Any, **kwargs: Any) -> RunResult:
        """``run`` on the thread's default event loop, the one ``agents.Runner.run_sync``
        uses (so clients bound to it keep working)."""
        no_running_loop("HintedRunner.run_sync", "await Runner.run(...)")
        policy = asyncio.get_event_loop_policy()
        try:
            loop = policy.get_event_loop()
        except RuntimeError:
            loop = None
        if loop is None or loop.is_closed():
            loop = policy.new_event_loop()
            policy.set_event_loop(loop)
        return loop.run_until_complete(self.run(starting_agent, input, **kwargs))

    def run_streamed(
        self, starting_agent: Agent[Any], input: Any, **kwargs: Any
    ) -> RunResultStreaming:
        """``agents.Runner.run_streamed``, hinted (its background task inherits the scope).

        The session's last word is not sent: await ``finish(stream)`` after the stream.
        """
        sid, kept, hooks, kwargs = self._prepare("run_streamed", kwargs)
        with hint_scope(session=sid, branch=None):
            stream = Runner.run_streamed(starting_agent, input, **kwargs)
        self._streams[id(stream)] = (sid, kept, hooks)
        return stream

    async def finish(self, stream: RunResultStreaming) -> None:
        """Send a streamed run's last word (``end`` or the wait on the user)."""
        started = self._streams.pop(id(stream), None)
        if started is None:
            raise UserError(
                "HintedRunner.finish: not a stream this runner's run_streamed started,"
                " or one finished already"
            )
        sid, kept, hooks = started
        hooks._channel.submit(sid, [self._last_word(kept)])
        await hooks.flush()

    def _prepare(
        self, where: str, kwargs: dict[str, Any]
    ) -> tuple[str, bool, HintsRunHooks, dict[str, Any]]:
        """The run's session id, whether the session is kept, and its arguments, hinted."""
        unknown = sorted(set(kwargs) - _RUN_ARGS)
        if unknown:
            raise UserError(
                f"HintedRunner.{where}: unknown argument {unknown[0]!r}"
                f" (agents.Runner.{where} takes {', '.join(sorted(_RUN_ARGS))})"
            )
        session, conversation = kwargs.get("session"), kwargs.get("conversation_id")
        own = conversation or (getattr(session, "session_id", None) if session else None)
        sid = session_id_for(str(own)) if own else f"run-{uuid.uuid4().hex}"
        hooks = HintsRunHooks(self.client, session_id=sid, estimator=self.estimator)
        user_hooks = kwargs.get("hooks")
        kwargs = {**kwargs, "hooks": hooks if user_hooks is None else _Both(user_hooks, hooks)}
        if not isinstance(self.client, HintedOpenAI | HintedAsyncOpenAI):
            kwargs["run_config"] = _with_headers(kwargs.get("run_config"), sid)
        return sid, own is not None, hooks, kwargs

    def _last_word(self, kept: bool) -> ToolStart | End:
        if not kept:
            return End()
        return user_wait(self.estimator, DEFAULT_USER_WAIT_PRIOR)


def _with_headers(run_config: RunConfig | Mapping[str, Any] | None, sid: str) -> RunConfig:
    """``run_config`` (a ``RunConfig`` or its fields, as agents takes it) whose model
    settings send the session as headers (plain clients)."""
    if isinstance(run_config, Mapping):
        try:
            run_config = RunConfig(**run_config)
        except TypeError as e:
            raise UserError(f"HintedRunner: run_config: {e}") from e
    config = run_config if run_config is not None else RunConfig()
    settings = config.model_settings or ModelSettings()
    headers = {**hint_headers(AgentHints(sid=sid)), **(settings.extra_headers or {})}
    return dataclasses.replace(
        config, model_settings=dataclasses.replace(settings, extra_headers=headers)
    )


class _Both(RunHooks[Any]):
    """The user's hooks, then the hints'."""

    def __init__(self, first: RunHooks[Any], second: RunHooks[Any]) -> None:
        self._hooks = (first, second)

    async def on_llm_start(self, *args: Any) -> None:
        for hooks in self._hooks:
            await hooks.on_llm_start(*args)

    async def on_llm_end(self, *args: Any) -> None:
        for hooks in self._hooks:
            await hooks.on_llm_end(*args)

    async def on_agent_start(self, *args: Any) -> None:
        for hooks in self._hooks:
            await hooks.on_agent_start(*args)

    async def on_agent_end(self, *args: Any) -> None:
        for hooks in self._hooks:
            await hooks.on_agent_end(*args)

    async def on_handoff(self, *args: Any) -> None:
        for hooks in self._hooks:
            await hooks.on_handoff(*args)

    async def on_tool_start(self, *args: Any) -> None:
        for hooks in self._hooks:
            await hooks.on_tool_start(*args)

    async def on_tool_end(self, *args: Any) -> None:
        for hooks in self._hooks:
            await hooks.on_tool_end(*args)


def _call_key(context: RunContextWrapper[Any], tool: Tool) -> str:
    """Function tools get a ``ToolContext`` with the call id; other tools share their name."""
    return str(getattr(context, "tool_call_id", None) or tool.name)
