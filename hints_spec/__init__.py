"""Agent hints protocol v1: the reference codec for SPEC.md.

Every parser raises :class:`HintError` and nothing else, so a server can ignore and
count a bad hint with one ``except`` clause and serve the request as if it had none.
Names, limits, outcomes and the plain event types live in ``hints_spec.core``
(stdlib only), which the policy and the benchmarks import.
"""

from ._body import parse_body
from ._control import (
    ControlEvent,
    ControlRequest,
    ControlResponse,
    End,
    EventResult,
    Fork,
    ToolEnd,
    ToolStart,
    parse_control,
    to_event,
)
from ._envelope import (
    KV_HINTS_ACTION_TYPE,
    KV_HINTS_ACTION_VERSION,
    KV_HINTS_PROTOCOL_VERSION,
    SessionAction,
    find_session_action,
    from_kv_hints_action,
    to_kv_hints_action,
    to_kv_hints_envelope,
)
from ._errors import HintError, HintErrorCode
from ._header import combine_field_lines, parse_header, serialize_header
from ._interop import OTEL_CONVERSATION_ID, SESSION_HEADER, from_interop, merge_hints
from ._model import ID_PATTERN, AgentHints
from ._resolve import resolve_hints
from .core import (
    BODY_FIELD,
    CONTROL_PATH,
    HEADER_NAME,
    MAX_CHILDREN,
    MAX_EVENTS,
    MAX_ID_LENGTH,
    MAX_SECONDS,
    PROTOCOL_VERSION,
    ROOT_BRANCH,
    USER_TOOL,
    Outcome,
)

__all__ = [
    "BODY_FIELD",
    "CONTROL_PATH",
    "HEADER_NAME",
    "ID_PATTERN",
    "KV_HINTS_ACTION_TYPE",
    "KV_HINTS_ACTION_VERSION",
    "KV_HINTS_PROTOCOL_VERSION",
    "MAX_CHILDREN",
    "MAX_EVENTS",
    "MAX_ID_LENGTH",
    "MAX_SECONDS",
    "OTEL_CONVERSATION_ID",
    "PROTOCOL_VERSION",
    "ROOT_BRANCH",
    "SESSION_HEADER",
    "USER_TOOL",
    "AgentHints",
    "ControlEvent",
    "ControlRequest",
    "ControlResponse",
    "End",
    "EventResult",
    "Fork",
    "HintError",
    "HintErrorCode",
    "Outcome",
    "SessionAction",
    "ToolEnd",
    "ToolStart",
    "combine_field_lines",
    "find_session_action",
    "from_interop",
    "from_kv_hints_action",
    "merge_hints",
    "parse_body",
    "parse_control",
    "parse_header",
    "resolve_hints",
    "serialize_header",
    "to_event",
    "to_kv_hints_action",
    "to_kv_hints_envelope",
]
