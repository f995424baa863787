"""OpenTelemetry spans per the GenAI conventions, and a no-op without a provider."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from agentsdk import Agent, RunConfig, Runner, ScriptedCall, ScriptedModel, tool
from agentsdk._tracing import (
    AGENT_HINTS_BRANCH,
    AGENT_HINTS_FORK_CHILDREN,
    AGENT_HINTS_GAP,
    AGENT_HINTS_PARENT_BRANCH,
    AGENT_HINTS_TOOL_ETA,
    ERROR_TYPE,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
)

pytestmark = pytest.mark.anyio


@tool
def flaky() -> str:
    raise OSError("gone")


def _spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def test_spans_follow_genai_conventions() -> None:
    helper = Agent(name="helper")
    agent = Agent(name="lead", model="tiny", tools=[flaky, helper.as_tool()])
    model = ScriptedModel(
        [
            [ScriptedCall("flaky", id="c1"), ScriptedCall("helper", {"input": "hi"}, id="c2")],
            "child answer",
            "done",
        ]
    )
    provider, exporter = _spans()
    result = await Runner.run(
        agent, "go", client=model, run_config=RunConfig(tracer_provider=provider)
    )
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {
        "invoke_agent lead",
        "invoke_agent helper",
        "chat tiny",
        "execute_tool flaky",
        "execute_tool helper",
    }
    by_name: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        by_name.setdefault(span.name, []).append(span)
    chats = by_name["chat tiny"]
    assert len(chats) == 3
    first = chats[0]
    assert first.kind is SpanKind.CLIENT
    attrs = dict(first.attributes or {})
    assert attrs[GEN_AI_OPERATION_NAME] == "chat"
    assert attrs[GEN_AI_REQUEST_MODEL] == "tiny"
    assert attrs[GEN_AI_CONVERSATION_ID] == result.session_id
    assert attrs[AGENT_HINTS_BRANCH] == "root"
    assert attrs[AGENT_HINTS_GAP] == 1.0
    assert attrs[GEN_AI_USAGE_INPUT_TOKENS] == model.requests[0].prompt_tokens
    output_tokens = attrs[GEN_AI_USAGE_OUTPUT_TOKENS]
    assert isinstance(output_tokens, int) and output_tokens > 0
    assert GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS in attrs
    child_chat = next(s for s in chats if (s.attributes or {})[AGENT_HINTS_BRANCH] != "root")
    assert (child_chat.attributes or {})[AGENT_HINTS_PARENT_BRANCH] == "root"

    failed = spans["execute_tool flaky"]
    assert failed.status.status_code is StatusCode.ERROR
    assert (failed.attributes or {})[ERROR_TYPE] == "OSError"
    assert (failed.attributes or {})[GEN_AI_TOOL_CALL_ID] == "c1"
    assert (failed.attributes or {})[AGENT_HINTS_TOOL_ETA] == 1.0
    delegate = spans["execute_tool helper"]
    assert (delegate.attributes or {})[AGENT_HINTS_FORK_CHILDREN] == ("root/helper-1",)

    # Nesting: tool spans and the child agent live under the parent's agent span.
    root_agent = spans["invoke_agent lead"]
    assert root_agent.parent is None
    assert failed.parent is not None and failed.parent.span_id == root_agent.context.span_id
    child_agent = spans["invoke_agent helper"]
    assert child_agent.parent is not None and child_agent.parent.span_id == delegate.context.span_id


async def test_no_provider_means_no_op() -> None:
    result = await Runner.run(Agent(name="a", model="m"), "x", client=ScriptedModel(["ok"]))
    assert result.final_output == "ok"
