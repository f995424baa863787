"""OpenTelemetry spans per the GenAI conventions, and a no-op without a provider."""

from __future__ import annotations

import importlib.metadata
import json

import httpx2
import openai
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from agentsdk import (
    Agent,
    ModelCallError,
    ModelSettings,
    RunConfig,
    Runner,
    ScriptedCall,
    ScriptedModel,
    tool,
)
from agentsdk._tracing import (
    AGENT_HINTS_BRANCH,
    AGENT_HINTS_FORK_CHILDREN,
    AGENT_HINTS_GAP,
    AGENT_HINTS_PARENT_BRANCH,
    AGENT_HINTS_TOOL_ETA,
    CAPTURE_CONTENT_ENV,
    ERROR_TYPE,
    GEN_AI_AGENT_DESCRIPTION,
    GEN_AI_AGENT_NAME,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_INPUT_MESSAGES,
    GEN_AI_OPERATION_NAME,
    GEN_AI_OUTPUT_MESSAGES,
    GEN_AI_OUTPUT_TYPE,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MAX_TOKENS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_REQUEST_SEED,
    GEN_AI_REQUEST_TEMPERATURE,
    GEN_AI_REQUEST_TOP_P,
    GEN_AI_RESPONSE_ID,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_SYSTEM_INSTRUCTIONS,
    GEN_AI_TOKEN_TYPE,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_DESCRIPTION,
    GEN_AI_TOOL_NAME,
    GEN_AI_TOOL_TYPE,
    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    SCHEMA_URL,
    SERVER_ADDRESS,
    SERVER_PORT,
    VERSION,
)

from sdk_calls import FakeServer, chat_reply

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


def _span_of(traceparent: str) -> tuple[int, int]:
    """(trace id, span id) of a W3C ``traceparent`` header."""
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00" and int(flags, 16) & 1  # sampled
    return int(trace_id, 16), int(span_id, 16)


@tool(description="Run the test suite.")
def run_tests() -> str:
    return "3 passed"


