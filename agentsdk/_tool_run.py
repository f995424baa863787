"""Tool execution: the calls of one response, concurrently and bounded, each in its
``execute_tool`` span; a failing call is a message to the model (and a warning in the
developer's log), never the end of the run. ``tool_start`` events (with their ETAs) go
out before the calls run."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

import anyio
from opentelemetry.trace import Status, StatusCode
from opentelemetry.util.types import AttributeValue
from pydantic import BaseModel

from hints_spec import (
    ToolStart,
)

from ._agent import AgentTool
from ._env import FATAL, Branch, BranchContext, RunEnv, wire
from ._fork import spawn
from ._items import (
    ToolCall,
    ToolCallOutputItem,
)
from ._latency import LatencyEstimator
from ._stream import (
    RunItemEvent,
    ToolEndEvent,
    ToolStartEvent,
)
from ._tool import Tool, ToolArgumentsError, tool_output
from ._tracing import (
    AGENT_HINTS_TOOL_ETA,
    ERROR_TYPE,
    GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_DESCRIPTION,
    GEN_AI_TOOL_NAME,
    GEN_AI_TOOL_TYPE,
    branch_attributes,
)

_log = logging.getLogger(__name__)

__all__ = ["Wait", "run_tools"]


@dataclass(frozen=True, slots=True)
class Wait:
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


async def run_tools(
    context: BranchContext, calls: list[ToolCall]
) -> tuple[list[ToolCallOutputItem], dict[str, float]]:
    """Run one response's calls concurrently (capped); results in call order,
    and the longest duration of each tool that ran (``Wait``)."""
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
        **branch_attributes(context),
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
        except FATAL:
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
