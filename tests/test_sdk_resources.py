"""What a run opens it closes: streams (no ResourceWarning), sessions and control channels
as context managers, and sync variants of flush."""

from __future__ import annotations

import gc
import sqlite3
import warnings
from pathlib import Path

import pytest

from agentsdk import (
    Agent,
    ControlChannel,
    HintedAsyncOpenAI,
    HintedOpenAI,
    Runner,
    ScriptedModel,
    SQLiteSession,
)
from hints_spec import ToolEnd, ToolStart

from recording_server import recording_server

pytestmark = pytest.mark.anyio

AGENT = Agent(name="a", model="tiny")


async def test_streams_are_closed_however_they_are_read() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stream = Runner.run_streamed(AGENT, "hi", client=ScriptedModel(["x"]))
        assert len([e async for e in stream.stream_events()]) > 0
        assert [e async for e in stream.stream_events()] == []  # read once
        async with Runner.run_streamed(AGENT, "hi", client=ScriptedModel(["x"])) as owned:
            async for _ in owned:
                pass
        async with Runner.run_streamed(AGENT, "hi", client=ScriptedModel(["x"])):
            pass  # never read
        del stream, owned
        gc.collect()
    unclosed = [str(w.message) for w in caught if w.category is ResourceWarning]
    assert [m for m in unclosed if "Stream" in m] == []  # (others' leftovers may be collected)


async def test_sqlite_session_as_a_context_manager(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SQLiteSession("s-1", path) as session:
        await Runner.run(AGENT, "hi", client=ScriptedModel(["x"]), session=session)
    with pytest.raises(sqlite3.ProgrammingError):  # closed
        session._db.execute("SELECT 1")
    async with SQLiteSession("s-1", path) as again:
        assert [m["role"] for m in await again.get_items()] == ["user", "assistant"]


async def test_control_channel_as_a_context_manager_flushes() -> None:
    with recording_server() as server:
        async with (
            HintedAsyncOpenAI(base_url=server.base_url, api_key="k") as client,
            ControlChannel(client) as channel,
        ):
            channel.submit("s", [ToolStart(tool="t", eta=1.0)])
        assert [e["type"] for e in server.events()] == ["tool_start"]


def test_a_sync_control_channel_as_a_context_manager_flushes() -> None:
    with recording_server() as server:
        with (
            HintedOpenAI(base_url=server.base_url, api_key="k") as client,
            ControlChannel(client) as channel,
        ):
            channel.submit("s", [ToolEnd(tool="t")])
        assert [e["type"] for e in server.events()] == ["tool_end"]
