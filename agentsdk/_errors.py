"""Exceptions raised by the agent framework: one family, rooted at ``AgentsError``.

Tool failures are not here on purpose: they go back to the model as tool messages,
so a bad call never ends a run. What does end a run is a wrong argument
(``UserError``, raised by the call that received it), a failed model call, or a limit
that stops a runaway run.
"""

from __future__ import annotations

from pydantic import ValidationError

__all__ = [
    "AgentsError",
    "ForkDepthExceeded",
    "MaxTurnsExceeded",
    "ModelCallError",
    "ModelCallLimitExceeded",
    "NoSessionWarning",
    "OutputValidationError",
    "RunLimitExceeded",
    "ToolDefinitionError",
    "UnhintedClientWarning",
    "UserError",
    "invalid_arguments",
]


class AgentsError(Exception):
    """Base class of every error the agent framework raises."""


class UserError(AgentsError, ValueError):
    """An argument the SDK cannot use; the message names it and says what to change.

    Raised by the constructor or call that was given it, before anything is sent.
    """


class ToolDefinitionError(UserError, TypeError):
    """A function cannot become a tool (raised when it is decorated, not when it is called)."""


class MaxTurnsExceeded(AgentsError):
    """The agent still wanted to call tools after ``max_turns`` model calls of its branch.

    A sub-agent's is reported to its parent's model as a tool error, like any tool failure.
    """

    def __init__(self, max_turns: int) -> None:
        super().__init__(f"agent did not finish within max_turns={max_turns}")
        self.max_turns = max_turns


class RunLimitExceeded(AgentsError):
    """The whole run reached one of ``RunConfig``'s limits; it ends the run, sub-agents
    included (their ``end`` events are still sent)."""


class ModelCallLimitExceeded(RunLimitExceeded):
    """The run (all its branches together) made ``RunConfig.max_model_calls`` model calls."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the run made its {limit} model calls (RunConfig.max_model_calls={limit}): "
            "raise the limit if the agent needs more, or check for runaway sub-agents"
        )
        self.limit = limit


class ForkDepthExceeded(RunLimitExceeded):
    """A sub-agent would start deeper than ``RunConfig.max_fork_depth``."""

    def __init__(self, limit: int, branch: str) -> None:
        super().__init__(
            f"branch {branch!r} cannot fork: sub-agents nest at most {limit} deep "
            f"(RunConfig.max_fork_depth={limit})"
        )
        self.limit = limit
        self.branch = branch


class ModelCallError(AgentsError):
    """The model call failed: server unreachable, timed out, or answered with an error."""


class OutputValidationError(AgentsError):
    """The model's final answer does not validate against the agent's ``output_type``.

    ``output`` is the text the model wrote.
    """

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


class NoSessionWarning(UserWarning):
    """A hinted client sent a model request outside any session (once per client)."""


class UnhintedClientWarning(UserWarning):
    """An adapter opened a session's scope around a model request that its client sent
    without hints: the framework's model does not use a hinted client (once per adapter)."""


def invalid_arguments(where: str, error: ValidationError) -> UserError:
    """``error`` as a ``UserError`` that names ``where`` and each wrong argument."""
    problems = []
    for item in error.errors(include_url=False):
        name = ".".join(str(part) for part in item["loc"]) or "arguments"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown argument (check its spelling)"
        elif "input" in item and item["type"] not in ("missing", "value_error"):
            message += f" (got {item['input']!r:.80})"
        problems.append(f"{name}: {message}")
    return UserError(f"{where}: " + "; ".join(problems))
