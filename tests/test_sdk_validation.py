"""Bad input: a typed error (``UserError``) at the call that made it, naming the fix,
before anything reaches the server."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentsdk import (
    Agent,
    AgentsError,
    ControlChannel,
    HintArgumentError,
    InMemorySession,
    LatencyEstimator,
    ModelSettings,
    RunConfig,
    RunContext,
    RunHooks,
    Runner,
    ScriptedCall,
    ScriptedModel,
    SQLiteSession,
    Tool,
    ToolDefinitionError,
    Usage,
    UserError,
    hint_scope,
    tool,
)

pytestmark = pytest.mark.anyio

MODEL = ScriptedModel(["never used"])
AGENT = Agent(name="a", model="m")


def plain_function() -> str:
    return "x"


class NotATool:
    def __call__(self) -> str:
        return "x"


class _BadIdSession(InMemorySession):
    @property  # type: ignore[override]
    def session_id(self) -> str:
        return "has spaces"

    @session_id.setter
    def session_id(self, value: str) -> None:
        pass


def call(function: Callable[..., object], /, *args: Any, **kwargs: Any) -> Callable[[], object]:
    """``function(*args, **kwargs)``, later (the arguments are wrong on purpose)."""
    return lambda: function(*args, **kwargs)


def _run(**kwargs: Any) -> Callable[[], object]:
    arguments: dict[str, Any] = {"client": MODEL} | kwargs
    agent = arguments.pop("agent", AGENT)
    return call(Runner.run_sync, agent, arguments.pop("input", "hi"), **arguments)


def _socket_tool() -> object:
    def bad(sock: socket.socket) -> None: ...

    return tool(bad)


FORCING = Agent(name="x", model="m", model_settings=ModelSettings(tool_choice="t"))

# (what the user wrote, error type, words the message must contain)
BAD_INPUTS: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("session as a str", _run(session="some-id"), UserError, "InMemorySession('some-id')"),
    ("a dict input", _run(input={"role": "user", "content": "hi"}), UserError, "in a list"),
    ("an int input", _run(input=3), UserError, "a str or a list of messages"),
    ("a message without a role", _run(input=[{"content": "x"}]), UserError, "input[0]"),
    ("max_turns=0", _run(max_turns=0), UserError, "max_turns must be an int >= 1"),
    ("max_turns=-1", _run(max_turns=-1), UserError, "max_turns must be an int >= 1"),
    ("max_turns=True", _run(max_turns=True), UserError, "max_turns must be an int >= 1"),
    ("a str client", _run(client="http://x"), UserError, "openai.AsyncOpenAI"),
    ("hooks not RunHooks", _run(hooks=object()), UserError, "subclass RunHooks"),
    ("run_config as a dict", _run(run_config={}), UserError, "agentsdk.RunConfig"),
    ("agent as a str", _run(agent="a"), UserError, "agentsdk.Agent"),
    ("root agent without model", _run(agent=Agent(name="x")), UserError, "Agent(model=...)"),
    ("a session with a bad id", _run(session=_BadIdSession()), UserError, "'has spaces'"),
    ("tool_choice naming no tool", _run(agent=FORCING), UserError, "tool_choice forces ['t']"),
    ("InMemorySession('bad id')", call(InMemorySession, "bad id"), UserError, "1-128"),
    ("SQLiteSession('bad id')", call(SQLiteSession, "bad id"), UserError, "1-128"),
    ("SQLiteSession(path=3)", call(SQLiteSession, "s", 3), UserError, "file path"),
    (
        "a plain function as tool",
        call(Agent, name="x", tools=[plain_function]),
        UserError,
        "decorate plain_function() with @tool",
    ),
    ("tools not a list", call(Agent, name="x", tools="t"), UserError, "a list of tools"),
    ("an empty agent name", call(Agent, name=""), UserError, "name"),
    ("Agent(handoffs=...)", call(Agent, name="x", handoffs=[AGENT]), UserError, "as_tool()"),
    (
        "a misspelt Agent argument",
        call(Agent, name="x", instruction="hi"),
        UserError,
        "instruction: unknown argument",
    ),
    ("model_settings as a str", call(Agent, name="x", model_settings="fast"), UserError, "model"),
    (
        "output_type with no schema",
        call(Agent, name="x", output_type=socket.socket),
        UserError,
        "no JSON schema",
    ),
    ("@tool on a class", call(tool, NotATool), ToolDefinitionError, "@tool takes a function"),
    ("@tool on a non-callable", call(tool, 3), ToolDefinitionError, "@tool takes a function"),
    (
        "an unsupported parameter type",
        _socket_tool,
        ToolDefinitionError,
        "give each parameter a type with a JSON schema",
    ),
    (
        "tool(timeout='soon')",
        call(lambda: tool(timeout="soon")(plain_function)),  # type: ignore[arg-type]
        ToolDefinitionError,
        "timeout must be a number",
    ),
    ("as_tool(max_turns=0)", call(AGENT.as_tool, max_turns=0), UserError, "max_turns"),
    (
        "as_tool(fork_context='yes')",
        call(AGENT.as_tool, fork_context="yes"),
        UserError,
        "as_tool(fork_context='yes'): True or False expected",
    ),
    ("as_tool(recursive=1)", call(AGENT.as_tool, recursive=1), UserError, "True or False"),
    (
        "tool(strict='yes')",
        call(lambda: tool(strict="yes")(plain_function)),  # type: ignore[arg-type]
        ToolDefinitionError,
        "strict must be True or False",
    ),
    (
        "tool(lenient='no')",
        call(lambda: tool(lenient="no")(plain_function)),  # type: ignore[arg-type]
        ToolDefinitionError,
        "lenient must be True or False",
    ),
    (
        "another SDK's tool object",
        call(Agent, name="x", tools=[object()]),
        UserError,
        "define it with agentsdk's @tool",
    ),
    (
        "RunConfig(latency_quantile=2)",
        call(RunConfig, latency_quantile=2),
        UserError,
        "latency_quantile: Input should be less than 1",
    ),
    (
        "RunConfig(latency_prior=-1)",
        call(RunConfig, latency_prior=-1),
        UserError,
        "latency_prior: Input should be greater than 0",
    ),
    ("RunConfig(max_model_calls=0)", call(RunConfig, max_model_calls=0), UserError, "max_model"),
    ("RunConfig(tracer_provider='x')", call(RunConfig, tracer_provider="x"), UserError, "Tracer"),
    (
        "RunConfig(shared_latency={})",  # a copy would not be shared
        call(RunConfig, shared_latency={}),
        UserError,
        "shared_latency: Input should be an instance of LatencyStats",
    ),
    ("LatencyEstimator(shared={})", call(LatencyEstimator, shared={}), UserError, "LatencyStats"),
    (
        "ModelSettings(temperature='hot')",
        call(ModelSettings, temperature="hot"),
        UserError,
        "temperature: Input should be a valid number",
    ),
    ("ModelSettings(tool_choice=5)", call(ModelSettings, tool_choice=5), UserError, "tool name"),
    ("LatencyEstimator(quantile=2)", call(LatencyEstimator, quantile=2), UserError, "quantile"),
    ("hint_scope(session='bad id')", call(hint_scope, session="bad id"), HintArgumentError, "128"),
    ("hint_scope(gap='soon')", call(hint_scope, gap="soon"), HintArgumentError, "gap"),
    ("ControlChannel('url')", call(ControlChannel, "http://x"), UserError, "openai.OpenAI"),
    ("ScriptedModel(5)", call(ScriptedModel, 5), UserError, "a list of replies"),
    (
        "Tool(args_model=dict)",
        call(Tool, name="t", description="", parameters={}, args_model=dict, function=print),
        ToolDefinitionError,
        "args_model must be a pydantic model class",
    ),
]


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [pytest.param(make, error, words, id=name) for name, make, error, words in BAD_INPUTS],
)
def test_bad_input_is_a_typed_error_that_names_the_fix(
    make: Callable[[], object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as caught:
        make()
    assert isinstance(caught.value, UserError) and isinstance(caught.value, AgentsError)
    assert words in str(caught.value)
    assert "arbitrary_types_allowed" not in str(caught.value)
    assert not isinstance(caught.value, AttributeError)
    assert MODEL.requests == [] and MODEL.control_events == []  # nothing reached the model


async def test_a_streamed_run_checks_its_arguments_at_the_call() -> None:
    model = ScriptedModel(["x"])
    with pytest.raises(UserError, match="max_turns"):
        Runner.run_streamed(AGENT, "hi", client=model, max_turns=0)
    assert model.requests == [] and model.control_events == []


async def test_fan_out_needs_the_context_of_a_running_tool() -> None:
    stray = RunContext(
        context=None,
        agent_name="a",
        model="m",
        session_id="s",
        branch="root",
        parent_branch=None,
        depth=0,
        usage=Usage(),
    )
    with pytest.raises(UserError, match="RunContext of a running tool"):
        await Runner.fan_out(stray, [(AGENT, "x")])


async def test_bad_fan_out_children_end_the_run_instead_of_reaching_the_model() -> None:
    @tool
    async def delegate(ctx: RunContext) -> str:
        await Runner.fan_out(ctx, [("not an agent", "x")])  # type: ignore[list-item]
        return "unreachable"

    model = ScriptedModel([[ScriptedCall("delegate")], "done"])
    agent = Agent(name="lead", model="m", tools=[delegate])
    with pytest.raises(UserError, match=r"children\[0\] must be an \(Agent, input\) pair"):
        await Runner.run(agent, "go", client=model)
    assert len(model.requests) == 1


def test_good_arguments_pass(tmp_path: Path) -> None:
    session = SQLiteSession("ok-id", tmp_path / "s.db")
    model = ScriptedModel(["fine"])
    result = Runner.run_sync(AGENT, "hi", client=model, session=session, hooks=RunHooks())
    assert result.final_output == "fine"
    session.close()
