"""``Runner``: the entry points of a run, which check every argument before anything is sent.

A run's root branch loops in ``_branch``; here are its session (history, stats, the
user's reply time), its control events' delivery and its last word to the server: ``end`` when
nothing can continue the session, else the wait on the user.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio

from hints_spec import USER_TOOL, End

from ._agent import Agent
from ._config import RunConfig
from ._context import RunContext
from ._control import CONTROL_TIMEOUT
from ._env import DEFAULT_MAX_TURNS, BranchContext, RunEnv, root_context, system_prompt
from ._errors import UserError, no_running_loop
from ._fork import spawn
from ._hooks import RunHooks, dispatch
from ._items import AgentInput, Message, input_messages
from ._latency import LatencyEstimator, user_wait
from ._loop import run_agent
from ._model import ModelClient, control_sender, is_model_client, server_of
from ._result import RunResult
from ._scope import check_session_id, current_hints
from ._session import Session, SessionStats
from ._stream import Publish, RunResultStreaming, StreamEvent
from ._tracing import ClientMetrics, capture_content, tracer

__all__ = ["DEFAULT_MAX_TURNS", "Runner"]

_SESSION_METHODS = ("get_items", "add_items", "get_stats", "save_stats")


@dataclass(frozen=True)
class _Run:
    """A run's arguments, checked."""

    agent: Agent
    model: str
    input: list[Message]
    client: ModelClient
    context: Any
    session: Session | None
    max_turns: int
    hooks: RunHooks | None
    config: RunConfig


class Runner:
    """Runs agents: ``run`` (async), ``run_sync``, ``run_streamed`` and ``fan_out``.

    The signatures follow the OpenAI Agents SDK's ``Runner``, plus ``client``: the
    ``openai.AsyncOpenAI`` / ``openai.OpenAI`` to call (a hinted one sends the hints and
    control events) or a ``ScriptedModel``. A wrong argument raises ``UserError`` at the
    call, before any request.
    """

    @staticmethod
    async def run(
        agent: Agent,
        input: AgentInput,
        *,
        client: ModelClient,
        context: Any = None,
        session: Session | None = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        hooks: RunHooks | None = None,
        run_config: RunConfig | None = None,
    ) -> RunResult:
        """Run ``agent`` until it answers without tool calls.

        ``context`` is handed to tools and hooks as ``RunContext.context``. With a
        ``session`` the run continues its conversation and stores the new messages, usage
        and tool latencies. ``max_turns`` bounds this agent's model calls;
        ``RunConfig.max_model_calls`` bounds the whole run's, sub-agents included.
        Raises ``MaxTurnsExceeded``, ``RunLimitExceeded``, ``ModelCallError`` and
        ``OutputValidationError``; tool failures go to the model.
        """
        run = _check(agent, input, client, context, session, max_turns, hooks, run_config)
        return await _run_root(run, None)

    @staticmethod
    def run_sync(
        agent: Agent,
        input: AgentInput,
        *,
        client: ModelClient,
        context: Any = None,
        session: Session | None = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        hooks: RunHooks | None = None,
        run_config: RunConfig | None = None,
    ) -> RunResult:
        """``run`` on a new event loop, for code that has none."""
        no_running_loop("Runner.run_sync", "await Runner.run(...)")
        run = _check(agent, input, client, context, session, max_turns, hooks, run_config)
        return anyio.run(_run_root, run, None)

    @staticmethod
    def run_streamed(
        agent: Agent,
        input: AgentInput,
        *,
        client: ModelClient,
        context: Any = None,
        session: Session | None = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        hooks: RunHooks | None = None,
        run_config: RunConfig | None = None,
    ) -> RunResultStreaming:
        """``run``, streaming its events: ``async with Runner.run_streamed(...) as stream``
        then ``async for event in stream``, or ``stream.stream_events()`` as in the OpenAI
        Agents SDK; then ``stream.result`` (see ``RunResultStreaming``)."""
        run = _check(agent, input, client, context, session, max_turns, hooks, run_config)
        return RunResultStreaming(partial(_run_root, run))

    @staticmethod
    async def fan_out(
        context: RunContext[Any],
        children: Sequence[tuple[Agent, AgentInput]],
        *,
        fork_context: bool = True,
        recursive: bool = False,
        max_turns: int | None = None,
    ) -> list[RunResult]:
        """Run sub-agents concurrently on child branches of ``context``'s branch.

        Call it from a tool (declare ``ctx: RunContext``). The parent first sends one
        ``fork`` control event naming every child, so the server keeps the shared prefix
        while they run. With ``fork_context`` (the default) each child starts from the
        parent's latest prompt (its system prompt, tools and history: the cached prefix)
        followed by the child's instructions and input as a user message; the child can
        call the parent's tools and its own, except the tool that is forking it unless
        ``recursive``. Waits for all children and raises the first failure, if any.
        """
        if not isinstance(context, BranchContext):
            raise UserError(
                "Runner.fan_out needs the RunContext of a running tool: declare `ctx:"
                " RunContext` as the tool's first parameter and pass that ctx"
            )
        if max_turns is not None and not _is_count(max_turns):
            raise UserError(f"Runner.fan_out(max_turns={max_turns!r}): an int >= 1 or None")
        return await spawn(context, children, fork_context, max_turns, recursive)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check(
    agent: object,
    input: object,
    client: object,
    context: Any,
    session: object,
    max_turns: object,
    hooks: object,
    run_config: object,
) -> _Run:
    """Every argument of a run, or a ``UserError`` that says what to change."""
    if not isinstance(agent, Agent):
        raise UserError(f"Runner: agent must be an agentsdk.Agent, got {type(agent).__name__}")
    if agent.model is None:
        raise UserError(
            f"Runner: agent {agent.name!r} has no model: set Agent(model=...)"
            " (only sub-agents inherit their parent's)"
        )
    messages = input_messages(input, "Runner: input")
    if not is_model_client(client):
        raise UserError(
            "Runner: client must be an openai.AsyncOpenAI or openai.OpenAI (HintedAsyncOpenAI"
            f" sends hints) or a ScriptedModel, got {type(client).__name__}"
        )
    if session is not None:
        if isinstance(session, str):
            raise UserError(
                f"Runner: session must be a Session, got the str {session!r:.60}: pass"
                f" InMemorySession({session!r:.60}) or SQLiteSession({session!r:.60}, path)"
            )
        missing = [m for m in _SESSION_METHODS if not callable(getattr(session, m, None))]
        if missing:
            raise UserError(
                f"Runner: session {type(session).__name__} is not a Session (no {missing}):"
                " use InMemorySession or SQLiteSession, or implement the Session protocol"
            )
        check_session_id(getattr(session, "session_id", None), "Runner: session")
    if not _is_count(max_turns):
        raise UserError(f"Runner: max_turns must be an int >= 1, got {max_turns!r}")
    if hooks is not None and not isinstance(hooks, RunHooks):
        raise UserError(
            f"Runner: hooks must be an agentsdk.RunHooks, got {type(hooks).__name__}:"
            " subclass RunHooks and override the callbacks you need"
        )
    if run_config is not None and not isinstance(run_config, RunConfig):
        raise UserError(
            f"Runner: run_config must be an agentsdk.RunConfig, got {type(run_config).__name__}"
        )
    forced = agent.model_settings.forced_tools() - {t.name for t in agent.tools}
    if forced:
        raise UserError(
            f"Runner: agent {agent.name!r}: tool_choice forces {sorted(forced)}, which are"
            f" not among its tools {sorted(t.name for t in agent.tools)}"
        )
    return _Run(
        agent=agent,
        model=agent.model,
        input=messages,
        client=client,  # type: ignore[arg-type]  # checked by is_model_client
        context=context,
        session=session,  # type: ignore[arg-type]  # checked above
        max_turns=max_turns,  # type: ignore[arg-type]  # checked by _is_count
        hooks=hooks,
        config=run_config if run_config is not None else RunConfig(),
    )


