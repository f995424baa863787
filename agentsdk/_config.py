"""Per-agent model settings and per-run configuration."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import TracerProvider

__all__ = ["ModelSettings", "RunConfig", "ToolChoice"]

ToolChoice = str
"""``"auto"``, ``"none"``, ``"required"``, or the name of a tool to force."""

_KEYWORDS = frozenset({"auto", "none", "required"})


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """Sampling parameters sent with every model call of an agent.

    ``tool_choice`` may be a sequence: a per-turn schedule (turn 1 uses the first entry,
    and so on), then ``"auto"``. Forcing a named tool for the first turns and then letting
    the model finish is how a loop is driven with a model that would not call tools
    on its own, and how a run avoids forcing a tool forever.
    """

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    parallel_tool_calls: bool | None = None
    tool_choice: ToolChoice | Sequence[ToolChoice] | None = None
    extra_body: Mapping[str, object] | None = None

    def request_options(self, turn: int, has_tools: bool) -> dict[str, Any]:
        """The ``chat.completions.create`` keyword arguments for the 0-based ``turn``."""
        options: dict[str, Any] = {
            key: value
            for key, value in (
                ("temperature", self.temperature),
                ("top_p", self.top_p),
                ("max_tokens", self.max_tokens),
                ("seed", self.seed),
            )
            if value is not None
        }
        if self.extra_body:
            options["extra_body"] = dict(self.extra_body)
        if not has_tools:
            return options
        if self.parallel_tool_calls is not None:
            options["parallel_tool_calls"] = self.parallel_tool_calls
        choice = self.tool_choice_for(turn)
        if choice is not None:
            options["tool_choice"] = (
                choice
                if choice in _KEYWORDS
                else {"type": "function", "function": {"name": choice}}
            )
        return options

    def tool_choice_for(self, turn: int) -> ToolChoice | None:
        """The tool choice of the 0-based ``turn`` (None: the server's default)."""
        if self.tool_choice is None or isinstance(self.tool_choice, str):
            return self.tool_choice
        schedule = list(self.tool_choice)
        return schedule[turn] if turn < len(schedule) else "auto"

    def forced_tools(self) -> set[str]:
        """The tool names ``tool_choice`` forces at some turn (they must exist)."""
        choices = (
            [self.tool_choice] if isinstance(self.tool_choice, str) else self.tool_choice or []
        )
        return {choice for choice in choices if choice not in _KEYWORDS}


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Knobs of a run that are not properties of an agent.

    ``end_session`` None means: end the session (tell the server it can drop the cache)
    when the run has no ``Session`` to continue it, keep it otherwise.
    ``latency_prior`` is the wait assumed for a tool that never ran and declares no
    ``expected_seconds``; ``latency_quantile`` is the quantile of past durations sent
    as ``gap`` and ETA (the median by default: a retention prior, not a deadline).
    ``user_wait_prior`` is the wait assumed for the user's next message before a
    ``Session`` has seen one: a run that ends with its session kept tells the server
    the branch now waits on its user (``tool_start`` for the tool ``user``), with the
    session's learned reply time as ETA.
    """

    max_tool_concurrency: int = 8
    tool_timeout: float = 300.0
    end_session: bool | None = None
    latency_prior: float = 1.0
    latency_quantile: float = 0.5
    user_wait_prior: float = 60.0
    tracer_provider: TracerProvider | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.max_tool_concurrency < 1:
            raise ValueError("max_tool_concurrency must be at least 1")
        if not self.tool_timeout > 0:
            raise ValueError("tool_timeout must be > 0")
        if not self.user_wait_prior > 0:
            raise ValueError("user_wait_prior must be > 0 (seconds)")
