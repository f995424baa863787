"""The hint object carried in a JSON request body as ``agent_hints``."""

from __future__ import annotations

from collections.abc import Mapping

from ._errors import HintError, HintErrorCode
from ._model import AgentHints, build_hints


def parse_body(value: object) -> AgentHints:
    """Validate the JSON value of ``body["agent_hints"]``; ``null`` members count as absent."""
    if not isinstance(value, Mapping):
        raise HintError(HintErrorCode.WRONG_TYPE, "agent_hints must be a JSON object")
    return build_hints(value)