async def _run_root(run: _Run, publish: Publish | None) -> RunResult:
    session, config = run.session, run.config
    stats = await session.get_stats() if session is not None else SessionStats()
    ambient = current_hints()
    session_id = (
        session.session_id
        if session is not None
        else (ambient.sid if ambient is not None and ambient.sid else f"run-{uuid.uuid4().hex}")
    )
    hooks = run.hooks

    async def emit(event: StreamEvent) -> None:
        if hooks is not None:
            await dispatch(hooks, event)
        if publish is not None:
            publish(event)

    control = control_sender(run.client)
    env = RunEnv(
        client=run.client,
        config=config,
        emit=emit,
        session_id=session_id,
        control=control,
        estimator=LatencyEstimator(
            stats.latency,
            shared=config.shared_latency,
            prior_seconds=config.latency_prior,
            quantile=config.latency_quantile,
        ),
        tracer=tracer(config.tracer_provider),
        metrics=ClientMetrics(config.meter_provider),
        server=server_of(run.client),
        run_branch=run_agent,
        capture_content=capture_content(),
    )
    context = root_context(run.agent, run.model, session_id, run.context, env)
    history = await session.get_items() if session is not None else []
    end_session = config.end_session if config.end_session is not None else session is None
    if stats.turn_ended_at is not None:  # the user has replied: learn how long that took
        env.estimator.observe(USER_TOOL, max(time.time() - stats.turn_ended_at, 0.0))
    interrupted = True  # until the loop returns or raises: a cancellation is not an error
    try:
        result = await run_agent(
            context,
            [*system_prompt(run.agent.instructions), *history],
            run.input,
            run.max_turns,
            session,
        )
        interrupted = False
    except Exception:
        interrupted = False
        raise
    finally:
        with anyio.CancelScope(shield=True):  # a cancelled run's bookkeeping still lands
            if session is not None:
                stats.usage.add(context.usage)
                stats.turn_ended_at = None if end_session else time.time()
                await session.save_stats(stats)  # latency: the estimator updated it in place
            if control is not None:
                if end_session:
                    control.submit(session_id, [End()], context._trace)
                elif session is not None:
                    wait = user_wait(env.estimator, config.user_wait_prior)
                    control.submit(session_id, [wait], context._trace)
                # Delivered before returning, so that run_sync does not lose the end; a
                # cancelled run waits at most one POST's timeout for it.
                with anyio.move_on_after(CONTROL_TIMEOUT if interrupted else None):
                    await control.flush()
    return result
