"""The agent loop: model call, parallel tool calls, repeat; with hints on every request.

Every request of a branch goes out inside a ``hint_scope`` carrying the session, the
branch and its parent, and ``gap``: the wait the loop expects after the response if it
ends in tool calls (the pooled latency estimate of the agent's tools). Between requests
the loop tells the server what it is doing through control events (tool start with an
ETA, tool end, fork, end), which are fire-and-forget and never delay the loop.

Prefix discipline: a branch's messages are only ever appended to, tool definitions are
built once per branch, and nothing per-request enters either, so each request's prompt
extends the previous one and the server's prefix cache can serve it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio
from openai.types.chat import ChatCompletion
from opentelemetry.trace import SpanKind, Status, StatusCode, get_current_span
from opentelemetry.util.types import AttributeValue
from pydantic import BaseModel

from hints_spec import (
    MAX_CHILDREN,
    ROOT_BRANCH,
    USER_TOOL,
    ControlEvent,
    End,
    Fork,
    ToolEnd,
    ToolStart,
)

from ._config import RunConfig
from ._context import RunContext, RunEnv
from ._errors import MaxTurnsExceeded
from ._hooks import RunHooks, dispatch
from ._items import (
    Message,
    MessageOutputItem,
    RunItem,
    ToolCall,
    ToolCallItem,
    ToolCallOutputItem,
)
from ._latency import LatencyEstimator
from ._model import ControlSender, ModelClient, control_sink, create_completion
from ._result import RunResult
from ._scope import current_hints, hint_scope
from ._session import Session, SessionStats
from ._stream import (
    AgentEndEvent,
    AgentStartEvent,
    ForkEvent,
    LLMEndEvent,
    LLMStartEvent,
    RunItemEvent,
    RunResultStreaming,
    StreamEvent,
    ToolEndEvent,
    ToolStartEvent,
)
from ._tool import Tool, ToolArgumentsError, parse_arguments
from ._tracing import (
    AGENT_HINTS_BRANCH,
    AGENT_HINTS_FORK_CHILDREN,
    AGENT_HINTS_GAP,
    AGENT_HINTS_PARENT_BRANCH,
    AGENT_HINTS_TOOL_ETA,
    ERROR_TYPE,
    GEN_AI_AGENT_NAME,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_NAME,
    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    tracer,
)
from ._usage import Usage

if TYPE_CHECKING:
    from ._agent import Agent

__all__ = ["DEFAULT_MAX_TURNS", "AgentInput", "Runner", "spawn"]

DEFAULT_MAX_TURNS = 10

AgentInput: TypeAlias = str | list[Message]
"""A user message, or messages to append to the conversation."""


class Runner:
    """Runs agents: ``run`` (async), ``run_sync``, ``run_streamed`` and ``fan_out``."""

    @staticmethod
    async def run(
        agent: Agent,
        input: AgentInput,
        *,
        client: ModelClient,
        session: Session | None = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        hooks: RunHooks | None = None,
        run_config: RunConfig | None = None,
    ) -> RunResult:
        """Run ``agent`` until it answers without tool calls.

        ``client`` is any ``openai.AsyncOpenAI`` / ``openai.OpenAI`` (a hinted one sends
        the hints and control events) or a ``ScriptedModel``. With a ``session`` the run
        continues its conversation and stores the new messages, usage and tool latencies.
        Raises ``MaxTurnsExceeded`` and ``ModelCallError``; tool failures go to the model.
        """
        return await _run_root(
            agent, input, client, session, max_turns, hooks, run_config or RunConfig(), None
        )

    @staticmethod
    def run_sync(
        agent: Agent,
        input: AgentInput,
        *,
        client: ModelClient,
        session: Session | None = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        hooks: RunHooks | None = None,
        run_config: RunConfig | None = None,
    ) -> RunResult:
        """``run`` on a new event loop, for code that has none."""
        return anyio.run(
            partial(
                Runner.run,
                agent,
                input,
                client=client,
                session=session,
                max_turns=max_turns,
                hooks=hooks,
                run_config=run_config,
            )
        )

    @staticmethod
    @asynccontextmanager
    async def run_streamed(
        agent: Agent,
        input: AgentInput,
        *,
        client: ModelClient,
        session: Session | None = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        hooks: RunHooks | None = None,
        run_config: RunConfig | None = None,
    ) -> AsyncIterator[RunResultStreaming]:
        """``run`` in the background of an ``async with`` block that streams its events.

        ``async with Runner.run_streamed(...) as stream``, then ``async for event in
        stream``, then ``stream.result``. The block owns the run: leaving it early
        cancels the run rather than leaving a task behind.
        """
        stream = RunResultStreaming()
        config = run_config or RunConfig()
        error: Exception | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(
                stream.drive,
                partial(
                    _run_root,
                    agent,
                    input,
                    client,
                    session,
                    max_turns,
                    hooks,
                    config,
                    stream.publish,
                ),
            )
            try:
                yield stream
            except Exception as err:  # the caller's own: raised below, not as an ExceptionGroup
                error = err
            finally:
                group.cancel_scope.cancel()  # no-op once the run is over
        if error is not None:
            raise error

    @staticmethod
    async def fan_out(
        context: RunContext,
        children: Sequence[tuple[Agent, AgentInput]],
        *,
        fork_context: bool = True,
        max_turns: int | None = None,
    ) -> list[RunResult]:
        """Run sub-agents concurrently on child branches of ``context``'s branch.

        Call it from a tool (declare ``ctx: RunContext``). The parent first sends one
        ``fork`` control event naming every child, so the server keeps the shared prefix
        while they run. With ``fork_context`` (the default) each child starts from the
        parent's latest prompt (its system prompt, tools and history: the cached prefix)
        followed by the child's instructions and input as a user message; the child can
        call the parent's tools and its own. Waits for all children and raises the first
        failure, if any.
        """
        return await spawn(context, children, fork_context, max_turns)


async def _run_root(
    agent: Agent,
    input: AgentInput,
    client: ModelClient,
    session: Session | None,
    max_turns: int,
    hooks: RunHooks | None,
    config: RunConfig,
    publish: Callable[[StreamEvent], None] | None,
) -> RunResult:
    if agent.model is None:
        raise ValueError(f"agent {agent.name!r} has no model (only sub-agents inherit one)")
    stats = await session.get_stats() if session is not None else SessionStats()
    ambient = current_hints()
    session_id = (
        session.session_id
        if session is not None
        else (ambient.sid if ambient is not None and ambient.sid else f"run-{uuid.uuid4().hex}")
    )

    async def emit(event: StreamEvent) -> None:
        if hooks is not None:
            await dispatch(hooks, event)
        if publish is not None:
            publish(event)

    sink = control_sink(client)
    control = ControlSender(sink, session_id) if sink is not None else None
    env = RunEnv(
        client=client,
        config=config,
        emit=emit,
        control=control,
        estimator=LatencyEstimator(
            stats.latency, prior_seconds=config.latency_prior, quantile=config.latency_quantile
        ),
        tracer=tracer(config.tracer_provider),
    )
    context = RunContext(
        agent, agent.model, session_id, ROOT_BRANCH, None, Usage(), agent.tools, _env=env
    )
    history = await session.get_items() if session is not None else []
    end_session = config.end_session if config.end_session is not None else session is None
    if stats.turn_ended_at is not None:  # the user has replied: learn how long that took
        env.estimator.observe(USER_TOOL, max(time.time() - stats.turn_ended_at, 0.0))
    result: RunResult | None = None
    error: Exception | None = None
    async with anyio.create_task_group() as group:
        if control is not None:
            group.start_soon(control.run)  # drained before the run returns
        try:
            result = await _run_agent(
                context,
                [*_system(agent.instructions), *history],
                _as_messages(input),
                max_turns,
                session,
            )
        except Exception as err:  # raised below, outside the group: not as an ExceptionGroup
            error = err
        finally:
            with anyio.CancelScope(shield=True):  # a cancelled run's bookkeeping still lands
                if session is not None:
                    stats.usage.add(context.usage)
                    stats.turn_ended_at = None if end_session else time.time()
                    await session.save_stats(stats)  # latency: the estimator updated it in place
                if control is not None:
                    if end_session:
                        control.submit([End()])
                    elif session is not None:
                        control.submit([_await_user(env, config)])
                    control.close()
    if error is not None:
        raise error
    assert result is not None
    return result


async def spawn(
    parent: RunContext,
    children: Sequence[tuple[Agent, AgentInput]],
    fork_context: bool,
    max_turns: int | None,
) -> list[RunResult]:
    """Fork ``children`` from ``parent`` (``Runner.fan_out`` and ``Agent.as_tool``)."""
    env = parent._env
    branches = [env.new_branch(parent.branch, agent.name) for agent, _ in children]
    get_current_span().set_attribute(AGENT_HINTS_FORK_CHILDREN, branches)
    await env.emit(ForkEvent(parent, branches))
    _control(
        parent,
        [
            Fork(parent=_wire(parent.branch), children=branches[i : i + MAX_CHILDREN])
            for i in range(0, len(branches), MAX_CHILDREN)
        ],
    )
    results: list[RunResult | None] = [None] * len(children)
    errors: list[Exception] = []

    async def run_child(index: int) -> None:
        agent, task = children[index]
        tools = agent.tools
        if fork_context:
            inherited = {t.name for t in parent.tools}
            tools = (*parent.tools, *(t for t in agent.tools if t.name not in inherited))
            prompt, new_input = list(parent.messages), _task(agent.instructions, task)
        else:
            prompt, new_input = _system(agent.instructions), _as_messages(task)
        child = RunContext(
            agent,
            agent.model or parent.model,
            parent.session_id,
            branches[index],
            parent.branch,
            Usage(),
            tools,
            _env=env,
        )
        try:
            results[index] = await _run_agent(
                child, prompt, new_input, max_turns or DEFAULT_MAX_TURNS, None
            )
        except Exception as err:
            errors.append(err)
        finally:
            parent.usage.add(child.usage)
            _control(parent, [End(br=child.branch)])

    async with anyio.create_task_group() as group:
        for index in range(len(children)):
            group.start_soon(run_child, index)
    if errors:
        raise errors[0]
    return [result for result in results if result is not None]


async def _run_agent(
    context: RunContext,
    prompt: list[Message],
    new_input: list[Message],
    max_turns: int,
    session: Session | None,
) -> RunResult:
    """One branch's loop; ``prompt`` is what precedes ``new_input`` (system, history)."""
    env, agent = context._env, context.agent
    tools = {t.name: t for t in context.tools}
    unknown = agent.model_settings.forced_tools() - tools.keys()
    if unknown:
        raise ValueError(f"agent {agent.name!r}: tool_choice names unknown tools {sorted(unknown)}")
    definitions = [t.definition() for t in context.tools]
    messages = [*prompt, *new_input]
    new_messages: list[Message] = []
    new_items: list[RunItem] = []
    unsaved = list(new_input)  # stored with the first complete turn, never half a turn
    attributes: dict[str, AttributeValue] = {
        GEN_AI_OPERATION_NAME: "invoke_agent",
        GEN_AI_AGENT_NAME: agent.name,
        GEN_AI_REQUEST_MODEL: context.model,
        **_branch_attributes(context),
    }
    with env.tracer.start_as_current_span(f"invoke_agent {agent.name}", attributes=attributes):
        await env.emit(AgentStartEvent(context))
        for turn in range(max_turns):
            context.messages = list(messages)
            response = await _call_model(context, messages, definitions, turn)
            message, calls, items = _read_response(context, response, turn)
            messages.append(message)
            new_messages.append(message)
            unsaved.append(message)
            for item in items:
                new_items.append(item)
                await env.emit(RunItemEvent(context, item))
            if not calls:
                break
            for output in await _run_tools(context, tools, calls):
                tool_message = {
                    "role": "tool",
                    "tool_call_id": output.call.id,
                    "content": output.output,
                }
                messages.append(tool_message)
                new_messages.append(tool_message)
                unsaved.append(tool_message)
                new_items.append(output)
            if session is not None:
                await session.add_items(unsaved)
                unsaved = []
        else:
            raise MaxTurnsExceeded(max_turns)
        if session is not None:
            await session.add_items(unsaved)
        result = RunResult(
            agent_name=agent.name,
            session_id=context.session_id,
            branch=context.branch,
            input=new_input,
            new_messages=new_messages,
            new_items=new_items,
            final_output=message.get("content") or "",
            usage=context.usage,
        )
        await env.emit(AgentEndEvent(context, result))
        return result


