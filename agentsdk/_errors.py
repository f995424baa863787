"""Exceptions raised by the agent framework: one family, rooted at ``AgentsError``.

Tool failures are not here on purpose: they go back to the model as tool messages,
so a bad call never ends a run. What does end a run is a wrong argument
(``UserError``, raised by the call that received it), a failed model call, or a limit
that stops a runaway run.
"""

from __future__ import annotations

import asyncio
import sys
import warnings

import openai
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
    "no_running_loop",
    "warn_user",
]

# Modules whose frames are not the user's: warnings are attributed past them.
_LIBRARIES = (
    "agentsdk", "openai", "httpx", "httpx2", "anyio", "asyncio", "concurrent", "threading",
    "contextlib", "contextvars", "agents", "pydantic_ai", "pydantic_graph", "langchain",
    "langchain_core", "langchain_openai", "langgraph",
)  # fmt: skip


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

    def __init__(self, max_turns: int, agent: str | None = None) -> None:
        who = f"agent {agent!r}" if agent is not None else "the agent"
        super().__init__(
            f"{who} still called tools after max_turns={max_turns} model calls: pass a"
            f" larger max_turns (Runner.run(..., max_turns=...), or as_tool(max_turns=...)"
            " for a sub-agent), or check its instructions and tools for a loop"
        )
        self.max_turns = max_turns
        self.agent = agent


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
    """The model call failed: server unreachable, timed out, or answered with an error.

    ``url`` is the request's URL and ``status`` the server's HTTP status (None when
    no answer came); the message says both, and what to check.
    """

    def __init__(self, message: str, url: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status

    @classmethod
    def from_openai(cls, err: openai.APIError) -> ModelCallError:
        """``err`` (any failure of an openai client's call) with its URL and status."""
        request = getattr(err, "request", None)
        url = str(request.url) if request is not None else None
        where = f" to {url}" if url else ""
        if isinstance(err, openai.APIStatusError):
            advice = ""
            if err.status_code == 404 and url is not None:
                base, found, _ = url.partition("/chat/completions")
                if found and not base.endswith("/v1"):
                    advice = f" (did you mean base_url={base}/v1?)"
            return cls(
                f"model call{where} failed: HTTP {err.status_code}: {err.message}{advice}",
                url,
                err.status_code,
            )
        if isinstance(err, openai.APITimeoutError):
            return cls(f"model call{where} timed out: raise the client's timeout=", url)
        if isinstance(err, openai.APIConnectionError):
            cause = err.__cause__ or err.__context__
            reason = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
            return cls(
                f"model call{where} failed: cannot connect{reason}: is the server running"
                " there, and is the client's base_url right?",
                url,
            )
        return cls(f"model call{where} failed: {err}", url)


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


def no_running_loop(where: str, alternative: str) -> None:
    """Raise a ``UserError`` naming ``alternative`` if this thread runs an event loop
    (a sync entry point cannot start another: Jupyter, an async web handler)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise UserError(
        f"{where} cannot run inside a running event loop (Jupyter, an async function):"
        f" use `{alternative}` there"
    )


def warn_user(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` attributed to the user's line: the first frame outside this SDK
    and the libraries it drives (so filters by module and the shown line are the user's)."""
    frame = sys._getframe(1)
    level = 2
    while (
        frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] in _LIBRARIES
    ):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
