"""Hints for runs of the OpenAI Agents SDK (``pip install 'agent-hints[openai-agents]'``).

One line makes a run session-aware: ``Runner = HintedRunner(client)``, with the client
the agents' models use. Its ``run`` / ``run_sync`` / ``run_streamed`` take the SDK's own
arguments, and the SDK's own session becomes the hint session: ``session=`` (its
``session_id``), else a session per run. What the server then hears is what
``agentsdk.Runner`` sends:

- every model call carries the session, its branch and ``gap`` (the expected wait on the
  calling agent's tools, from the runner's ``LatencyEstimator``);
- a sub-agent (``Agent.as_tool``) runs on a child branch of its caller's, and a handoff
  moves the conversation to a child branch of the agent that handed off: each announced
  by a ``fork`` event delivered before the child's first request, and a sub-agent's
  branch ended (``end``) when its caller goes on;
- each tool call is reported as ``tool_start`` (with an ETA) and ``tool_end``;
- the run ends with the session's ``end`` (no session to continue) or the wait on the
  user (a kept session), sent as soon as the run, or its stream, completes.

Branches and ``gap`` ride on ``RunConfig.call_model_input_filter`` (a sub-agent's run
inherits its caller's run config), composed with the user's own filter, and need a hinted
client (``HintedAsyncOpenAI``); a plain client gets the session as request headers.
``HintsRunHooks`` alone serves runs already inside a ``hint_scope`` (tool events only).
Importing this module imports ``agents``; ``agentsdk`` itself never does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
import uuid
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from agents import Agent, ModelSettings, RunConfig, RunContextWrapper, RunHooks, Runner, Tool
from agents.result import RunResult, RunResultStreaming
from agents.run import CallModelData, ModelInputData
from openai import AsyncOpenAI, OpenAI

from hints_spec import ROOT_BRANCH, AgentHints, ControlEvent, End, Fork, ToolEnd, ToolStart

from .._client import HintedAsyncOpenAI, HintedOpenAI, hint_headers
from .._config import DEFAULT_USER_WAIT_PRIOR
from .._control import ControlChannel
from .._errors import NoSessionWarning, UserError, no_running_loop, warn_user
from .._latency import LatencyEstimator, user_wait
from .._scope import branch_slug, child_branch, current_hints, hint_scope, session_id_for

__all__ = ["HintedRunner", "HintsRunHooks"]

# The keyword arguments of agents.Runner.run / run_streamed (the same names).
_RUN_ARGS = frozenset(inspect.signature(Runner.run).parameters) - {"starting_agent", "input"}


@dataclass(eq=False)
class _Frame:
    """One branch of a run: the agent on it, its parent, the children it started since
    its last model call (ended when it calls the model again) and its children's count."""

    agent: Agent[Any]
    branch: str
    parent: _Frame | None = None
    started: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def child(self, agent: Agent[Any]) -> _Frame:
        slug = branch_slug(agent.name)
        n = self.counts[slug] = self.counts.get(slug, 0) + 1
        return _Frame(agent, child_branch(self.branch, slug, n), self)


@dataclass(eq=False)
class _SubRun:
    """One ``agents`` run inside a hinted run (the top one, or a sub-agent's): its first
    input item, which its turns share, and its current branch (a handoff moves it)."""

    key: str
    frame: _Frame


# The sub-run of the turn whose context this is, set by the model-input filter. agents
# runs a run's first turn in a task of its own and later turns inline, and a tool's run
# (as_tool) in a task of the turn that called it, so a filter call finds here either its
# own run's previous turn or the turn that started its run.
_TURN: ContextVar[_SubRun | None] = ContextVar("agentsdk_openai_agents_turn", default=None)


