"""Shapes users bring from the OpenAI Agents SDK: stream_events(), context=, output_type,
and SQLite files shared with its sessions."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel

from agentsdk import (
    SCHEMA_VERSION,
    Agent,
    AgentEndEvent,
    ModelSettings,
    OutputValidationError,
    RunContext,
    Runner,
    ScriptedCall,
    ScriptedModel,
    SQLiteSession,
    StreamEvent,
    ToolStartEvent,
    UserError,
    tool,
)

pytestmark = pytest.mark.anyio


@tool(expected_seconds=0.5)
async def nap(seconds: float = 0.0) -> str:
    """Sleep."""
    await anyio.sleep(seconds)
    return "slept"


def _agent(**kwargs: object) -> Agent:
    return Agent(name="worker", instructions="Work.", model="m", tools=[nap], **kwargs)  # type: ignore[arg-type]


async def test_stream_events_without_async_with() -> None:
    stream = Runner.run_streamed(
        _agent(), "go", client=ScriptedModel([[ScriptedCall("nap")], "ok"])
    )
    events: list[StreamEvent] = [event async for event in stream.stream_events()]
    assert isinstance(events[-1], AgentEndEvent)
    assert stream.is_complete and stream.final_output == "ok"
    with pytest.raises(UserError, match="already running"):
        async with stream:
            pass


async def test_leaving_stream_events_early_cancels_the_run() -> None:
    slow = ScriptedModel(lambda request: [ScriptedCall("nap", {"seconds": 10})])
    stream = Runner.run_streamed(_agent(), "go", client=slow)
    started = time.monotonic()
    events = stream.stream_events()
    async for event in events:
        if isinstance(event, ToolStartEvent):
            break
    await events.aclose()  # what `async for` leaves to the caller (or to garbage collection)
    assert time.monotonic() - started < 2
    assert not stream.is_complete


@dataclass
class Deps:
    user: str
    seen: list[str]


async def test_context_reaches_tools_hooks_and_sub_agents() -> None:
    @tool
    def whoami(ctx: RunContext[Deps]) -> str:
        ctx.context.seen.append(ctx.branch)
        return ctx.context.user

    helper = Agent(name="helper", tools=[whoami])
    lead = Agent(name="lead", model="m", tools=[whoami, helper.as_tool()])
    model = ScriptedModel(
        lambda r: (
            [ScriptedCall("whoami"), ScriptedCall("helper", {"input": "x"})]
            if r.branch == "root" and len(r.messages) == 1
            else [ScriptedCall("whoami")]
            if r.branch != "root" and r.messages[-1]["role"] == "user"
            else "done"
        )
    )
    deps = Deps(user="ada", seen=[])
    result = await Runner.run(lead, "go", client=model, context=deps)
    assert sorted(deps.seen) == ["root", "root/helper-1"]
    outputs = [m["content"] for m in result.new_messages if m["role"] == "tool"]
    assert outputs == ["ada", "done"]


class Verdict(BaseModel):
    bug: str
    severity: int


async def test_output_type_is_asked_for_and_validated() -> None:
    agent = _agent(output_type=Verdict, model_settings=ModelSettings(tool_choice=["nap"]))
    model = ScriptedModel([[ScriptedCall("nap")], '{"bug": "off by one", "severity": 2}'])
    result = await Runner.run(agent, "review", client=model)
    assert result.final_output == Verdict(bug="off by one", severity=2)
    forced, answering = model.requests
    assert "response_format" not in forced.kwargs  # a forced tool turn cannot answer
    schema = answering.kwargs["response_format"]["json_schema"]
    assert schema["name"] == "Verdict"
    assert schema["schema"]["required"] == ["bug", "severity"]


async def test_a_non_object_output_type_travels_wrapped() -> None:
    agent = Agent(name="counter", model="m", output_type=list[int])
    model = ScriptedModel(['{"output": [1, 2, 3]}'])
    result = await Runner.run(agent, "count", client=model)
    assert result.final_output == [1, 2, 3]
    wrapped = model.requests[0].kwargs["response_format"]["json_schema"]["schema"]
    assert wrapped["required"] == ["output"]


async def test_invalid_output_is_a_typed_error() -> None:
    model = ScriptedModel(['{"bug": "x"}'])
    with pytest.raises(OutputValidationError, match="not a valid Verdict") as caught:
        await Runner.run(Agent(name="r", model="m", output_type=Verdict), "go", client=model)
    assert caught.value.output == '{"bug": "x"}'


async def test_one_sqlite_file_holds_both_sdks_sessions(tmp_path: Path) -> None:
    agents = pytest.importorskip("agents")
    path = tmp_path / "shared.db"
    theirs = agents.SQLiteSession("conv-9", path)
    await theirs.add_items([{"role": "user", "content": "theirs"}])
    ours = SQLiteSession("conv-9", path)
    await Runner.run(_agent(), "ours", client=ScriptedModel(["fine"]), session=ours)
    assert [m["content"] for m in await ours.get_items()] == ["ours", "fine"]
    assert [m["content"] for m in await theirs.get_items()] == ["theirs"]
    ours.close()
    theirs.close()
    with sqlite3.connect(path) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
        assert {"agent_sessions", "agent_messages"} <= tables  # theirs, untouched
        assert {"agentsdk_sessions", "agentsdk_messages", "agentsdk_schema"} <= tables
        assert db.execute("SELECT version FROM agentsdk_schema").fetchall() == [(SCHEMA_VERSION,)]
        db.execute("UPDATE agentsdk_schema SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(UserError, match="newer than this SDK"):
        SQLiteSession("conv-9", path)
