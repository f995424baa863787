"""One branch's loop: model call, the response's tool calls (``_tool_run``), repeat.

Every request of a branch goes out inside a ``hint_scope`` carrying the session, the
branch and its parent, and ``gap``: the wait the loop expects after the response if it
ends in tool calls (the pooled latency estimate of the agent's tools). Between requests
the loop tells the server what it is doing through control events (tool start with an
ETA, tool end, fork, end), which are fire-and-forget and never delay the loop.

Prefix discipline: a branch's messages are only ever appended to, tool definitions are
built once per branch, and nothing per-request enters either, so each request's prompt
extends the previous one and the server's prefix cache can serve it. Each complete turn
is stored in the session as it ends (persistence), so a failed run never leaves a tool
call without its output there. Forks between branches are ``_fork``'s.
"""

from __future__ import annotations

import time
from typing import Any

from openai.types.chat import ChatCompletion
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind
from opentelemetry.util.types import AttributeValue

from ._env import BranchContext, wire
from ._errors import (
    MaxTurnsExceeded,
    ModelCallError,
    UserError,
)
from ._items import (
    Message,
    MessageOutputItem,
    RunItem,
    ToolCall,
    ToolCallItem,
)
from ._model import create_completion
from ._result import RunResult
from ._scope import hint_scope
from ._session import Session
from ._stream import (
    AgentEndEvent,
    AgentStartEvent,
    LLMEndEvent,
    LLMStartEvent,
    RunItemEvent,
)
from ._tool import parse_arguments
from ._tool_run import Wait, run_tools
from ._tracing import (
    AGENT_HINTS_GAP,
    ERROR_TYPE,
    GEN_AI_AGENT_DESCRIPTION,
    GEN_AI_AGENT_NAME,
    GEN_AI_OPERATION_NAME,
    GEN_AI_OUTPUT_TYPE,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_ID,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_TOKEN_TYPE,
    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    PROVIDER_NAME,
    SERVER_ADDRESS,
    SERVER_PORT,
    branch_attributes,
    error_type,
    input_content,
    operation_attributes,
    output_content,
)
from ._usage import Usage

__all__ = ["run_agent"]


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
        **operation_attributes(
            context.model, context._branch.agent.model_settings, context._branch.env.server
        ),
        **branch_attributes(context),
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
            waited: Wait | None = None
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
                outputs, durations = await run_tools(context, calls)
                waited = Wait(responded, durations) if durations else None
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
            span.set_attribute(ERROR_TYPE, error_type(err))
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
        **operation_attributes(
            context.model, context._branch.agent.model_settings, context._branch.env.server
        ),
        **branch_attributes(context),
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
            metric_attributes[ERROR_TYPE] = error_type(err)
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


def _operation_attributes(context: BranchContext) -> dict[str, AttributeValue]:
    branch = context._branch
    return operation_attributes(context.model, branch.agent.model_settings, branch.env.server)