async def _call_model(
    context: RunContext, messages: list[Message], definitions: list[dict[str, Any]], turn: int
) -> ChatCompletion:
    env, agent = context._env, context.agent
    gap = env.estimator.estimate({t.name: t.expected_seconds for t in context.tools})
    gap = round(gap, 3) if gap is not None else None
    request: dict[str, Any] = {
        "model": context.model,
        "messages": list(messages),
        **agent.model_settings.request_options(turn, bool(definitions)),
    }
    if definitions:
        request["tools"] = definitions
    await env.emit(LLMStartEvent(context, request["messages"]))
    # Branch and parent always given (None clears): an enclosing scope's are not this
    # branch's, and the root branch names itself by omission, as its control events do.
    scope = hint_scope(
        session=context.session_id,
        branch=_wire(context.branch),
        parent=context.parent_branch,
        gap=gap,
    )
    attributes: dict[str, AttributeValue] = {
        GEN_AI_OPERATION_NAME: "chat",
        GEN_AI_PROVIDER_NAME: "openai",
        GEN_AI_REQUEST_MODEL: context.model,
        **_branch_attributes(context),
    }
    if gap is not None:
        attributes[AGENT_HINTS_GAP] = gap
    with (
        env.tracer.start_as_current_span(
            f"chat {context.model}", kind=SpanKind.CLIENT, attributes=attributes
        ) as span,
        scope,
    ):
        response = await create_completion(env.client, request)
        usage = Usage.from_completion(response.usage)
        span.set_attributes(
            {
                GEN_AI_RESPONSE_MODEL: response.model,
                GEN_AI_RESPONSE_FINISH_REASONS: [c.finish_reason for c in response.choices],
                GEN_AI_USAGE_INPUT_TOKENS: usage.input_tokens,
                GEN_AI_USAGE_OUTPUT_TOKENS: usage.output_tokens,
                GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: usage.cached_tokens,
            }
        )
    context.usage.add(usage)
    await env.emit(LLMEndEvent(context, response))
    return response


