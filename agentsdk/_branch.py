"""One branch's loop (model call, parallel tool calls, repeat) and the forks between branches.

Every request of a branch goes out inside a ``hint_scope`` carrying the session, the
branch and its parent, and ``gap``: the wait the loop expects after the response if it
ends in tool calls (the pooled latency estimate of the agent's tools). Between requests
the loop tells the server what it is doing through control events (tool start with an
ETA, tool end, fork, end), which are fire-and-forget and never delay the loop.

Prefix discipline: a branch's messages are only ever appended to, tool definitions are
built once per branch, and nothing per-request enters either, so each request's prompt
extends the previous one and the server's prefix cache can serve it. A forked child
renders its parent's tool definitions (its prompt starts as the parent's) but cannot call
the tool that forked it, unless the fork is ``recursive``: so a fan-out does not recurse
by accident, and ``RunConfig.max_fork_depth`` / ``max_model_calls`` bound it when asked to.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from openai.types.chat import ChatCompletion
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, get_current_span
from opentelemetry.util.types import AttributeValue
from pydantic import BaseModel

from hints_spec import (
    MAX_CHILDREN,
    ROOT_BRANCH,
    ControlEvent,
    End,
    Fork,
    ToolStart,
)

from ._agent import Agent, AgentTool
from ._config import RunConfig
from ._context import RunContext
from ._control import ControlSender
from ._errors import (
    ForkDepthExceeded,
    MaxTurnsExceeded,
    ModelCallError,
    ModelCallLimitExceeded,
    RunLimitExceeded,
    UserError,
)
from ._items import (
    AgentInput,
    Message,
    MessageOutputItem,
    RunItem,
    ToolCall,
    ToolCallItem,
    ToolCallOutputItem,
    input_messages,
)
from ._latency import LatencyEstimator
from ._model import ModelClient, create_completion
from ._result import RunResult
from ._scope import branch_slug, child_branch, hint_scope
from ._session import Session
from ._stream import (
    AgentEndEvent,
    AgentStartEvent,
    ForkEvent,
    LLMEndEvent,
    LLMStartEvent,
    RunItemEvent,
    StreamEvent,
    ToolEndEvent,
    ToolStartEvent,
)
from ._tool import Tool, ToolArgumentsError, parse_arguments, tool_output
from ._tracing import (
    AGENT_HINTS_BRANCH,
    AGENT_HINTS_FORK_CHILDREN,
    AGENT_HINTS_GAP,
    AGENT_HINTS_PARENT_BRANCH,
    AGENT_HINTS_TOOL_ETA,
    ERROR_TYPE,
    GEN_AI_AGENT_DESCRIPTION,
    GEN_AI_AGENT_NAME,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION_NAME,
    GEN_AI_OUTPUT_TYPE,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MAX_TOKENS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_REQUEST_SEED,
    GEN_AI_REQUEST_TEMPERATURE,
    GEN_AI_REQUEST_TOP_P,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_ID,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_TOKEN_TYPE,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_DESCRIPTION,
    GEN_AI_TOOL_NAME,
    GEN_AI_TOOL_TYPE,
    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    PROVIDER_NAME,
    SERVER_ADDRESS,
    SERVER_PORT,
    ClientMetrics,
    input_content,
    output_content,
)
from ._usage import Usage

_log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_TURNS",
    "Branch",
    "BranchContext",
    "RunEnv",
    "root_context",
    "run_agent",
    "spawn",
    "system_prompt",
    "wire",
]

DEFAULT_MAX_TURNS = 10

# Errors that end the whole run rather than becoming a tool message for the model.
_FATAL = (RunLimitExceeded, UserError)


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


async def spawn(
    parent: BranchContext,
    children: Sequence[tuple[Agent, AgentInput]],
    fork_context: bool,
    max_turns: int | None,
    recursive: bool,
) -> list[RunResult]:
    """Fork ``children`` from ``parent`` (``Runner.fan_out`` and ``Agent.as_tool``)."""
    inputs = _check_children(children)
    env = parent._branch.env
    if parent.depth >= env.config.max_fork_depth:
        raise ForkDepthExceeded(env.config.max_fork_depth, parent.branch)
    branches = [env.new_branch(parent.branch, agent.name) for agent, _ in children]
    get_current_span().set_attribute(AGENT_HINTS_FORK_CHILDREN, branches)
    await env.emit(ForkEvent(parent, parent._branch.agent, branches))
    env.submit(
        [
            Fork(parent=wire(parent.branch), children=branches[i : i + MAX_CHILDREN])
            for i in range(0, len(branches), MAX_CHILDREN)
        ]
    )
    await env.delivered()  # the server learns of the fork before the children's requests
    forker = parent.tool_call.name if parent.tool_call is not None and not recursive else None
    results: list[RunResult | None] = [None] * len(children)
    errors: list[Exception] = []

    async def run_child(index: int) -> None:
        agent, task = children[index][0], inputs[index]
        if fork_context:
            inherited = parent._branch.definitions
            names = {t.name for t in inherited}
            own = tuple(t for t in agent.tools if t.name not in names)
            callable_ = {n: t for n, t in parent._branch.tools.items() if n != forker}
            branch = Branch(agent, (*inherited, *own), callable_ | {t.name: t for t in own}, env)
            prompt, new_input = list(parent.messages), _task(agent.instructions, task)
        else:
            branch = Branch(agent, tuple(agent.tools), {t.name: t for t in agent.tools}, env)
            prompt, new_input = system_prompt(agent.instructions), task
        child = BranchContext(
            context=parent.context,
            agent_name=agent.name,
            model=agent.model or parent.model,
            session_id=parent.session_id,
            branch=branches[index],
            parent_branch=parent.branch,
            depth=parent.depth + 1,
            usage=Usage(),
            _branch=branch,
        )
        try:
            results[index] = await run_agent(
                child, prompt, new_input, max_turns or DEFAULT_MAX_TURNS, None
            )
        except Exception as err:
            errors.append(err)
            if isinstance(err, _FATAL):
                group.cancel_scope.cancel()  # the run is over: stop the siblings too
        finally:
            parent.usage.add(child.usage)
            env.submit([End(br=child.branch)])

    async with anyio.create_task_group() as group:
        for index in range(len(children)):
            group.start_soon(run_child, index)
    if errors:
        raise next((e for e in errors if isinstance(e, _FATAL)), errors[0])
    return [result for result in results if result is not None]


def _check_children(children: object) -> list[list[Message]]:
    if not isinstance(children, list | tuple) or not children:
        raise UserError("fan_out: a non-empty list of (agent, input) pairs expected")
    inputs = []
    for index, pair in enumerate(children):
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], Agent)):
            raise UserError(f"fan_out: children[{index}] must be an (Agent, input) pair")
        inputs.append(input_messages(pair[1], f"fan_out: children[{index}] input"))
    return inputs


async def run_agent(
    context: BranchContext,
    prompt: list[Message],
    new_input: list[Message],
    max_turns: int,
    session: Session | None,
) -> RunResult:
    """One branch's loop; ``prompt`` is what precedes ``new_input`` (system, history)."""
    branch = context._branch
    env, agent = branch.env, branch.agent
    unknown = agent.model_settings.forced_tools() - branch.tools.keys()
    if unknown:
        raise UserError(
            f"agent {agent.name!r}: tool_choice forces {sorted(unknown)}, which it cannot"
            f" call (its tools: {sorted(branch.tools)})"
        )
    definitions = [t.definition() for t in branch.definitions]
    messages = [*prompt, *new_input]
    new_messages: list[Message] = []
    new_items: list[RunItem] = []
    unsaved = list(new_input)  # stored with the first complete turn, never half a turn
    attributes: dict[str, AttributeValue] = {
        GEN_AI_OPERATION_NAME: "invoke_agent",
        GEN_AI_AGENT_NAME: agent.name,
        **_operation_attributes(context),
        **_branch_attributes(context),
    }
    if agent.description:
        attributes[GEN_AI_AGENT_DESCRIPTION] = agent.description
    if agent.output_schema is not None:
        attributes[GEN_AI_OUTPUT_TYPE] = "json"
    with env.tracer.start_as_current_span(
        f"invoke_agent {agent.name}", attributes=attributes
    ) as span:
        context._trace = otel_context.get_current()
        try:
            await env.emit(AgentStartEvent(context, agent))
            waited: _Wait | None = None
            for turn in range(max_turns):
                context.messages = list(messages)
                if waited is not None:
                    waited.observe(env.estimator)
                response = await _call_model(context, messages, definitions, turn)
                responded = time.monotonic()
                message, calls, items = _read_response(context, response, turn)
                messages.append(message)
                new_messages.append(message)
                unsaved.append(message)
                for item in items:
                    new_items.append(item)
                    await env.emit(RunItemEvent(context, agent, item))
                if not calls:
                    break
                outputs, durations = await _run_tools(context, calls)
                waited = _Wait(responded, durations) if durations else None
                for output in outputs:
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
                raise MaxTurnsExceeded(max_turns, context.agent_name)
            if session is not None:
                await session.add_items(unsaved)
            text = message.get("content") or ""
            result = RunResult(
                agent_name=agent.name,
                session_id=context.session_id,
                branch=context.branch,
                input=new_input,
                new_messages=new_messages,
                new_items=new_items,
                final_output=agent.output_schema.validate(text) if agent.output_schema else text,
                usage=context.usage,
            )
            await env.emit(AgentEndEvent(context, agent, result))
            span.set_attributes(
                {
                    GEN_AI_USAGE_INPUT_TOKENS: context.usage.input_tokens,
                    GEN_AI_USAGE_OUTPUT_TOKENS: context.usage.output_tokens,
                    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: context.usage.cached_tokens,
                }
            )
            return result
        except Exception as err:
            span.set_attribute(ERROR_TYPE, _error_type(err))
            raise


