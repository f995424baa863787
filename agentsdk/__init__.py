"""A session-aware agent SDK: agents, tools and runs that tell the server what comes next.

The client half (``HintedAsyncOpenAI``, ``hint_scope``, ``ControlChannel``) makes any
OpenAI-compatible call carry agent hints; the agent half (``Agent``, ``tool``, ``Runner``)
fills them in automatically: session, branch, fork, expected tool gap, end.
"""

from ._agent import Agent, AgentTool
from ._client import HintedAsyncOpenAI, HintedOpenAI
from ._config import (
    DEFAULT_MAX_FORK_DEPTH,
    DEFAULT_MAX_MODEL_CALLS,
    ModelSettings,
    RunConfig,
    ToolChoice,
)
from ._context import RunContext
from ._control import ControlChannel, ControlSender
from ._errors import (
    AgentsError,
    ForkDepthExceeded,
    MaxTurnsExceeded,
    ModelCallError,
    ModelCallLimitExceeded,
    NoSessionWarning,
    OutputValidationError,
    RunLimitExceeded,
    ToolDefinitionError,
    UnhintedClientWarning,
    UserError,
)
from ._hooks import RunHooks
from ._items import (
    AgentInput,
    Message,
    MessageOutputItem,
    RunItem,
    ToolCall,
    ToolCallItem,
    ToolCallOutputItem,
)
from ._latency import LatencyEstimator, LatencyStats
from ._model import ModelClient
from ._result import RunResult
from ._run import DEFAULT_MAX_TURNS, Runner
from ._scope import ContextThreadPoolExecutor, HintArgumentError, current_hints, hint_scope
from ._session import SCHEMA_VERSION, InMemorySession, Session, SessionStats, SQLiteSession
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
from ._testing import ControlRecord, ModelRequest, Reply, ScriptedCall, ScriptedModel
from ._tool import Tool, tool
from ._usage import Usage

__all__ = [
    "DEFAULT_MAX_FORK_DEPTH",
    "DEFAULT_MAX_MODEL_CALLS",
    "DEFAULT_MAX_TURNS",
    "SCHEMA_VERSION",
    "Agent",
    "AgentEndEvent",
    "AgentInput",
    "AgentStartEvent",
    "AgentTool",
    "AgentsError",
    "ContextThreadPoolExecutor",
    "ControlChannel",
    "ControlRecord",
    "ControlSender",
    "ForkDepthExceeded",
    "ForkEvent",
    "HintArgumentError",
    "HintedAsyncOpenAI",
    "HintedOpenAI",
    "InMemorySession",
    "LLMEndEvent",
    "LLMStartEvent",
    "LatencyEstimator",
    "LatencyStats",
    "MaxTurnsExceeded",
    "Message",
    "MessageOutputItem",
    "ModelCallError",
    "ModelCallLimitExceeded",
    "ModelClient",
    "ModelRequest",
    "ModelSettings",
    "NoSessionWarning",
    "OutputValidationError",
    "Reply",
    "RunConfig",
    "RunContext",
    "RunHooks",
    "RunItem",
    "RunItemEvent",
    "RunLimitExceeded",
    "RunResult",
    "RunResultStreaming",
    "Runner",
    "SQLiteSession",
    "ScriptedCall",
    "ScriptedModel",
    "Session",
    "SessionStats",
    "StreamEvent",
    "Tool",
    "ToolCall",
    "ToolCallItem",
    "ToolCallOutputItem",
    "ToolChoice",
    "ToolDefinitionError",
    "ToolEndEvent",
    "ToolStartEvent",
    "UnhintedClientWarning",
    "Usage",
    "UserError",
    "current_hints",
    "hint_scope",
    "tool",
]
