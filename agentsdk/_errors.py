"""Exceptions raised by the agent framework.

Tool failures are not here on purpose: they go back to the model as tool messages,
so a bad call never ends a run.
"""

from __future__ import annotations

__all__ = ["AgentsError", "MaxTurnsExceeded", "ModelCallError", "ToolDefinitionError"]


class AgentsError(Exception):
    """Base class of every error the agent framework raises."""


class ToolDefinitionError(AgentsError, TypeError):
    """A function cannot become a tool (raised when it is decorated, not when it is called)."""


class MaxTurnsExceeded(AgentsError):
    """The agent still wanted to call tools after ``max_turns`` model calls."""

    def __init__(self, max_turns: int) -> None:
        super().__init__(f"agent did not finish within max_turns={max_turns}")
        self.max_turns = max_turns


class ModelCallError(AgentsError):
    """The model call failed: server unreachable, timed out, or answered with an error."""