async def test_one_run_carries_the_required_genai_attributes_and_joins_traces() -> None:
    server = FakeServer([chat_reply(tool="run_tests"), chat_reply("fixed")])
    agent = Agent(
        name="coder",
        description="Fixes bugs.",
        model="tiny",
        tools=[run_tests],
        model_settings=ModelSettings(
            tool_choice=["run_tests"], temperature=0.2, top_p=0.9, max_tokens=64, seed=7
        ),
    )
    provider, exporter = _spans()
    async with server.client() as client:
        result = await Runner.run(
            agent, "fix", client=client, run_config=RunConfig(tracer_provider=provider)
        )
    spans = exporter.get_finished_spans()
    chats = [s for s in spans if s.name == "chat tiny"]
    [invoke] = [s for s in spans if s.name == "invoke_agent coder"]
    [execute] = [s for s in spans if s.name == "execute_tool run_tests"]
    request_attributes = {
        GEN_AI_PROVIDER_NAME: "openai",
        GEN_AI_REQUEST_MODEL: "tiny",
        GEN_AI_CONVERSATION_ID: result.session_id,
        GEN_AI_REQUEST_TEMPERATURE: 0.2,
        GEN_AI_REQUEST_TOP_P: 0.9,
        GEN_AI_REQUEST_MAX_TOKENS: 64,
        GEN_AI_REQUEST_SEED: 7,
        SERVER_ADDRESS: "model.test",
        SERVER_PORT: 8000,
    }
    for chat in chats:
        attributes = dict(chat.attributes or {})
        assert attributes.items() >= {GEN_AI_OPERATION_NAME: "chat", **request_attributes}.items()
        assert attributes[GEN_AI_RESPONSE_ID] == "chatcmpl-1"
        assert attributes[GEN_AI_RESPONSE_MODEL] == "tiny"
        assert attributes[GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 64
        assert ERROR_TYPE not in attributes and GEN_AI_OUTPUT_TYPE not in attributes
    invoke_attributes = dict(invoke.attributes or {})
    assert (
        invoke_attributes.items()
        >= {
            GEN_AI_OPERATION_NAME: "invoke_agent",
            GEN_AI_AGENT_NAME: "coder",
            GEN_AI_AGENT_DESCRIPTION: "Fixes bugs.",
            **request_attributes,
        }.items()
    )
    assert invoke_attributes[GEN_AI_USAGE_INPUT_TOKENS] == 200
    assert (
        dict(execute.attributes or {}).items()
        >= {
            GEN_AI_OPERATION_NAME: "execute_tool",
            GEN_AI_TOOL_NAME: "run_tests",
            GEN_AI_TOOL_TYPE: "function",
            GEN_AI_TOOL_CALL_ID: "call-run_tests",
            GEN_AI_TOOL_DESCRIPTION: "Run the test suite.",
        }.items()
    )
    # Every model call carries its chat span as traceparent: the server's span joins it.
    sent = [_span_of(headers["traceparent"]) for headers, _ in server.chats]
    assert sent == [(chat.context.trace_id, chat.context.span_id) for chat in chats]
    # And every control event, the span of the run that caused it.
    run_spans = {invoke.context.span_id, execute.context.span_id}
    for headers, _ in server.control:
        trace_id, span_id = _span_of(headers["traceparent"])
        assert trace_id == invoke.context.trace_id and span_id in run_spans
    assert [e["type"] for e in server.events()] == ["tool_start", "end"]


async def test_failed_calls_carry_error_type() -> None:
    error = openai.APITimeoutError(request=httpx2.Request("POST", "http://model/v1"))
    provider, exporter = _spans()
    with pytest.raises(ModelCallError):
        await Runner.run(
            Agent(name="a", model="m"),
            "x",
            client=ScriptedModel([error]),
            run_config=RunConfig(tracer_provider=provider),
        )
    spans = {s.name: s for s in exporter.get_finished_spans()}
    for name in ("chat m", "invoke_agent a"):
        assert (spans[name].attributes or {})[ERROR_TYPE] == "APITimeoutError"
        assert spans[name].status.status_code is StatusCode.ERROR


def _points(reader: InMemoryMetricReader) -> dict[str, list[HistogramDataPoint]]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: list(metric.data.data_points)  # type: ignore[arg-type]
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }


async def test_genai_client_metrics_with_a_meter_provider() -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    server = FakeServer([chat_reply(tool="run_tests"), chat_reply("fixed")])
    agent = Agent(
        name="coder",
        model="tiny",
        tools=[run_tests],
        model_settings=ModelSettings(tool_choice=["run_tests"]),
    )
    async with server.client() as client:
        await Runner.run(agent, "fix", client=client, run_config=RunConfig(meter_provider=meters))
    error = openai.APITimeoutError(request=httpx2.Request("POST", "http://model/v1"))
    with pytest.raises(ModelCallError):
        await Runner.run(
            Agent(name="a", model="m"),
            "x",
            client=ScriptedModel([error]),
            run_config=RunConfig(meter_provider=meters),
        )
    points = _points(reader)
    tokens = {
        (p.attributes or {})[GEN_AI_TOKEN_TYPE]: p for p in points["gen_ai.client.token.usage"]
    }
    assert tokens["input"].sum == 200 and tokens["input"].count == 2
    assert tokens["output"].sum == 10
    assert (
        dict(tokens["input"].attributes or {}).items()
        >= {
            GEN_AI_OPERATION_NAME: "chat",
            GEN_AI_PROVIDER_NAME: "openai",
            GEN_AI_REQUEST_MODEL: "tiny",
            GEN_AI_RESPONSE_MODEL: "tiny",
            SERVER_ADDRESS: "model.test",
            SERVER_PORT: 8000,
        }.items()
    )
    durations = points["gen_ai.client.operation.duration"]
    ok = next(p for p in durations if ERROR_TYPE not in (p.attributes or {}))
    failed = next(p for p in durations if ERROR_TYPE in (p.attributes or {}))
    assert ok.count == 2 and ok.sum > 0
    assert (failed.attributes or {})[ERROR_TYPE] == "APITimeoutError"


