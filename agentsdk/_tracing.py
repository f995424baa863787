"""OpenTelemetry spans and metrics per the GenAI semantic conventions, plus the hint
attributes.

Only ``opentelemetry-api`` is used: without a configured tracer (meter) provider every
span (instrument) is a no-op. The attribute names are constants here because the semconv
package has deprecated its GEN_AI constants (they moved to a separate conventions
repository). Message content (``gen_ai.input.messages``, ``gen_ai.output.messages``,
``gen_ai.system_instructions``) is recorded only when opted in, as the conventions ask:
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` (or ``span_only`` /
``span_and_event``).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from openai.types.chat import ChatCompletion
from opentelemetry.metrics import Histogram, MeterProvider, get_meter
from opentelemetry.trace import Tracer, TracerProvider, get_tracer
from opentelemetry.util.types import AttributeValue

from hints_spec import OTEL_CONVERSATION_ID

from ._context import RunContext
from ._errors import ModelCallError

if TYPE_CHECKING:
    from ._config import ModelSettings

__all__ = [
    "AGENT_HINTS_BRANCH",
    "AGENT_HINTS_FORK_CHILDREN",
    "AGENT_HINTS_GAP",
    "AGENT_HINTS_PARENT_BRANCH",
    "AGENT_HINTS_TOOL_ETA",
    "CAPTURE_CONTENT_ENV",
    "ERROR_TYPE",
    "GEN_AI_AGENT_DESCRIPTION",
    "GEN_AI_AGENT_NAME",
    "GEN_AI_CONVERSATION_ID",
    "GEN_AI_INPUT_MESSAGES",
    "GEN_AI_OPERATION_NAME",
    "GEN_AI_OUTPUT_MESSAGES",
    "GEN_AI_OUTPUT_TYPE",
    "GEN_AI_PROVIDER_NAME",
    "GEN_AI_REQUEST_MAX_TOKENS",
    "GEN_AI_REQUEST_MODEL",
    "GEN_AI_REQUEST_SEED",
    "GEN_AI_REQUEST_TEMPERATURE",
    "GEN_AI_REQUEST_TOP_P",
    "GEN_AI_RESPONSE_FINISH_REASONS",
    "GEN_AI_RESPONSE_ID",
    "GEN_AI_RESPONSE_MODEL",
    "GEN_AI_SYSTEM_INSTRUCTIONS",
    "GEN_AI_TOKEN_TYPE",
    "GEN_AI_TOOL_CALL_ID",
    "GEN_AI_TOOL_DESCRIPTION",
    "GEN_AI_TOOL_NAME",
    "GEN_AI_TOOL_TYPE",
    "GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS",
    "GEN_AI_USAGE_INPUT_TOKENS",
    "GEN_AI_USAGE_OUTPUT_TOKENS",
    "METRIC_OPERATION_DURATION",
    "METRIC_TOKEN_USAGE",
    "PROVIDER_NAME",
    "SCHEMA_URL",
    "SERVER_ADDRESS",
    "SERVER_PORT",
    "VERSION",
    "ClientMetrics",
    "branch_attributes",
    "capture_content",
    "error_type",
    "input_content",
    "operation_attributes",
    "output_content",
    "tracer",
]

SCHEMA_URL = "https://opentelemetry.io/schemas/1.40.0"
"""The semantic conventions the names below follow (the instrumentation scope's schema)."""

try:
    VERSION = importlib.metadata.version("agent-hints")
except importlib.metadata.PackageNotFoundError:  # run from a source tree never installed
    VERSION = "0+unknown"

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_CAPTURE_VALUES = frozenset({"true", "1", "span_only", "span_and_event"})
_INSTRUCTION_ROLES = ("system", "developer")

GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_OUTPUT_TYPE = "gen_ai.output.type"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_CONVERSATION_ID = OTEL_CONVERSATION_ID
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_AGENT_DESCRIPTION = "gen_ai.agent.description"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_DESCRIPTION = "gen_ai.tool.description"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"

PROVIDER_NAME = "openai"
"""The API the runs speak (any OpenAI-compatible server: vLLM, OpenAI, ...)."""

METRIC_TOKEN_USAGE = "gen_ai.client.token.usage"
METRIC_OPERATION_DURATION = "gen_ai.client.operation.duration"
# The conventions' advisory bucket boundaries.
_TOKEN_BUCKETS = [4.0**i for i in range(14)]
_DURATION_BUCKETS = [0.01 * 2.0**i for i in range(14)]

AGENT_HINTS_BRANCH = "agent_hints.branch"
AGENT_HINTS_PARENT_BRANCH = "agent_hints.parent_branch"
AGENT_HINTS_GAP = "agent_hints.gap"
AGENT_HINTS_TOOL_ETA = "agent_hints.tool.eta"
AGENT_HINTS_FORK_CHILDREN = "agent_hints.fork.children"


def tracer(provider: TracerProvider | None) -> Tracer:
    """The SDK's tracer from ``provider``, else from the global provider (no-op by default)."""
    return get_tracer("agentsdk", VERSION, tracer_provider=provider, schema_url=SCHEMA_URL)


def capture_content() -> bool:
    """Whether the user opted in to message content on spans (the conventions' variable)."""
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() in _CAPTURE_VALUES


def input_content(messages: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """``gen_ai.system_instructions`` and ``gen_ai.input.messages`` of a request, as JSON
    in the conventions' shape (role and parts)."""
    system = [m for m in messages if m.get("role") in _INSTRUCTION_ROLES]
    others = [_message(m) for m in messages if m.get("role") not in _INSTRUCTION_ROLES]
    attributes = {GEN_AI_INPUT_MESSAGES: json.dumps(others, ensure_ascii=False)}
    if system:
        parts = [part for m in system for part in _message(m)["parts"]]
        attributes[GEN_AI_SYSTEM_INSTRUCTIONS] = json.dumps(parts, ensure_ascii=False)
    return attributes


def output_content(response: ChatCompletion) -> dict[str, str]:
    """``gen_ai.output.messages`` of a response, as JSON in the conventions' shape."""
    messages = [
        {**_message(c.message.model_dump(exclude_none=True)), "finish_reason": c.finish_reason}
        for c in response.choices
    ]
    return {GEN_AI_OUTPUT_MESSAGES: json.dumps(messages, ensure_ascii=False)}


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    """One chat message as the conventions' ``{"role", "parts"}``."""
    role = message.get("role")
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    if role == "tool":
        parts.append(
            {"type": "tool_call_response", "id": message.get("tool_call_id"), "response": content}
        )
    elif isinstance(content, str):
        parts.append({"type": "text", "content": content})
    elif isinstance(content, list):
        parts += [
            {"type": "text", "content": p.get("text")} if p.get("type") == "text" else dict(p)
            for p in content
            if isinstance(p, Mapping)
        ]
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        try:
            arguments: object = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = function.get("arguments")
        parts.append(
            {
                "type": "tool_call",
                "id": call.get("id"),
                "name": function.get("name"),
                "arguments": arguments,
            }
        )
    return {"role": role, "parts": parts}


class ClientMetrics:
    """The GenAI client instruments: token usage and operation duration histograms."""

    def __init__(self, provider: MeterProvider | None) -> None:
        meter = get_meter("agentsdk", VERSION, meter_provider=provider, schema_url=SCHEMA_URL)
        self.token_usage: Histogram = meter.create_histogram(
            METRIC_TOKEN_USAGE,
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        )
        self.operation_duration: Histogram = meter.create_histogram(
            METRIC_OPERATION_DURATION,
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )


def error_type(err: Exception) -> str:
    """``error.type``: the failure's own class (a model call's: the client's exception)."""
    cause = err.__cause__ if isinstance(err, ModelCallError) and err.__cause__ else err
    return type(cause).__qualname__


def operation_attributes(
    model: str, settings: ModelSettings, server: tuple[str, int] | None
) -> dict[str, AttributeValue]:
    """What ``invoke_agent`` and ``chat`` spans say of the requests: provider, model, the
    sampling parameters that are set, and the server."""
    attributes: dict[str, AttributeValue] = {
        GEN_AI_PROVIDER_NAME: PROVIDER_NAME,
        GEN_AI_REQUEST_MODEL: model,
    }
    for key, value in (
        (GEN_AI_REQUEST_TEMPERATURE, settings.temperature),
        (GEN_AI_REQUEST_TOP_P, settings.top_p),
        (GEN_AI_REQUEST_MAX_TOKENS, settings.max_tokens),
        (GEN_AI_REQUEST_SEED, settings.seed),
    ):
        if value is not None:
            attributes[key] = value
    if server is not None:
        attributes |= {SERVER_ADDRESS: server[0], SERVER_PORT: server[1]}
    return attributes


def branch_attributes(context: RunContext[Any]) -> dict[str, str]:
    """The session, the branch and its parent, on every span of a branch."""
    attributes = {GEN_AI_CONVERSATION_ID: context.session_id, AGENT_HINTS_BRANCH: context.branch}
    if context.parent_branch is not None:
        attributes[AGENT_HINTS_PARENT_BRANCH] = context.parent_branch
    return attributes