def _read_response(
    context: RunContext, response: ChatCompletion, turn: int
) -> tuple[Message, list[ToolCall], list[RunItem]]:
    """The assistant message to append, its tool calls, and both as run items.

    Arguments that are not a JSON object are recorded as ``{}``: servers re-parse the
    arguments of past calls to render the prompt (vLLM rejects the request otherwise),
    and the model is told what it actually wrote in the tool's error message.
    """
    reply = response.choices[0].message
    calls = [
        ToolCall(
            id=c.id or f"call_{turn}_{i}", name=c.function.name, arguments=c.function.arguments
        )
        if c.type == "function"
        else ToolCall(id=c.id or f"call_{turn}_{i}", name=c.custom.name, arguments=c.custom.input)
        for i, c in enumerate(reply.tool_calls or [])
    ]
    message: Message = {"role": "assistant", "content": reply.content}
    if calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.name,
                    "arguments": c.arguments if parse_arguments(c.arguments) is not None else "{}",
                },
            }
            for c in calls
        ]
    name, branch = context.agent.name, context.branch
    items: list[RunItem] = [MessageOutputItem(name, branch, reply.content)] if reply.content else []
    items.extend(ToolCallItem(name, branch, call) for call in calls)
    return message, calls, items


async def _run_tools(
    context: RunContext, tools: dict[str, Tool], calls: list[ToolCall]
) -> list[ToolCallOutputItem]:
    """Run one response's calls concurrently (capped); results in call order."""
    env = context._env
    outputs: list[ToolCallOutputItem | None] = [None] * len(calls)
    runnable: list[tuple[int, Tool, BaseModel]] = []
    for index, call in enumerate(calls):
        tool = tools.get(call.name)
        try:
            if tool is None:
                available = ", ".join(tools) or "none"
                raise ToolArgumentsError(f"unknown tool {call.name!r} (available: {available})")
            runnable.append((index, tool, tool.validate_arguments(call.arguments)))
        except ToolArgumentsError as err:
            rejected = ToolCallOutputItem(
                context.agent.name, context.branch, call, f"Error: {err}", True, 0.0
            )
            outputs[index] = rejected
            await env.emit(RunItemEvent(context, rejected))
    if runnable:
        branch = _wire(context.branch)
        etas = {index: _eta(env, tool) for index, tool, _ in runnable}
        _control(
            context,
            [ToolStart(br=branch, tool=t.name, eta=etas[i]) for i, t, _ in runnable],
        )
        limiter = anyio.Semaphore(env.config.max_tool_concurrency)
        errors: list[Exception] = []

        async def execute(index: int, tool: Tool, arguments: BaseModel) -> None:
            try:
                async with limiter:
                    outputs[index] = await _execute(
                        context, tool, calls[index], arguments, etas[index]
                    )
            except Exception as err:  # a hook's (tools' own are caught): stops the batch
                errors.append(err)
                group.cancel_scope.cancel()

        async with anyio.create_task_group() as group:
            for index, tool, arguments in runnable:
                group.start_soon(execute, index, tool, arguments)
        if errors:
            raise errors[0]  # unwrapped, as the caller raised it
        # One tool_end per call once the whole batch is done: the branch returns only then.
        _control(context, [ToolEnd(br=branch, tool=t.name) for _, t, _ in runnable])
    return [output for output in outputs if output is not None]