@tool
def broken() -> str:
    """Fail."""
    raise OSError("disk full")


async def test_scope_version_schema_and_exception_events_on_failing_tools() -> None:
    provider, exporter = _spans()
    model = ScriptedModel([[ScriptedCall("broken")], "sorry"])
    agent = Agent(name="coder", model="tiny", tools=[broken])
    await Runner.run(agent, "go", client=model, run_config=RunConfig(tracer_provider=provider))
    spans = exporter.get_finished_spans()
    scope = spans[0].instrumentation_scope
    assert scope is not None
    assert (scope.name, scope.version, scope.schema_url) == ("agentsdk", VERSION, SCHEMA_URL)
    assert importlib.metadata.version("agent-hints") == VERSION
    [failed] = [s for s in spans if s.name == "execute_tool broken"]
    [event] = failed.events
    assert event.name == "exception" and event.attributes is not None
    assert event.attributes["exception.type"] == "OSError"
    assert "disk full" in str(event.attributes["exception.message"])
    reader = InMemoryMetricReader()
    await Runner.run(
        agent,
        "go",
        client=ScriptedModel(["fine"]),
        run_config=RunConfig(meter_provider=MeterProvider(metric_readers=[reader])),
    )
    data = reader.get_metrics_data()
    assert data is not None
    meter_scope = data.resource_metrics[0].scope_metrics[0].scope
    assert (meter_scope.version, meter_scope.schema_url) == (VERSION, SCHEMA_URL)


@pytest.mark.parametrize("opt_in", [None, "true", "SPAN_ONLY"])
async def test_message_content_only_when_opted_in(
    monkeypatch: pytest.MonkeyPatch, opt_in: str | None
) -> None:
    if opt_in is not None:
        monkeypatch.setenv(CAPTURE_CONTENT_ENV, opt_in)
    else:
        monkeypatch.delenv(CAPTURE_CONTENT_ENV, raising=False)
    provider, exporter = _spans()
    model = ScriptedModel([[ScriptedCall("run_tests")], "all green"])
    agent = Agent(name="coder", instructions="Fix.", model="tiny", tools=[run_tests])
    await Runner.run(agent, "go", client=model, run_config=RunConfig(tracer_provider=provider))
    chats = [s for s in exporter.get_finished_spans() if s.name == "chat tiny"]
    attributes = [dict(s.attributes or {}) for s in chats]
    if opt_in is None:  # off by default
        assert not any(
            GEN_AI_INPUT_MESSAGES in a or GEN_AI_OUTPUT_MESSAGES in a for a in attributes
        )
        return
    first, second = attributes
    assert json.loads(str(first[GEN_AI_SYSTEM_INSTRUCTIONS])) == [
        {"type": "text", "content": "Fix."}
    ]
    assert json.loads(str(first[GEN_AI_INPUT_MESSAGES])) == [
        {"role": "user", "parts": [{"type": "text", "content": "go"}]}
    ]
    [called] = json.loads(str(first[GEN_AI_OUTPUT_MESSAGES]))
    assert called["finish_reason"] == "tool_calls"
    assert [(p["type"], p["name"]) for p in called["parts"] if p["type"] == "tool_call"] == [
        ("tool_call", "run_tests")
    ]
    replies = json.loads(str(second[GEN_AI_INPUT_MESSAGES]))
    assert replies[-1]["role"] == "tool" and replies[-1]["parts"][0]["type"] == "tool_call_response"
    [answer] = json.loads(str(second[GEN_AI_OUTPUT_MESSAGES]))
    assert answer["parts"] == [{"type": "text", "content": "all green"}]
