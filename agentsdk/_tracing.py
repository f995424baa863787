"""OpenTelemetry spans per the GenAI semantic conventions, plus the hint attributes.

Only ``opentelemetry-api`` is used: without a configured tracer provider every span is a
no-op. The attribute names are constants here because the semconv package has deprecated
its GEN_AI constants (they moved to a separate conventions repository).
"""

from __future__ import annotations

from opentelemetry.trace import Tracer, TracerProvider, get_tracer

from hints_spec import OTEL_CONVERSATION_ID

__all__ = [
    "AGENT_HINTS_BRANCH",
    "AGENT_HINTS_FORK_CHILDREN",
    "AGENT_HINTS_GAP",
    "AGENT_HINTS_PARENT_BRANCH",
    "AGENT_HINTS_TOOL_ETA",
    "ERROR_TYPE",
    "GEN_AI_AGENT_NAME",
    "GEN_AI_CONVERSATION_ID",
    "GEN_AI_OPERATION_NAME",
    "GEN_AI_PROVIDER_NAME",
    "GEN_AI_REQUEST_MODEL",
    "GEN_AI_RESPONSE_FINISH_REASONS",
    "GEN_AI_RESPONSE_MODEL",
    "GEN_AI_TOOL_CALL_ID",
    "GEN_AI_TOOL_NAME",
    "GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS",
    "GEN_AI_USAGE_INPUT_TOKENS",
    "GEN_AI_USAGE_OUTPUT_TOKENS",
    "tracer",
]

GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_CONVERSATION_ID = OTEL_CONVERSATION_ID
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
ERROR_TYPE = "error.type"

AGENT_HINTS_BRANCH = "agent_hints.branch"
AGENT_HINTS_PARENT_BRANCH = "agent_hints.parent_branch"
AGENT_HINTS_GAP = "agent_hints.gap"
AGENT_HINTS_TOOL_ETA = "agent_hints.tool.eta"
AGENT_HINTS_FORK_CHILDREN = "agent_hints.fork.children"


def tracer(provider: TracerProvider | None) -> Tracer:
    """The SDK's tracer from ``provider``, else from the global provider (no-op by default)."""
    return get_tracer("agentsdk", tracer_provider=provider)