async def _execute(
    context: RunContext, tool: Tool, call: ToolCall, arguments: BaseModel, eta: float
) -> ToolCallOutputItem:
    env = context._env
    timeout = tool.timeout or env.config.tool_timeout
    attributes: dict[str, AttributeValue] = {
        GEN_AI_OPERATION_NAME: "execute_tool",
        GEN_AI_TOOL_NAME: tool.name,
        GEN_AI_TOOL_CALL_ID: call.id,
        AGENT_HINTS_TOOL_ETA: eta,
        **_branch_attributes(context),
    }
    with env.tracer.start_as_current_span(
        f"execute_tool {tool.name}", attributes=attributes
    ) as span:
        await env.emit(ToolStartEvent(context, tool, call))
        started = time.monotonic()
        error: str | None = None
        output = ""
        try:
            with anyio.move_on_after(timeout) as deadline:
                output = await tool.call(context, arguments)
            if deadline.cancelled_caught:
                error = "TimeoutError"
                output = f"Error: tool {tool.name!r} timed out after {timeout:g} s"
        except Exception as err:  # a failing tool is news for the model, not for the caller
            error = type(err).__qualname__
            output = f"Error: {error}: {err}"
        duration = time.monotonic() - started
        env.estimator.observe(tool.name, duration)
        if error is not None:
            span.set_attribute(ERROR_TYPE, error)
            span.set_status(Status(StatusCode.ERROR, output))
        item = ToolCallOutputItem(
            context.agent.name, context.branch, call, output, error is not None, duration
        )
        await env.emit(ToolEndEvent(context, tool, item))
        await env.emit(RunItemEvent(context, item))
        return item


