"""The runner on real hinted openai clients (HTTP mocked), and the adapters of other frameworks
on the same mocked server (the real server: test_sdk_adapters.py)."""

from __future__ import annotations

import warnings
from typing import Any

import httpx2
import openai
import pytest

from agentsdk import (
    Agent,
    HintedAsyncOpenAI,
    HintedOpenAI,
    ModelSettings,
    NoSessionWarning,
    Runner,
    UserError,
    hint_scope,
    tool,
)
from hints_spec import HEADER_NAME, SESSION_HEADER

from sdk_calls import FakeServer, chat_reply

pytestmark = pytest.mark.anyio


@tool(strict=True, expected_seconds=4.0)
def run_tests() -> str:
    """Run the test suite."""
    return "3 passed"


AGENT = Agent(
    name="coder",
    instructions="Code.",
    model="tiny",
    tools=[run_tests],
    model_settings=ModelSettings(tool_choice=["run_tests"]),
)


async def test_runner_on_a_hinted_async_client() -> None:
    server = FakeServer([chat_reply(tool="run_tests"), chat_reply("fixed")])
    client = HintedAsyncOpenAI(
        base_url="http://model.test/v1",
        api_key="k",
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(server)),
    )
    async with client:
        result = await Runner.run(AGENT, "fix", client=client)
    assert result.final_output == "fixed"
    assert result.usage.cached_tokens == 128 and result.usage.input_tokens == 200
    sid = result.session_id
    first, second = server.hints()
    assert (first["sid"], first["gap"], first["br"]) == (sid, 4.0, None)
    assert second["sid"] == sid
    assert isinstance(second["gap"], float) and second["gap"] < 4.0
    for _, body in server.chats:
        assert body["prompt_cache_key"] == sid
        assert body["tools"][0]["function"]["strict"] is True
    assert server.chats[0][1]["tool_choice"] == {
        "type": "function",
        "function": {"name": "run_tests"},
    }
    assert server.events() == [
        {"type": "tool_start", "tool": "run_tests", "eta": 4.0},
        {"type": "end"},  # no tool_end: the next request follows at once
    ]
    assert {body["sid"] for _, body in server.control} == {sid}


def test_run_sync_on_a_hinted_sync_client() -> None:
    server = FakeServer([chat_reply(tool="run_tests"), chat_reply("fixed")])
    client = HintedOpenAI(
        base_url="http://model.test/v1",
        api_key="k",
        http_client=httpx2.Client(transport=httpx2.MockTransport(server)),
    )
    with hint_scope(session="sync-session", ttl=900):
        result = Runner.run_sync(AGENT, "fix", client=client)
    assert result.final_output == "fixed"
    # The calls ran in worker threads and still carried the scope.
    assert [h["sid"] for h in server.hints()] == ["sync-session"] * 2
    assert [h["ttl"] for h in server.hints()] == [900, 900]
    assert [e["type"] for e in server.events()] == ["tool_start", "end"]


async def test_openai_agents_sdk_with_hinted_client_and_hooks() -> None:
    agents = pytest.importorskip("agents")
    from agentsdk.integrations.openai_agents import HintsRunHooks

    agents.set_tracing_disabled(True)
    server = FakeServer([chat_reply(tool="lint"), chat_reply("clean")])
    client = HintedAsyncOpenAI(
        base_url="http://model.test/v1",
        api_key="k",
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(server)),
    )

    @agents.function_tool
    def lint() -> str:
        """Lint the code."""
        return "no issues"

    agent = agents.Agent(
        name="linter",
        instructions="Lint.",
        model=agents.OpenAIChatCompletionsModel(model="tiny", openai_client=client),
        tools=[lint],
    )
    hooks = HintsRunHooks(client)
    with hint_scope(session="oa-session", branch="main"):
        result = await agents.Runner.run(agent, "lint it", hooks=hooks)
    await hooks.flush()
    await client.close()
    assert result.final_output == "clean"
    assert [(h["sid"], h["br"]) for h in server.hints()] == [("oa-session", "main")] * 2
    assert server.events() == [
        {"type": "tool_start", "br": "main", "tool": "lint", "eta": 1.0},
        {"type": "tool_end", "br": "main", "tool": "lint"},
    ]
    assert "lint" in hooks.estimator.stats.tools


def _plain_client(server: FakeServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url="http://model.test/v1",
        api_key="k",
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(server)),
    )


async def test_hinted_runner_makes_a_plain_client_send_the_sdk_session() -> None:
    agents = pytest.importorskip("agents")
    from agentsdk.integrations.openai_agents import HintedRunner

    agents.set_tracing_disabled(True)
    server = FakeServer([chat_reply(tool="lint"), chat_reply("clean")])
    client = _plain_client(server)

    @agents.function_tool
    def lint() -> str:
        """Lint the code."""
        return "no issues"

    agent = agents.Agent(
        name="linter",
        model=agents.OpenAIChatCompletionsModel(model="tiny", openai_client=client),
        tools=[lint],
    )
    runner = HintedRunner(client)
    result = await runner.run(agent, "lint it", conversation_id="conv 9 (has spaces)")
    assert result.final_output == "clean"
    # Not a protocol id: a stable digest of it, the same on every request and event.
    [sid] = {h["sid"] for h in server.hints()}
    assert isinstance(sid, str) and sid.startswith("h-")
    assert all(headers[SESSION_HEADER] == sid for headers, _ in server.chats)
    assert {body["sid"] for _, body in server.control} == {sid}
    assert [(e["type"], e["tool"]) for e in server.events()] == [
        ("tool_start", "lint"),
        ("tool_end", "lint"),
        ("tool_start", "user"),  # a conversation goes on: it waits on its user
    ]
    # Without a session of its own, a run is its own session and ends it.
    server.replies.append(chat_reply("again"))
    server.control.clear()
    await runner.run(agent, "once more")
    await client.close()
    assert server.events() == [{"type": "end"}]


