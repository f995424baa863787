"""Per-agent model settings and per-run configuration, validated when constructed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider
from pydantic import Field, InstanceOf, field_validator

from hints_spec import MAX_SECONDS

from ._latency import LatencyStats
from ._validated import Validated

__all__ = [
    "DEFAULT_MAX_FORK_DEPTH",
    "DEFAULT_MAX_MODEL_CALLS",
    "DEFAULT_USER_WAIT_PRIOR",
    "TOOL_CHOICE_KEYWORDS",
    "ModelSettings",
    "RunConfig",
    "ToolChoice",
]

ToolChoice = str
"""``"auto"``, ``"none"``, ``"required"``, or the name of a tool to force."""

TOOL_CHOICE_KEYWORDS = frozenset({"auto", "none", "required"})

DEFAULT_MAX_MODEL_CALLS = 50
"""Model calls of one run, all branches together: a runaway fan-out stops here."""

DEFAULT_MAX_FORK_DEPTH = 3
"""How deep sub-agents may nest (1: the root's children only)."""

DEFAULT_USER_WAIT_PRIOR = 60.0
"""Seconds a user is assumed to take to reply, until a session has timed one reply."""

_Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, strict=True)]


class ModelSettings(Validated):
    """Sampling parameters sent with every model call of an agent.

    ``tool_choice`` may be a sequence: a per-turn schedule (turn 1 uses the first entry,
    and so on), then ``"auto"``. Forcing a named tool for the first turns and then letting
    the model finish is how a loop is driven with a model that would not call tools
    on its own, and how a run avoids forcing a tool forever.
    """

    temperature: Annotated[float, Field(ge=0, le=2, strict=True)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1, strict=True)] | None = None
    max_tokens: Annotated[int, Field(ge=1, strict=True)] | None = None
    seed: Annotated[int, Field(strict=True)] | None = None
    parallel_tool_calls: Annotated[bool, Field(strict=True)] | None = None
    tool_choice: ToolChoice | Sequence[ToolChoice] | None = None
    extra_body: Mapping[str, object] | None = None

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _schedule(cls, value: object) -> object:
        """One choice, or a schedule (kept as a tuple: the settings are immutable)."""
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ValueError(
            '"auto", "none", "required", a tool name, or a list of them (one per turn)'
            f" expected, got {value!r:.80}"
        )

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
                if choice in TOOL_CHOICE_KEYWORDS
                else {"type": "function", "function": {"name": choice}}
            )
        return options

    def tool_choice_for(self, turn: int) -> ToolChoice | None:
        """The tool choice of the 0-based ``turn`` (None: the server's default)."""
        if self.tool_choice is None or isinstance(self.tool_choice, str):
            return self.tool_choice
        return self.tool_choice[turn] if turn < len(self.tool_choice) else "auto"

    def forced_tools(self) -> set[str]:
        """The tool names ``tool_choice`` forces at some turn (they must exist)."""
        choices = (
            [self.tool_choice] if isinstance(self.tool_choice, str) else self.tool_choice or ()
        )
        return {choice for choice in choices if choice not in TOOL_CHOICE_KEYWORDS}


class RunConfig(Validated):
    """Knobs of a run that are not properties of an agent.

    ``end_session`` None means: end the session (tell the server it can drop the cache)
    when the run has no ``Session`` to continue it, keep it otherwise.
    ``latency_prior`` is the wait assumed for a tool that never ran and declares no
    ``expected_seconds``; ``latency_quantile`` is the quantile of past durations sent
    as ``gap`` and ETA (the median by default: a retention prior, not a deadline).
    ``shared_latency`` pools the tool latencies of every run given the same
    ``LatencyStats`` (the runs of one agent, in one process; persist it with
    ``model_dump_json``): a new session's ``gap`` and ETAs start from what the
    agent's earlier sessions learned, not from ``latency_prior``.
    ``user_wait_prior`` is the wait assumed for the user's next message before a
    ``Session`` has seen one: a run that ends with its session kept tells the server
    the branch now waits on its user (``tool_start`` for the tool ``user``), with the
    session's learned reply time as ETA.
    ``max_tool_output_chars`` bounds what one tool call's result may put in the
    conversation (it is stored and re-sent every turn): a longer result is cut
    there, with a note saying so.
    ``max_model_calls`` bounds the model calls of the whole run (every branch) and
    ``max_fork_depth`` how deep sub-agents nest; reaching either ends the run with a
    ``RunLimitExceeded``. Spans and GenAI client metrics go to ``tracer_provider`` and
    ``meter_provider`` (default: the global ones, no-ops unless configured).
    """

    max_tool_concurrency: Annotated[int, Field(ge=1, strict=True)] = 8
    tool_timeout: _Seconds = 300.0
    max_tool_output_chars: Annotated[int, Field(ge=1, strict=True)] = 1_000_000
    end_session: Annotated[bool, Field(strict=True)] | None = None
    latency_prior: _Seconds = 1.0
    latency_quantile: Annotated[float, Field(gt=0, lt=1, strict=True)] = 0.5
    shared_latency: InstanceOf[LatencyStats] | None = Field(default=None, repr=False)
    user_wait_prior: _Seconds = DEFAULT_USER_WAIT_PRIOR
    max_model_calls: Annotated[int, Field(ge=1, strict=True)] = DEFAULT_MAX_MODEL_CALLS
    max_fork_depth: Annotated[int, Field(ge=0, strict=True)] = DEFAULT_MAX_FORK_DEPTH
    tracer_provider: TracerProvider | None = Field(default=None, repr=False)
    meter_provider: MeterProvider | None = Field(default=None, repr=False)
