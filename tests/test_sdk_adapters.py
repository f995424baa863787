"""Each framework, unchanged but for one line, against the real vLLM CPU server with the
extension: the server sees the framework's own session, the tools' control events, and
serves turn 2+ from the prefix cache.

Random weights call a tool only when it is forced, so each agent forces its tool on the
first step and answers on the second; everything else is the framework's own loop. The
HTTP traffic is real; a recorder on the http client only watches it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx2
import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel

from agentsdk import HintedAsyncOpenAI
from hints_spec import CONTROL_PATH, HEADER_NAME, parse_header
from server_ext import LocalServer

from sdk_calls import INSTRUCTIONS

pytestmark = [pytest.mark.server, pytest.mark.anyio]

LISTING = "calc.py\ntest_calc.py\nREADME.md"


@dataclass
class Traffic:
    """What went over the wire: each chat request's hints and cached tokens, and each
    control POST's session, events and outcomes."""

    chats: list[tuple[dict[str, object], int]] = field(default_factory=list)
    control: list[tuple[str, list[dict[str, Any]], list[str]]] = field(default_factory=list)

    async def _watch(self, response: httpx2.Response) -> None:
        await response.aread()
        request = response.request
        if request.url.path == CONTROL_PATH:
            body = json.loads(request.content)
            outcomes = [r["outcome"] for r in response.json()["results"]]
            self.control.append((body["sid"], body["events"], outcomes))
        elif request.url.path.endswith("/chat/completions"):
            hints = parse_header(request.headers[HEADER_NAME]).normalized()
            details = response.json()["usage"].get("prompt_tokens_details") or {}
            self.chats.append((hints, details.get("cached_tokens") or 0))

    def client(self, server: LocalServer, hinted: bool = True) -> AsyncOpenAI:
        http = httpx2.AsyncClient(event_hooks={"response": [self._watch]}, timeout=120)
        kind = HintedAsyncOpenAI if hinted else AsyncOpenAI
        return kind(base_url=server.base_url, api_key="unused", max_retries=0, http_client=http)

    def events(self) -> list[dict[str, Any]]:
        return [event for _, events, _ in self.control for event in events]


def _assert_seen(
    traffic: Traffic, server: LocalServer, before: dict[str, float], sid: str, tool: str
) -> None:
    after = server.metrics()
    hinted = after["agent_hints_requests_total"] - before.get("agent_hints_requests_total", 0)
    assert hinted == len(traffic.chats) >= 2  # every model call carried hints
    assert {hints["sid"] for hints, _ in traffic.chats} == {sid}  # the framework's session
    assert all(cached > 0 for _, cached in traffic.chats[1:])  # turn 2+: the prefix cache
    events = traffic.events()
    assert {"type": "tool_end", "tool": tool} in events
    assert any(e["type"] == "tool_start" and e["tool"] == tool and "eta" in e for e in events)
    assert {s for s, _, _ in traffic.control} == {sid}
    assert all(o == "accepted" for _, _, outcomes in traffic.control for o in outcomes)
    accepted = after.get("agent_hints_control_events_total", 0) - before.get(
        "agent_hints_control_events_total", 0
    )
    assert accepted >= len(events)


@pytest.mark.parametrize("hinted", [True, False], ids=["hinted-client", "plain-client"])
async def test_openai_agents_with_its_own_session(vllm_server: LocalServer, hinted: bool) -> None:
    """Two runs of one SQLiteSession: the second's first call is served from the cache
    the first left (the session kept between the user's turns). With a plain client
    the runner sends the session as request headers."""
    agents = pytest.importorskip("agents")
    from agentsdk.integrations.openai_agents import HintedRunner

    agents.set_tracing_disabled(True)
    traffic = Traffic()
    client = traffic.client(vllm_server, hinted)

    @agents.function_tool
    def list_dir() -> str:
        """List the project files."""
        return LISTING

    agent = agents.Agent(
        name="coder",
        instructions=INSTRUCTIONS,
        model=agents.OpenAIChatCompletionsModel(model=vllm_server.model, openai_client=client),
        tools=[list_dir],
        # Forced once; the SDK resets tool_choice after a tool call, so step 2 answers.
        model_settings=agents.ModelSettings(tool_choice="list_dir", max_tokens=64),
    )
    Runner = HintedRunner(client)  # the one line
    before = vllm_server.metrics()
    sid = f"conv-9-{'hinted' if hinted else 'plain'}"
    session = agents.SQLiteSession(sid)
    result = await Runner.run(agent, "What is in the project?", session=session)
    assert result.final_output is not None
    first_run = len(traffic.chats)
    again = await Runner.run(agent, "And the tests?", session=session)  # the user's next turn
    await client.close()
    assert again.final_output is not None and len(traffic.chats) > first_run
    _assert_seen(traffic, vllm_server, before, sid, "list_dir")
    assert traffic.events()[-1]["tool"] == "user"  # the session is kept: waiting on its user


class Topic(BaseModel):
    topic: Literal["tests"]


