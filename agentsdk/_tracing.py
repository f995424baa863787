"""OpenTelemetry spans and metrics per the GenAI semantic conventions, plus the hint
attributes.

Only ``opentelemetry-api`` is used: without a configured tracer (meter) provider every
span (instrument) is a no-op. The attribute names are constants here because the semconv
package has deprecated its GEN_AI constants (they moved to a separate conventions
repository).
"""

from __future__ import annotations

from opentelemetry.metrics import Histogram, MeterProvider, get_meter
from opentelemetry.trace import Tracer, TracerProvider, get_tracer

from hints_spec import OTEL_CONVERSATION_ID

__all__ = [
    "AGENT_HINTS_BRANCH",
    "AGENT_HINTS_FORK_CHILDREN",
    "AGENT_HINTS_GAP",
    "AGENT_HINTS_PARENT_BRANCH",
    "AGENT_HINTS_TOOL_ETA",
    "ERROR_TYPE",
    "GEN_AI_AGENT_DESCRIPTION",
    "GEN_AI_AGENT_NAME",
    "GEN_AI_CONVERSATION_ID",
    "GEN_AI_OPERATION_NAME",
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
    "SERVER_ADDRESS",
    "SERVER_PORT",
    "ClientMetrics",
    "tracer",
]

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
    return get_tracer("agentsdk", tracer_provider=provider)


class ClientMetrics:
    """The GenAI client instruments: token usage and operation duration histograms."""

    def __init__(self, provider: MeterProvider | None) -> None:
        meter = get_meter("agentsdk", meter_provider=provider)
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