class HintsRunHooks(RunHooks[Any]):
    """``RunHooks`` that report tool starts (with ETA) and ends to the serving engine.

    The session is ``session_id``, else the enclosing ``hint_scope``'s (its branch too).
    Without either nothing can be reported: it warns once. Events go through the
    client's ``ControlChannel`` in order, without waiting; durations feed ``estimator``,
    so ETAs learn from the run (share one estimator across runs to keep learning).
    """

    def __init__(
        self,
        client: OpenAI | AsyncOpenAI,
        *,
        session_id: str | None = None,
        estimator: LatencyEstimator | None = None,
        channel: ControlChannel[OpenAI | AsyncOpenAI] | None = None,
    ) -> None:
        if not isinstance(client, OpenAI | AsyncOpenAI):
            raise UserError(
                f"HintsRunHooks: client must be an openai client, got {type(client).__name__}"
            )
        self.estimator = estimator if estimator is not None else LatencyEstimator()
        self._channel = channel if channel is not None else ControlChannel(client)
        self._session_id = session_id
        self._started: dict[str, tuple[float, str | None]] = {}  # call -> (time, branch)
        self._handoffs: set[int] = set()  # agents handed off to, until their first call
        self._open: dict[str, None] = {}  # child branches not ended yet, in order
        # Sub-runs by (the branch that started them, first input item, agent).
        self._runs: dict[tuple[str | None, str, int], _SubRun] = {}
        self._warned = False

    async def on_tool_start(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool
    ) -> None:
        hints = current_hints()
        br = hints.br if hints is not None else None
        self._started[_call_key(context, tool)] = (time.monotonic(), br)
        eta = self.estimator.estimate({tool.name: None})
        self._send(ToolStart(br=br, tool=tool.name, eta=round(eta or 0.0, 3)))

    async def on_tool_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool, result: object
    ) -> None:
        # On the branch that called it (an as_tool sub-agent's run has moved this
        # context to the sub-agent's branch).
        started = self._started.pop(_call_key(context, tool), None)
        if started is not None:
            self.estimator.observe(tool.name, time.monotonic() - started[0])
            self._send(ToolEnd(br=started[1], tool=tool.name))

    async def on_handoff(
        self, context: RunContextWrapper[Any], from_agent: Agent[Any], to_agent: Agent[Any]
    ) -> None:
        self._handoffs.add(id(to_agent))

    async def flush(self) -> None:
        """Wait for the events in flight (before closing the client or the loop)."""
        await self._channel.flush()

    def flush_sync(self, timeout: float | None = None) -> bool:
        """``flush`` without an event loop; False if ``timeout`` ran out first."""
        return self._channel.flush_sync(timeout)

    async def before_model_call(self, data: CallModelData[Any]) -> ModelInputData:
        """The model-input filter: put the call on its agent's branch, with ``gap``.

        A sub-agent's run (``as_tool``) gets a child branch of the branch that called it;
        after ``on_handoff``, the agent handed off to continues on a child branch of the
        one that handed off. Either way a ``fork`` is delivered before the child's first
        request, and the children a branch started end when it calls the model again.
        """
        agent, inputs = data.agent, data.model_data.input
        key = repr(inputs[0]) if inputs else ""
        run, events = _TURN.get(), list[ControlEvent]()
        same_run = run is not None and run.key == key
        if (
            run is not None
            and same_run
            and agent is not run.frame.agent
            and (id(agent) in self._handoffs)
        ):  # a handoff: the conversation moves on to a child branch
            self._handoffs.discard(id(agent))
            child = run.frame.child(agent)
            events.append(Fork(parent=_wire(run.frame.branch), children=[child.branch]))
            self._open[child.branch] = None
            events += self._ended(run.frame.started) + self._ended([run.frame.branch])
            run.frame = child
        elif run is None or not same_run or agent is not run.frame.agent:
            caller = run.frame if run is not None else None
            lookup = (caller.branch if caller is not None else None, key, id(agent))
            found = self._runs.get(lookup)
            if found is None:
                frame = _Frame(agent, ROOT_BRANCH) if caller is None else caller.child(agent)
                if caller is not None:
                    events.append(Fork(parent=_wire(caller.branch), children=[frame.branch]))
                    caller.started.append(frame.branch)
                    self._open[frame.branch] = None
                found = self._runs[lookup] = _SubRun(key, frame)
            run = found
        frame = run.frame
        events += self._ended(frame.started)  # its sub-agents are done: it goes on
        _TURN.set(run)
        sid = self._sid()
        if events and sid is not None:
            self._channel.submit(sid, events)
            await self._channel.flush()
        tools = {tool.name: None for tool in getattr(agent, "tools", None) or ()}
        gap = self.estimator.estimate(tools)
        parent = frame.parent.branch if frame.parent is not None else None
        hint_scope(  # the model call's own context: it ends with the turn
            branch=_wire(frame.branch), parent=parent, gap=round(gap, 3) if gap else None
        ).__enter__()
        return data.model_data

    def last_words(self, kept: bool) -> list[ControlEvent]:
        """The run's closing events: the ends of branches left open, then the session's
        ``end`` or, for a kept session, the wait on its user."""
        events = self._ended(list(self._open))
        events.append(user_wait(self.estimator, DEFAULT_USER_WAIT_PRIOR) if kept else End())
        return events

    def _ended(self, branches: list[str]) -> list[ControlEvent]:
        """End ``branches`` (those still open; the list is emptied): a later run of the
        same sub-agent with the same input gets a new branch."""
        ended = [b for b in branches if b != ROOT_BRANCH and b in self._open]
        branches.clear()
        for branch in ended:
            del self._open[branch]
        gone = {b: None for b in ended}
        self._runs = {k: r for k, r in self._runs.items() if r.frame.branch not in gone}
        return [End(br=branch) for branch in ended]

    def _sid(self) -> str | None:
        hints = current_hints()
        return self._session_id or (hints.sid if hints is not None else None)

    def _send(self, event: ToolStart | ToolEnd) -> None:
        """Submit ``event``, if a session is known."""
        sid = self._sid()
        if sid is not None:
            self._channel.submit(sid, [event])
        elif not self._warned:
            self._warned = True
            warn_user(
                "HintsRunHooks: no session, so no tool events are sent: give session_id=,"
                " run inside hint_scope(session=...), or use HintedRunner",
                NoSessionWarning,
            )