async def test_openai_agents_sub_agent_on_a_child_branch(vllm_server: LocalServer) -> None:
    """An ``as_tool`` sub-agent: its requests on ``root/helper-1`` (parent ``root``), its
    fork delivered before them and its end after, all accepted by the server."""
    agents = pytest.importorskip("agents")
    from agentsdk.integrations.openai_agents import HintedRunner

    agents.set_tracing_disabled(True)
    traffic = Traffic()
    client = traffic.client(vllm_server)
    model = agents.OpenAIChatCompletionsModel(model=vllm_server.model, openai_client=client)
    helper = agents.Agent(
        name="helper", instructions=INSTRUCTIONS, model=model,
        model_settings=agents.ModelSettings(max_tokens=16),
    )  # fmt: skip
    lead = agents.Agent(
        name="lead",
        instructions=INSTRUCTIONS,
        model=model,
        # One possible argument: guided decoding writes it whole, random weights or not.
        tools=[helper.as_tool("helper", "Ask the helper.", parameters=Topic)],
        model_settings=agents.ModelSettings(tool_choice="helper", max_tokens=64),
    )
    result = await HintedRunner(client).run(lead, "Ask the helper about the tests.")
    await client.close()
    assert result.final_output is not None
    branches = [(hints.get("br"), hints.get("pbr")) for hints, _ in traffic.chats]
    assert branches[0] == (None, None) and branches[-1] == (None, None)
    assert set(branches[1:-1]) == {("root/helper-1", "root")}
    events = traffic.events()
    fork = {"type": "fork", "children": ["root/helper-1"]}
    assert events.index(fork) < events.index({"type": "end", "br": "root/helper-1"})
    assert events[-1] == {"type": "end"}
    assert all(o == "accepted" for _, _, outcomes in traffic.control for o in outcomes)


async def test_pydantic_ai_with_its_conversation_id(vllm_server: LocalServer) -> None:
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from agentsdk.integrations.pydantic_ai import AgentHintsCapability

    named = {"tool_choice": {"type": "function", "function": {"name": "list_dir"}}}

    class ForceFirstStep(AbstractCapability[Any]):
        """The tool on step 1 (named: pydantic-ai sends a one-tool list as "required",
        which random weights never close), an answer after."""

        def get_model_settings(self) -> Any:
            return lambda ctx: (
                {"extra_body": named} if ctx.run_step <= 1 else {"tool_choice": "none"}
            )

    traffic = Traffic()
    client = traffic.client(vllm_server)
    agent = pydantic_ai.Agent(
        OpenAIChatModel(vllm_server.model, provider=OpenAIProvider(openai_client=client)),
        instructions=INSTRUCTIONS,
        model_settings={"max_tokens": 64},
        capabilities=[ForceFirstStep(), AgentHintsCapability(client)],  # the one line: ours
    )

    @agent.tool_plain(strict=True)
    def list_dir() -> str:
        """List the project files."""
        return LISTING

    before = vllm_server.metrics()
    result = await agent.run("What is in the project?", conversation_id="ticket-123")
    assert result.output is not None
    first_run = len(traffic.chats)
    again = await agent.run(  # the user's next turn in the conversation
        "And the tests?", conversation_id="ticket-123", message_history=result.all_messages()
    )
    await client.close()
    assert again.output is not None and len(traffic.chats) > first_run
    _assert_seen(traffic, vllm_server, before, "ticket-123", "list_dir")
    first_gap = traffic.chats[0][0]["gap"]
    assert isinstance(first_gap, float) and first_gap > 0  # the expected wait on list_dir


async def test_langgraph_with_its_thread_id(vllm_server: LocalServer) -> None:
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool as lc_tool
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    from agentsdk.integrations.langchain import HintsCallbackHandler, chat_openai_clients

    @lc_tool
    def list_dir() -> str:
        """List the project files."""
        return LISTING

    traffic = Traffic()
    client = traffic.client(vllm_server)
    llm = ChatOpenAI(model=vllm_server.model, max_tokens=64, **chat_openai_clients(client))

    # Annotations LangGraph reads at run time (this module's annotations are strings).
    async def agent(state: Any) -> dict[str, list[Any]]:
        answered = any(isinstance(m, ToolMessage) for m in state["messages"])
        choice = "none" if answered else "list_dir"
        bound = llm.bind_tools([list_dir], tool_choice=choice, strict=True)
        return {"messages": [await bound.ainvoke(state["messages"])]}

    def route(state: Any) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([list_dir]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())

    handler = HintsCallbackHandler(client)  # the one line: callbacks=[handler]
    config: Any = {"configurable": {"thread_id": "thread-7"}, "callbacks": [handler]}
    before = vllm_server.metrics()
    messages = [("system", INSTRUCTIONS), ("user", "What is in the project?")]
    state = await graph.ainvoke({"messages": messages}, config)
    assert isinstance(state["messages"][-1], AIMessage)
    first_run = len(traffic.chats)
    # The user's next turn on the thread (the checkpointer keeps its messages).
    state = await graph.ainvoke({"messages": [("user", "And the tests?")]}, config)
    await handler.flush()
    await client.close()
    assert isinstance(state["messages"][-1], AIMessage) and len(traffic.chats) > first_run
    _assert_seen(traffic, vllm_server, before, "thread-7", "list_dir")
    assert traffic.events()[-1]["tool"] == "user"  # the thread now waits on its user