async def _call_model(
    context: BranchContext, messages: list[Message], definitions: list[dict[str, Any]], turn: int
) -> ChatCompletion:
    branch = context._branch
    env, agent = branch.env, branch.agent
    env.count_call()
    gap = env.estimator.estimate({t.name: t.expected_seconds for t in branch.definitions})
    gap = round(gap, 3) if gap is not None else None
    settings = agent.model_settings
    request: dict[str, Any] = {
        "model": context.model,
        "messages": list(messages),
        **settings.request_options(turn, bool(definitions)),
    }
    if definitions:
        request["tools"] = definitions
    choice = request.get("tool_choice")
    answers = not (isinstance(choice, dict) or choice == "required")  # may this turn answer?
    if agent.output_schema is not None and answers:
        request["response_format"] = agent.output_schema.response_format
    await env.emit(LLMStartEvent(context, agent, request["messages"]))
    # Branch and parent always given (None clears): an enclosing scope's are not this
    # branch's, and the root branch names itself by omission, as its control events do.
    scope = hint_scope(
        session=context.session_id,
        branch=wire(context.branch),
        parent=context.parent_branch,
        gap=gap,
    )
    metric_attributes: dict[str, AttributeValue] = {
        GEN_AI_OPERATION_NAME: "chat",
        GEN_AI_PROVIDER_NAME: PROVIDER_NAME,
        GEN_AI_REQUEST_MODEL: context.model,
    }
    if env.server is not None:
        metric_attributes |= {SERVER_ADDRESS: env.server[0], SERVER_PORT: env.server[1]}
    attributes: dict[str, AttributeValue] = {
        GEN_AI_OPERATION_NAME: "chat",
        **_operation_attributes(context),
        **_branch_attributes(context),
    }
    if "response_format" in request:
        attributes[GEN_AI_OUTPUT_TYPE] = "json"
    if gap is not None:
        attributes[AGENT_HINTS_GAP] = gap
    if env.capture_content:
        attributes |= input_content(request["messages"])
    started = time.monotonic()
    with (
        env.tracer.start_as_current_span(
            f"chat {context.model}", kind=SpanKind.CLIENT, attributes=attributes
        ) as span,
        scope,
    ):
        try:
            response = await create_completion(env.client, request)
        except ModelCallError as err:
            metric_attributes[ERROR_TYPE] = _error_type(err)
            span.set_attribute(ERROR_TYPE, metric_attributes[ERROR_TYPE])
            env.metrics.operation_duration.record(time.monotonic() - started, metric_attributes)
            raise
        usage = Usage.from_completion(response.usage)
        metric_attributes[GEN_AI_RESPONSE_MODEL] = response.model
        span.set_attributes(
            {
                GEN_AI_RESPONSE_ID: response.id,
                GEN_AI_RESPONSE_MODEL: response.model,
                GEN_AI_RESPONSE_FINISH_REASONS: [c.finish_reason for c in response.choices],
                GEN_AI_USAGE_INPUT_TOKENS: usage.input_tokens,
                GEN_AI_USAGE_OUTPUT_TOKENS: usage.output_tokens,
                GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: usage.cached_tokens,
            }
        )
        if env.capture_content:
            span.set_attributes(output_content(response))
    env.metrics.operation_duration.record(time.monotonic() - started, metric_attributes)
    if response.usage is not None:
        for kind, count in (("input", usage.input_tokens), ("output", usage.output_tokens)):
            env.metrics.token_usage.record(count, {**metric_attributes, GEN_AI_TOKEN_TYPE: kind})
    context.usage.add(usage)
    await env.emit(LLMEndEvent(context, agent, response))
    return response


