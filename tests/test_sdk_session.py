"""Session stores: the protocol, SQLite persistence across processes, stats and usage."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from agentsdk import (
    Agent,
    InMemorySession,
    Runner,
    ScriptedCall,
    ScriptedModel,
    Session,
    SessionStats,
    SQLiteSession,
    Usage,
    tool,
)
from hints_spec import End

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite"])
async def session(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Session]:
    if request.param == "memory":
        yield InMemorySession("s-1")
    else:
        store = SQLiteSession("s-1", tmp_path / "sessions.db")
        yield store
        store.close()


async def test_store_protocol(session: Session) -> None:
    assert session.session_id == "s-1"
    assert await session.get_items() == []
    assert await session.pop_item() is None
    items = [{"role": "user", "content": str(i)} for i in range(5)]
    await session.add_items(items[:3])
    await session.add_items(items[3:])
    assert await session.get_items() == items
    assert await session.get_items(limit=2) == items[3:]
    assert await session.get_items(limit=10) == items
    assert await session.pop_item() == items[4]
    assert await session.get_items() == items[:4]
    fresh = await session.get_stats()
    assert fresh == SessionStats()
    fresh.usage.add(Usage(requests=2, input_tokens=10, cached_tokens=4))
    fresh.latency.tools["t"] = {3: 1.0}
    await session.save_stats(fresh)
    assert await session.get_stats() == fresh
    await session.clear()
    assert await session.get_items() == []
    assert await session.get_stats() == SessionStats()


async def test_items_are_copied_in_and_out() -> None:
    session = InMemorySession()
    item = {"role": "user", "content": "a"}
    await session.add_items([item])
    item["content"] = "changed"
    (stored,) = await session.get_items()
    stored["content"] = "changed too"
    assert await session.get_items() == [{"role": "user", "content": "a"}]
    assert session.session_id.startswith("session-")


async def test_sqlite_uses_wal_and_isolates_sessions(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    one, two = SQLiteSession("one", path), SQLiteSession("two", path)
    await one.add_items([{"role": "user", "content": "1"}])
    await two.add_items([{"role": "user", "content": "2"}])
    assert await one.get_items() == [{"role": "user", "content": "1"}]
    await two.clear()
    assert await one.get_items() == [{"role": "user", "content": "1"}]
    one.close()
    two.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


@tool
async def slow_build() -> str:
    await anyio.sleep(0.3)
    return "built"


AGENT = Agent(name="builder", instructions="Build.", model="m", tools=[slow_build])

# Run in a fresh interpreter: resume the session from the file alone.
RESUME = textwrap.dedent(
    """
    import json, sys
    import anyio
    from agentsdk import Agent, Runner, ScriptedModel, SQLiteSession, tool

    @tool
    async def slow_build() -> str:
        return "built"

    agent = Agent(name="builder", instructions="Build.", model="m", tools=[slow_build])
    session = SQLiteSession("resumable", sys.argv[1])
    model = ScriptedModel(["resumed"])
    Runner.run_sync(agent, "continue", client=model, session=session)
    usage = anyio.run(session.get_stats).usage
    print(json.dumps({
        "messages": model.requests[0].messages,
        "gap": model.requests[0].hints.gap,
        "requests": usage.requests,
        "ends": sum(e.event.type == "end" for e in model.control_events),
    }))
    """
)


async def test_a_session_resumes_in_another_process(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    session = SQLiteSession("resumable", path)
    model = ScriptedModel([[ScriptedCall("slow_build")], "first done"])
    await Runner.run(AGENT, "build it", client=model, session=session)
    assert model.events_of(End) == []  # a session may continue: the run does not end it
    stored = await session.get_items()
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    stats = await session.get_stats()
    assert stats.usage.requests == 2 and stats.usage.cached_tokens > 0
    assert list(stats.latency.tools) == ["slow_build"]
    session.close()

    done = subprocess.run(
        [sys.executable, "-c", RESUME, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(done.stdout)
    assert report["messages"][1:] == [*stored, {"role": "user", "content": "continue"}]
    assert 0.25 < report["gap"] < 0.4  # learned in the first process, not the 1 s prior
    assert report["requests"] == 3  # usage accumulates across runs and processes
    assert report["ends"] == 0