class HintedRunner:
    """``agents.Runner`` whose runs tell the server their session, branches and waits.

    ``client`` is the openai client the agents' models use (``HintedAsyncOpenAI`` adds
    per-request hints; a plain client gets the session as request headers). One
    ``estimator`` learns tool durations across the runs of this runner, and one
    ``ControlChannel`` posts their events in order.
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
        self._channel: ControlChannel[OpenAI | AsyncOpenAI] = ControlChannel(client)

    async def run(self, starting_agent: Agent[Any], input: Any, **kwargs: Any) -> RunResult:
        """``agents.Runner.run``, hinted; the session's last word is sent before it returns."""
        sid, kept, hooks, kwargs = self._prepare("run", kwargs)
        try:
            with hint_scope(session=sid, branch=None):
                token = _TURN.set(None)
                try:
                    return await Runner.run(starting_agent, input, **kwargs)
                finally:
                    _TURN.reset(token)
        finally:
            self._channel.submit(sid, hooks.last_words(kept))
            await self._channel.flush()

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
        """``agents.Runner.run_streamed``, hinted (its background task inherits the scope);
        the session's last word goes out when the run completes."""
        sid, kept, hooks, kwargs = self._prepare("run_streamed", kwargs)
        with hint_scope(session=sid, branch=None):
            token = _TURN.set(None)
            try:
                stream = Runner.run_streamed(starting_agent, input, **kwargs)
            finally:
                _TURN.reset(token)
        task = stream.run_loop_task
        if task is None:  # not started: nothing will complete it
            self._channel.submit(sid, hooks.last_words(kept))
        else:
            task.add_done_callback(lambda _: self._channel.submit(sid, hooks.last_words(kept)))
        return stream

    async def finish(self, stream: RunResultStreaming) -> None:
        """Wait until a streamed run has completed and its events are delivered (the last
        word is sent without it; this is for closing the client or the loop right after)."""
        task = stream.run_loop_task
        if task is not None:
            await asyncio.wait([task])
        await self._channel.flush()

    async def flush(self) -> None:
        """Wait for the events of this runner's runs."""
        await self._channel.flush()

    def flush_sync(self, timeout: float | None = None) -> bool:
        """``flush`` without an event loop; False if ``timeout`` ran out first."""
        return self._channel.flush_sync(timeout)

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
        hooks = HintsRunHooks(
            self.client, session_id=sid, estimator=self.estimator, channel=self._channel
        )
        user_hooks = kwargs.get("hooks")
        kwargs = {**kwargs, "hooks": hooks if user_hooks is None else _Both(user_hooks, hooks)}
        config = _run_config(kwargs.get("run_config"))
        if isinstance(self.client, HintedOpenAI | HintedAsyncOpenAI):
            kwargs["run_config"] = _with_filter(config, hooks)
        else:
            kwargs["run_config"] = _with_headers(config, sid)
        return sid, own is not None, hooks, kwargs


def _wire(branch: str) -> str | None:
    """Branch id as sent: the root branch is the protocol's default, so it is omitted."""
    return None if branch == ROOT_BRANCH else branch


def _run_config(run_config: RunConfig | Mapping[str, Any] | None) -> RunConfig:
    """``run_config`` as a ``RunConfig`` (agents also takes its fields as a mapping)."""
    if isinstance(run_config, Mapping):
        try:
            return RunConfig(**run_config)
        except TypeError as e:
            raise UserError(f"HintedRunner: run_config: {e}") from e
    return run_config if run_config is not None else RunConfig()


def _with_filter(config: RunConfig, hooks: HintsRunHooks) -> RunConfig:
    """``config`` whose model-input filter is ``hooks.before_model_call``, then the user's."""
    own = config.call_model_input_filter

    async def call_model_input_filter(data: CallModelData[Any]) -> ModelInputData:
        model_data = await hooks.before_model_call(data)
        if own is None:
            return model_data
        result = own(data)
        return await result if inspect.isawaitable(result) else result

    return dataclasses.replace(config, call_model_input_filter=call_model_input_filter)


def _with_headers(config: RunConfig, sid: str) -> RunConfig:
    """``config`` whose model settings send the session as headers (plain clients)."""
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

    async def on_handoff(self, *args: Any, **kwargs: Any) -> None:
        for hooks in self._hooks:
            await hooks.on_handoff(*args, **kwargs)

    async def on_tool_start(self, *args: Any) -> None:
        for hooks in self._hooks:
            await hooks.on_tool_start(*args)

    async def on_tool_end(self, *args: Any) -> None:
        for hooks in self._hooks:
            await hooks.on_tool_end(*args)


def _call_key(context: RunContextWrapper[Any], tool: Tool) -> str:
    """Function tools get a ``ToolContext`` with the call id; other tools share their name."""
    return str(getattr(context, "tool_call_id", None) or tool.name)