def _read_response(
    context: BranchContext, response: ChatCompletion, turn: int
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
    name, branch = context.agent_name, context.branch
    items: list[RunItem] = [MessageOutputItem(name, branch, reply.content)] if reply.content else []
    items.extend(ToolCallItem(name, branch, call) for call in calls)
    return message, calls, items


@dataclass(frozen=True, slots=True)
class _Wait:
    """A branch's wait on one response's tools, from the response (``since``,
    ``time.monotonic``) to the branch's next request; ``durations``: each tool
    that ran, its longest call."""

    since: float
    durations: dict[str, float]

    def observe(self, estimator: LatencyEstimator) -> None:
        """Teach ``estimator``, at the branch's next request, each tool's own
        duration and what the loop spent around the batch (its hooks, the session
        store, building the request), which the server waits for as well."""
        for name, seconds in self.durations.items():
            estimator.observe(name, seconds)
        around = time.monotonic() - self.since - max(self.durations.values())
        estimator.observe_around(max(around, 0.0))


async def _run_tools(
    context: BranchContext, calls: list[ToolCall]
) -> tuple[list[ToolCallOutputItem], dict[str, float]]:
    """Run one response's calls concurrently (capped); results in call order,
    and the longest duration of each tool that ran (``_Wait``)."""
    branch = context._branch
    env, agent = branch.env, branch.agent
    outputs: list[ToolCallOutputItem | None] = [None] * len(calls)
    runnable: list[tuple[int, Tool, BaseModel]] = []
    for index, call in enumerate(calls):
        tool = branch.tools.get(call.name)
        try:
            if tool is None:
                raise ToolArgumentsError(_not_callable(branch, call.name))
            runnable.append((index, tool, tool.validate_arguments(call.arguments)))
        except ToolArgumentsError as err:
            rejected = ToolCallOutputItem(
                context.agent_name, context.branch, call, f"Error: {err}", True, 0.0
            )
            outputs[index] = rejected
            await env.emit(RunItemEvent(context, agent, rejected))
    if runnable:
        br = wire(context.branch)
        etas = {index: _eta(env, tool) for index, tool, _ in runnable}
        env.submit([ToolStart(br=br, tool=t.name, eta=etas[i]) for i, t, _ in runnable])
        limiter = anyio.Semaphore(env.config.max_tool_concurrency)
        errors: list[Exception] = []

        async def execute(index: int, tool: Tool, arguments: BaseModel) -> None:
            try:
                async with limiter:
                    outputs[index] = await _execute(
                        context, tool, calls[index], arguments, etas[index]
                    )
            except Exception as err:  # a hook's or a run limit (tools' own are caught)
                errors.append(err)
                group.cancel_scope.cancel()

        async with anyio.create_task_group() as group:
            for index, tool, arguments in runnable:
                group.start_soon(execute, index, tool, arguments)
        if errors:
            raise errors[0]  # unwrapped, as the caller raised it
        # No ``tool_end``: the loop's next request follows at once and tells the
        # server the same; a POST for it would only load the server's CPU.
    durations: dict[str, float] = {}
    for index, tool, _ in runnable:
        if (ran := outputs[index]) is not None:
            durations[tool.name] = max(durations.get(tool.name, 0.0), ran.duration)
    return [output for output in outputs if output is not None], durations


def _not_callable(branch: Branch, name: str) -> str:
    if any(t.name == name for t in branch.definitions):
        return (
            f"tool {name!r} started this sub-agent, which cannot call it in turn"
            " (a recursive fork allows it)"
        )
    available = ", ".join(branch.tools) or "none"
    return f"unknown tool {name!r} (available: {available})"


async def _execute(
    context: BranchContext, tool: Tool, call: ToolCall, arguments: BaseModel, eta: float
) -> ToolCallOutputItem:
    env, agent = context._branch.env, context._branch.agent
    timeout = tool.timeout or env.config.tool_timeout
    attributes: dict[str, AttributeValue] = {
        GEN_AI_OPERATION_NAME: "execute_tool",
        GEN_AI_TOOL_NAME: tool.name,
        GEN_AI_TOOL_TYPE: "function",
        GEN_AI_TOOL_CALL_ID: call.id,
        AGENT_HINTS_TOOL_ETA: eta,
        **_branch_attributes(context),
    }
    if tool.description:
        attributes[GEN_AI_TOOL_DESCRIPTION] = tool.description
    call_context = dataclasses.replace(context, tool_call=call)
    with env.tracer.start_as_current_span(
        f"execute_tool {tool.name}", attributes=attributes
    ) as span:
        await env.emit(ToolStartEvent(call_context, agent, tool, call))
        started = time.monotonic()
        error: str | None = None
        output = ""
        try:
            with anyio.move_on_after(timeout) as deadline:
                output = await _invoke(call_context, tool, arguments)
            if deadline.cancelled_caught:
                error = "TimeoutError"
                output = f"Error: tool {tool.name!r} timed out after {timeout:g} s"
                span.record_exception(TimeoutError(output[7:]))
                _log.warning(
                    "%s (agent %r, branch %s)", output[7:], context.agent_name, context.branch
                )
            output = _capped(output, env.config.max_tool_output_chars)
        except _FATAL:
            raise
        except Exception as err:  # a failing tool is news for the model, and the developer's
            error = type(err).__qualname__
            output = f"Error: {error}: {err}"
            span.record_exception(err)
            _log.warning(
                "tool %r of agent %r (branch %s) raised; the model is told %r",
                tool.name, context.agent_name, context.branch, output[:200], exc_info=err,
            )  # fmt: skip
        duration = time.monotonic() - started
        if error is not None:
            span.set_attribute(ERROR_TYPE, error)
            span.set_status(Status(StatusCode.ERROR, output))
        item = ToolCallOutputItem(
            context.agent_name, context.branch, call, output, error is not None, duration
        )
        await env.emit(ToolEndEvent(call_context, agent, tool, item))
        await env.emit(RunItemEvent(call_context, agent, item))
        return item


def _capped(output: str, limit: int) -> str:
    """``output`` cut to ``limit`` characters, with a note for the model."""
    if len(output) <= limit:
        return output
    return output[:limit] + f"\n[truncated: the tool returned {len(output):,} characters]"


async def _invoke(context: BranchContext, tool: Tool, arguments: BaseModel) -> str:
    if isinstance(tool, AgentTool):
        [result] = await spawn(
            context,
            [(tool.agent, tool.task(arguments))],
            tool.fork_context,
            tool.max_turns,
            tool.recursive,
        )
        return tool_output(result.final_output)
    return await tool.call(context, arguments)


def _eta(env: RunEnv, tool: Tool) -> float:
    estimate = env.estimator.estimate({tool.name: tool.expected_seconds})
    assert estimate is not None  # one tool given
    return round(estimate, 3)


def _error_type(err: Exception) -> str:
    """``error.type``: the failure's own class (a model call's: the client's exception)."""
    cause = err.__cause__ if isinstance(err, ModelCallError) and err.__cause__ else err
    return type(cause).__qualname__


def wire(branch: str) -> str | None:
    """Branch id as sent: the root branch is the protocol's default, so it is omitted."""
    return None if branch == ROOT_BRANCH else branch


def _operation_attributes(context: BranchContext) -> dict[str, AttributeValue]:
    """What ``invoke_agent`` and ``chat`` spans say of the requests: provider, model, the
    sampling parameters that are set, and the server."""
    env, settings = context._branch.env, context._branch.agent.model_settings
    attributes: dict[str, AttributeValue] = {
        GEN_AI_PROVIDER_NAME: PROVIDER_NAME,
        GEN_AI_REQUEST_MODEL: context.model,
    }
    for key, value in (
        (GEN_AI_REQUEST_TEMPERATURE, settings.temperature),
        (GEN_AI_REQUEST_TOP_P, settings.top_p),
        (GEN_AI_REQUEST_MAX_TOKENS, settings.max_tokens),
        (GEN_AI_REQUEST_SEED, settings.seed),
    ):
        if value is not None:
            attributes[key] = value
    if env.server is not None:
        attributes |= {SERVER_ADDRESS: env.server[0], SERVER_PORT: env.server[1]}
    return attributes


def _branch_attributes(context: RunContext[Any]) -> dict[str, str]:
    attributes = {GEN_AI_CONVERSATION_ID: context.session_id, AGENT_HINTS_BRANCH: context.branch}
    if context.parent_branch is not None:
        attributes[AGENT_HINTS_PARENT_BRANCH] = context.parent_branch
    return attributes


def system_prompt(instructions: str | None) -> list[Message]:
    return [{"role": "system", "content": instructions}] if instructions else []


def _task(instructions: str | None, task: list[Message]) -> list[Message]:
    """A forked child's opening: its instructions ride in the user turn, not the system
    prompt, which belongs to the shared prefix."""
    if not instructions:
        return task
    if len(task) == 1 and task[0]["role"] == "user" and isinstance(task[0].get("content"), str):
        return [{"role": "user", "content": f"{instructions}\n\n{task[0]['content']}"}]
    return [{"role": "user", "content": instructions}, *task]
