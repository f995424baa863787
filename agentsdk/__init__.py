"""A session-aware agent SDK: agents, tools and runs that tell the server what comes next.

The client half (``HintedAsyncOpenAI``, ``hint_scope``, ``ControlChannel``) makes any
OpenAI-compatible call carry agent hints; the agent half (``Agent``, ``tool``, ``Runner``)
fills them in automatically: session, branch, fork, expected tool gap, end.
"""

from ._agent import Agent
from ._client import HintedAsyncOpenAI, HintedOpenAI
from ._config import ModelSettings, RunConfig, ToolChoice
from ._context import RunContext
from ._control import ControlChannel
from ._errors import AgentsError, MaxTurnsExceeded, ModelCallError, ToolDefinitionError
from ._hooks import RunHooks
from ._items import (
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
from ._run import DEFAULT_MAX_TURNS, AgentInput, Runner
from ._scope import HintArgumentError, current_hints, hint_scope
from ._session import InMemorySession, Session, SessionStats, SQLiteSession
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
    "DEFAULT_MAX_TURNS",
    "Agent",
    "AgentEndEvent",
    "AgentInput",
    "AgentStartEvent",
    "AgentsError",
    "ControlChannel",
    "ControlRecord",
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
    "ModelClient",
    "ModelRequest",
    "ModelSettings",
    "Reply",
    "RunConfig",
    "RunContext",
    "RunHooks",
    "RunItem",
    "RunItemEvent",
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
    "Usage",
    "current_hints",
    "hint_scope",
    "tool",
]
