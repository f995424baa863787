"""The runner on real hinted openai clients (HTTP mocked), and the OpenAI Agents SDK adapter."""

from __future__ import annotations

import httpx2
import pytest

from agentsdk import (
    Agent,
    HintedAsyncOpenAI,
    HintedOpenAI,
    ModelSettings,
    Runner,
    hint_scope,
    tool,
)

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
        {"type": "tool_end", "tool": "run_tests"},
        {"type": "end"},
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
    assert [e["type"] for e in server.events()] == ["tool_start", "tool_end", "end"]


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