def _await_user(env: RunEnv, config: RunConfig) -> ToolStart:
    """The root branch now waits on its user, for about the session's usual reply time."""
    estimate = env.estimator.estimate({USER_TOOL: config.user_wait_prior})
    assert estimate is not None  # one tool given
    return ToolStart(tool=USER_TOOL, eta=round(estimate, 3))


def _eta(env: RunEnv, tool: Tool) -> float:
    estimate = env.estimator.estimate({tool.name: tool.expected_seconds})
    assert estimate is not None  # one tool given
    return round(estimate, 3)


def _control(context: RunContext, events: Sequence[ControlEvent]) -> None:
    if context._env.control is not None:
        context._env.control.submit(events)


def _wire(branch: str) -> str | None:
    """Branch id as sent: the root branch is the protocol's default, so it is omitted."""
    return None if branch == ROOT_BRANCH else branch


def _branch_attributes(context: RunContext) -> dict[str, str]:
    attributes = {GEN_AI_CONVERSATION_ID: context.session_id, AGENT_HINTS_BRANCH: context.branch}
    if context.parent_branch is not None:
        attributes[AGENT_HINTS_PARENT_BRANCH] = context.parent_branch
    return attributes


def _system(instructions: str | None) -> list[Message]:
    return [{"role": "system", "content": instructions}] if instructions else []


def _as_messages(input: AgentInput) -> list[Message]:
    return [{"role": "user", "content": input}] if isinstance(input, str) else list(input)


def _task(instructions: str | None, task: AgentInput) -> list[Message]:
    """A forked child's opening: its instructions ride in the user turn, not the system
    prompt, which belongs to the shared prefix."""
    if not instructions:
        return _as_messages(task)
    if isinstance(task, str):
        return [{"role": "user", "content": f"{instructions}\n\n{task}"}]
    return [{"role": "user", "content": instructions}, *task]
