"""@tool: schemas from signatures and docstrings, definition errors, argument handling."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, Literal

import anyio
import pytest
from pydantic import BaseModel

from agentsdk import Agent, RunContext, ToolDefinitionError, Usage, UserError, tool
from agentsdk._tool import ToolArgumentsError

pytestmark = pytest.mark.anyio


def _context() -> RunContext:
    # Tools under test never touch the run: a plain context will do.
    return RunContext(
        context=None,
        agent_name="t",
        model="m",
        session_id="s",
        branch="root",
        parent_branch=None,
        depth=0,
        usage=Usage(),
    )


def test_schema_from_hints_and_google_docstring() -> None:
    @tool
    def search(query: str, limit: int = 10, mode: Literal["fast", "exact"] = "fast") -> list[str]:
        """Search the corpus.

        Results are ranked.

        Args:
            query (str): What to look for.
            limit: How many results,
                at most.
            mode: Matching mode.

        Returns:
            The matching lines.
        """
        return []

    assert search.name == "search"
    assert search.description == "Search the corpus.\n\nResults are ranked."
    assert search.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to look for."},
            "limit": {
                "type": "integer",
                "default": 10,
                "description": "How many results, at most.",
            },
            "mode": {
                "type": "string",
                "enum": ["fast", "exact"],
                "default": "fast",
                "description": "Matching mode.",
            },
        },
        "required": ["query"],
    }
    assert search.definition()["function"]["parameters"] is search.parameters


class Point(BaseModel):
    x: float
    y: float


def test_rest_docstring_and_nested_models() -> None:
    @tool(name="move_to", description="Move the cursor.")
    def move(target: Point, title: str | None = None) -> str:
        """Ignored because description is given.

        :param target: Where to go.
        :param str title: A label,
            shown on screen.
        :returns: nothing useful
        """
        return ""

    props = move.parameters["properties"]
    assert move.name == "move_to" and move.description == "Move the cursor."
    assert props["target"]["description"] == "Where to go."
    assert props["title"]["description"] == "A label, shown on screen."
    assert "title" in props  # a parameter named "title" survives title stripping
    assert "title" not in move.parameters["$defs"]["Point"]


def test_context_parameter_is_injected_not_shown() -> None:
    seen: list[RunContext] = []

    @tool
    def whoami(ctx: RunContext, loud: bool = False) -> str:
        seen.append(ctx)
        return ctx.branch.upper() if loud else ctx.branch

    assert list(whoami.parameters["properties"]) == ["loud"]

    async def call() -> str:
        return await whoami.call(_context(), whoami.validate_arguments('{"loud": true}'))

    assert anyio.run(call) == "ROOT"
    assert len(seen) == 1


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: tool(lambda: None), "'<lambda>' must match"),
        (lambda: tool(name="bad name!")(lambda: None), "must match"),
        (lambda: tool(name="t", timeout=0)(lambda: None), "timeout must be a number .* > 0"),
        (lambda: tool(name="user")(lambda: None), "reserved for the human wait"),
        (lambda: Agent(name="user").as_tool(), "reserved for the human wait"),
    ],
)
def test_invalid_names_and_options(make: Callable[[], Any], message: str) -> None:
    with pytest.raises(ToolDefinitionError, match=message):
        make()


def test_unsupported_parameter_type() -> None:
    with pytest.raises(ToolDefinitionError, match="unsupported parameter type"):

        @tool
        def bad(sock: socket.socket) -> None: ...

    with pytest.raises(ToolDefinitionError, match="unsupported parameter type"):

        @tool
        def also_bad(callback: Callable[[int], int]) -> None: ...


def test_var_args_and_misplaced_context_are_rejected() -> None:
    with pytest.raises(ToolDefinitionError, match=r"\*args"):

        @tool
        def star(*paths: str) -> None: ...

    with pytest.raises(ToolDefinitionError, match=r"\*args/\*\*kwargs"):

        @tool
        def double_star(**options: str) -> None: ...

    with pytest.raises(ToolDefinitionError, match="first parameter"):

        @tool
        def late(x: int, ctx: RunContext) -> None: ...

    with pytest.raises(ToolDefinitionError, match="lenient tools need a default"):

        @tool(lenient=True)
        def strict_arg(path: str) -> None: ...

    with pytest.raises(UserError, match="duplicate tool names"):
        Agent(name="a", tools=[tool(name="x")(lambda: 1), tool(name="x")(lambda: 2)])


@tool
def _add(a: int, b: int = 1) -> int:
    return a + b


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ("true", "must be a JSON object, got 'true'"),
        ("Infinity", "must be a JSON object"),
        ('{"a": NaN}', "must be a JSON object"),
        ('{"a": 1', "must be a JSON object"),
        ("[1, 2]", "must be a JSON object"),
        ("{}", "a: Field required"),
        ('{"a": "one"}', "a: Input should be a valid integer"),
    ],
)
def test_bad_arguments_raise_messages_for_the_model(arguments: str, error: str) -> None:
    with pytest.raises(ToolArgumentsError, match=error):
        _add.validate_arguments(arguments)


def test_arguments_coerce_and_ignore_extra_keys() -> None:
    args = _add.validate_arguments('{"a": "2", "zzz": 1}')
    assert args.model_dump(by_alias=True) == {"a": 2, "b": 1}


def test_lenient_tool_drops_bad_arguments() -> None:
    @tool(lenient=True)
    def read(path: str = ".", limit: int = 5) -> str:
        return f"{path}:{limit}"

    async def call(arguments: str) -> str:
        return await read.call(_context(), read.validate_arguments(arguments))

    assert anyio.run(call, "Infinity") == ".:5"
    assert anyio.run(call, "true") == ".:5"
    assert anyio.run(call, '{"path": "a.py", "limit": "many"}') == "a.py:5"


def test_odd_parameter_names_work() -> None:
    @tool
    def odd(schema: str, _private: int = 0, /) -> str:
        return f"{schema}{_private}"

    assert set(odd.parameters["properties"]) == {"schema", "_private"}

    async def call() -> str:
        return await odd.call(_context(), odd.validate_arguments('{"schema": "s", "_private": 3}'))

    assert anyio.run(call) == "s3"


async def test_results_are_text_or_json_and_sync_runs_in_a_thread() -> None:
    class Out(BaseModel):
        n: int

    @tool
    def blocking() -> dict[str, object]:
        time.sleep(0.2)
        return {"model": Out(n=1), "ok": True}

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.02)
            ticks += 1

    async with anyio.create_task_group() as group:
        group.start_soon(ticker)
        result = await blocking.call(_context(), blocking.validate_arguments("{}"))
        group.cancel_scope.cancel()
    assert result == '{"model":{"n":1},"ok":true}'
    assert ticks >= 5  # the event loop kept running while the sync tool slept