async def test_hooks_without_a_session_warn_once() -> None:
    pytest.importorskip("agents")
    from agentsdk.integrations.openai_agents import HintsRunHooks

    server = FakeServer([])
    hooks = HintsRunHooks(server.client())
    tool_stub: Any = type("T", (), {"name": "lint"})()
    with pytest.warns(NoSessionWarning, match="no tool events are sent"):
        await hooks.on_tool_start(Any, Any, tool_stub)  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        await hooks.on_tool_end(Any, Any, tool_stub, "ok")  # type: ignore[arg-type]
    await hooks.flush()
    assert server.control == []


async def test_pydantic_ai_capability_on_a_plain_client() -> None:
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from agentsdk.integrations.pydantic_ai import AgentHintsCapability

    server = FakeServer([chat_reply(tool="lint"), chat_reply("clean")])
    client = _plain_client(server)
    agent = pydantic_ai.Agent(
        OpenAIChatModel("tiny", provider=OpenAIProvider(openai_client=client)),
        capabilities=[AgentHintsCapability(client, end_session=True)],
    )

    @agent.tool_plain
    def lint() -> str:
        """Lint the code."""
        return "no issues"

    result = await agent.run("lint it", conversation_id="ticket-9")
    await client.close()
    assert result.output == "clean"
    hints = server.hints()
    assert [h["sid"] for h in hints] == ["ticket-9", "ticket-9"]
    assert hints[0]["gap"] == 1.0 and isinstance(hints[1]["gap"], float)  # learned
    assert [(e["type"], e.get("tool")) for e in server.events()] == [
        ("tool_start", "lint"),
        ("tool_end", "lint"),
        ("end", None),
    ]


async def test_langchain_handler_on_hinted_clients_and_once_a_warning_on_plain_ones() -> None:
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI

    from agentsdk import UnhintedClientWarning
    from agentsdk.integrations.langchain import HintsCallbackHandler, chat_openai_clients

    server = FakeServer([chat_reply("hello"), chat_reply("plain"), chat_reply("plain again")])
    hinted = server.client()
    handler = HintsCallbackHandler(hinted)
    config: Any = {"metadata": {"thread_id": "thread-7"}, "callbacks": [handler]}
    llm = ChatOpenAI(model="tiny", **chat_openai_clients(hinted))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (await llm.ainvoke("hi", config)).content == "hello"
    assert server.hints()[0]["sid"] == "thread-7"

    # The same handler on a model whose clients are plain: the hints are lost, said once.
    plain = _plain_client(server)
    sync = openai.OpenAI(
        base_url="http://model.test/v1",
        api_key="k",
        http_client=httpx2.Client(transport=httpx2.MockTransport(server)),
    )
    unhinted = ChatOpenAI(
        model="tiny",
        root_async_client=plain,
        async_client=plain.chat.completions,
        root_client=sync,
        client=sync.chat.completions,
    )
    with pytest.warns(UnhintedClientWarning, match="chat_openai_clients"):
        await unhinted.ainvoke("hi", config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        await unhinted.ainvoke("hi", config)
    assert [HEADER_NAME in headers for headers, _ in server.chats] == [True, False, False]
    await hinted.close()
    await plain.close()


def _linter(agents: Any, client: openai.AsyncOpenAI) -> Any:
    @agents.function_tool
    def lint() -> str:
        """Lint the code."""
        return "no issues"

    return agents.Agent(
        name="linter",
        model=agents.OpenAIChatCompletionsModel(model="tiny", openai_client=client),
        tools=[lint],
    )


async def test_hinted_runner_streams_and_sends_the_last_word_when_the_stream_completes() -> None:
    agents = pytest.importorskip("agents")
    from agentsdk.integrations.openai_agents import HintedRunner

    agents.set_tracing_disabled(True)
    server = FakeServer([chat_reply(tool="lint"), chat_reply("clean")])
    client = server.client()
    runner = HintedRunner(client)
    session = agents.SQLiteSession("conv-5")
    stream = runner.run_streamed(_linter(agents, client), "lint it", session=session)
    kinds = {event.type async for event in stream.stream_events()}
    assert stream.final_output == "clean" and "run_item_stream_event" in kinds
    assert {h["sid"] for h in server.hints()} == {"conv-5"}
    await runner.flush()  # no finish(stream) needed: the run's end sent the last word
    assert [(e["type"], e["tool"]) for e in server.events()] == [
        ("tool_start", "lint"),
        ("tool_end", "lint"),
        ("tool_start", "user"),  # the conversation waits on its user
    ]
    await runner.finish(stream)  # still there, for closing the client right after
    await client.close()


def test_hinted_runner_run_sync_and_arguments_agents_does_not_take() -> None:
    agents = pytest.importorskip("agents")
    from agentsdk.integrations.openai_agents import HintedRunner

    agents.set_tracing_disabled(True)
    server = FakeServer([chat_reply(tool="lint"), chat_reply("clean")])
    client = server.client()
    runner = HintedRunner(client)
    agent = _linter(agents, client)
    with pytest.raises(UserError, match=r"unknown argument 'sesion'.*session"):
        runner.run_sync(agent, "lint it", sesion="conv-1")
    with pytest.raises(UserError, match="run_streamed: unknown argument 'bogus'"):
        runner.run_streamed(agent, "lint it", bogus=1)
    result = runner.run_sync(agent, "lint it", max_turns=4)
    assert result.final_output == "clean" and server.chats
    assert server.events()[-1] == {"type": "end"}  # a run of its own: its session ends
