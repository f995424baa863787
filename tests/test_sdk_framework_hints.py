"""Each framework's adapter sends what ``agentsdk.Runner`` sends, against a recording
HTTP server: the session, a branch per sub-agent with its parent, ``gap`` and the end on
every request, a ``fork`` before a child's first request, for sync and async, streamed
and not, with the real frameworks."""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from agentsdk import HintedAsyncOpenAI

from recording_server import RecordingServer, recording_server
from sdk_calls import chat_reply

pytestmark = pytest.mark.anyio

Reply = Callable[[dict[str, Any]], dict[str, Any]]


def call(name: str, **arguments: object) -> dict[str, Any]:
    """A chat completion calling tool ``name`` with ``arguments``."""
    reply = chat_reply(tool=name)
    reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = json.dumps(arguments)
    return reply


def script(**by_system: list[dict[str, Any]]) -> Reply:
    """Replies per agent (by its system prompt), one per tool result so far."""

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        done = sum(m["role"] == "tool" for m in messages)
        replies = by_system[system.rstrip(".")]
        return replies[min(done, len(replies) - 1)]

    return reply


def timeline(server: RecordingServer) -> list[tuple[str, object]]:
    """The wire in arrival order: ``("chat", (br, pbr))`` or ``("event", (type, br))``."""
    out: list[tuple[str, object]] = []
    for record in server.log:
        if record.kind == "chat":
            out.append(("chat", (record.hints["br"], record.hints["pbr"])))
        else:
            out += [("event", (e["type"], e.get("br"))) for e in record.body["events"]]
    return out


def assert_forks_first(server: RecordingServer) -> None:
    """Every child branch's fork arrived before its first request."""
    seen: set[object] = set()
    for record in server.log:
        if record.kind == "control":
            seen |= {c for e in record.body["events"] if e["type"] == "fork" for c in e["children"]}
        elif record.hints["br"] is not None:
            assert record.hints["br"] in seen, f"{record.hints['br']} before its fork"


# OpenAI Agents SDK


def _oa_agents(agents: Any, client: HintedAsyncOpenAI) -> Any:
    model = agents.OpenAIChatCompletionsModel(model="tiny", openai_client=client)

    @agents.function_tool
    def lint() -> str:
        """Lint the code."""
        return "clean"

    helper = agents.Agent(name="helper", instructions="Help.", model=model, tools=[lint])
    closer = agents.Agent(name="closer", instructions="Close.", model=model)
    return agents.Agent(
        name="lead",
        instructions="Lead.",
        model=model,
        tools=[helper.as_tool("helper", "Ask the helper."), lint],
        handoffs=[closer],
    )


OA_SCRIPT = script(
    Lead=[call("helper", input="look"), call("lint"), call("transfer_to_closer"), chat_reply("?")],
    Help=[call("lint"), chat_reply("helped")],
    Close=[chat_reply("closed")],
)
# (br, pbr) of each request, in order: the lead, its helper (as_tool) twice, the lead
# twice, then the agent it handed off to.
OA_BRANCHES = [
    (None, None),
    ("root/helper-1", "root"),
    ("root/helper-1", "root"),
    (None, None),
    (None, None),
    ("root/closer-1", "root"),
]


def _assert_openai_agents(server: RecordingServer, sid: str, last: dict[str, Any]) -> None:
    hints = server.hints()
    assert {h["sid"] for h in hints} == {sid}
    assert [(h["br"], h["pbr"]) for h in hints] == OA_BRANCHES
    assert [h["gap"] is not None for h in hints] == [True, True, True, True, True, False]
    assert_forks_first(server)
    events = server.events()
    assert {"type": "fork", "children": ["root/helper-1"]} in events
    assert {"type": "fork", "children": ["root/closer-1"]} in events
    # The helper's branch ends before the lead goes on; the handoff's, with the run.
    line = timeline(server)
    assert line.index(("event", ("end", "root/helper-1"))) < line.index(("chat", (None, None)), 2)
    assert events[-2:] == [{"type": "end", "br": "root/closer-1"}, last]
    starts = [e for e in events if e["type"] == "tool_start" and e["tool"] != "user"]
    assert [e["tool"] for e in starts] == ["helper", "lint"] and all("eta" in e for e in starts)


async def test_openai_agents_run_sub_agents_handoffs_gap_and_end() -> None:
    agents = pytest.importorskip("agents")
    from agentsdk.integrations.openai_agents import HintedRunner

    agents.set_tracing_disabled(True)
    with recording_server(OA_SCRIPT, control_delay=0.005) as server:
        async with HintedAsyncOpenAI(base_url=server.base_url, api_key="k") as client:
            result = await HintedRunner(client).run(_oa_agents(agents, client), "go")
        assert result.final_output == "closed"
        sid = server.hints()[0]["sid"]
        assert isinstance(sid, str) and sid.startswith("run-")
        _assert_openai_agents(server, sid, {"type": "end"})


async def test_openai_agents_streamed_sends_its_last_word_when_the_stream_completes() -> None:
    agents = pytest.importorskip("agents")
    from agentsdk.integrations.openai_agents import HintedRunner

    agents.set_tracing_disabled(True)
    with recording_server(OA_SCRIPT, control_delay=0.005) as server:
        async with HintedAsyncOpenAI(base_url=server.base_url, api_key="k") as client:
            runner = HintedRunner(client)
            session = agents.SQLiteSession("conv-1")
            stream = runner.run_streamed(_oa_agents(agents, client), "go", session=session)
            async for _ in stream.stream_events():
                pass
            await runner.flush()  # no finish(stream)
            session.close()
        assert stream.final_output == "closed"
        last = server.events()[-1]
        assert (last["type"], last["tool"]) == ("tool_start", "user")  # a kept session
        _assert_openai_agents(server, "conv-1", last)


def test_openai_agents_run_sync() -> None:
    agents = pytest.importorskip("agents")
    from agentsdk.integrations.openai_agents import HintedRunner

    agents.set_tracing_disabled(True)
    with recording_server(OA_SCRIPT) as server:
        client = HintedAsyncOpenAI(base_url=server.base_url, api_key="k")
        result = HintedRunner(client).run_sync(_oa_agents(agents, client), "go")
        assert result.final_output == "closed"
        _assert_openai_agents(server, str(server.hints()[0]["sid"]), {"type": "end"})


# pydantic-ai

PA_SCRIPT = script(
    Lead=[call("delegate"), call("lint"), chat_reply("done")],
    Help=[call("lint"), chat_reply("helped")],
)


def _pa_agents(pydantic_ai: Any, client: HintedAsyncOpenAI) -> Any:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from agentsdk.integrations.pydantic_ai import AgentHintsCapability

    model = OpenAIChatModel("tiny", provider=OpenAIProvider(openai_client=client))
    hints = AgentHintsCapability(client)
    helper = pydantic_ai.Agent(model, name="helper", instructions="Help.", capabilities=[hints])
    lead = pydantic_ai.Agent(model, name="lead", instructions="Lead.", capabilities=[hints])

    @helper.tool_plain
    @lead.tool_plain
    def lint() -> str:
        """Lint the code."""
        return "clean"

    async def delegate(ctx: Any) -> str:
        """Ask the helper."""
        return str((await helper.run("look", usage=ctx.usage)).output)

    delegate.__annotations__["ctx"] = pydantic_ai.RunContext[Any]  # read at run time
    lead.tool(delegate)
    return lead


def _assert_pydantic_ai(server: RecordingServer, sid: str) -> None:
    hints = server.hints()
    assert {h["sid"] for h in hints} == {sid}  # the delegated run too: one session
    assert [(h["br"], h["pbr"]) for h in hints] == [
        (None, None),
        ("root/helper-1", "root"),
        ("root/helper-1", "root"),
        (None, None),
        (None, None),
    ]
    assert all(isinstance(h["gap"], float) for h in hints)  # every request offers tools
    assert_forks_first(server)
    line = timeline(server)
    assert line.index(("event", ("end", "root/helper-1"))) < line.index(("chat", (None, None)), 1)
    events = server.events()
    assert (events[-1]["type"], events[-1]["tool"]) == ("tool_start", "user")  # one last word
    assert [e["type"] for e in events].count("tool_start") == 4  # delegate, lint x2, user
    assert {"type": "tool_start", "br": "root/helper-1", "tool": "lint", "eta": 1.0} in events


@pytest.mark.parametrize("how", ["run", "run_stream", "run_stream_events", "iter"])
async def test_pydantic_ai_streamed_or_not_and_a_delegated_agent(how: str) -> None:
    pydantic_ai = pytest.importorskip("pydantic_ai")
    with recording_server(PA_SCRIPT, control_delay=0.005) as server:
        async with HintedAsyncOpenAI(base_url=server.base_url, api_key="k") as client:
            lead = _pa_agents(pydantic_ai, client)
            if how == "run":
                await lead.run("go", conversation_id="ticket-1")
            elif how == "run_stream":
                async with lead.run_stream("go", conversation_id="ticket-1") as stream:
                    await stream.get_output()
            elif how == "run_stream_events":
                async with lead.run_stream_events("go", conversation_id="ticket-1") as events:
                    async for _ in events:
                        pass
            else:
                async with lead.iter("go", conversation_id="ticket-1") as run:
                    async for _ in run:
                        pass
            if how == "run_stream":
                assert server.chats[0].body.get("stream") is True
        _assert_pydantic_ai(server, "ticket-1")


def test_pydantic_ai_run_sync() -> None:
    pydantic_ai = pytest.importorskip("pydantic_ai")
    with recording_server(PA_SCRIPT) as server:
        client = HintedAsyncOpenAI(base_url=server.base_url, api_key="k")
        _pa_agents(pydantic_ai, client).run_sync("go", conversation_id="ticket-1")
        _assert_pydantic_ai(server, "ticket-1")


# LangChain / LangGraph

LG_SCRIPT = script(Lead=[call("lint"), chat_reply("done")], Help=[chat_reply("helped")])


def _lg_graph(client: HintedAsyncOpenAI, asynchronous: bool) -> Any:
    """A lead agent with a tool, then a research subgraph with an agent of its own."""
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool as lc_tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    from agentsdk.integrations.langchain import chat_openai_clients

    @lc_tool
    def lint() -> str:
        """Lint the code."""
        return "clean"

    llm = ChatOpenAI(model="tiny", **chat_openai_clients(client)).bind_tools([lint])

    def agent(system: str) -> Any:
        def node(state: Any) -> dict[str, list[Any]]:
            return {"messages": [llm.invoke([("system", system), *state["messages"]])]}

        async def anode(state: Any) -> dict[str, list[Any]]:
            return {"messages": [await llm.ainvoke([("system", system), *state["messages"]])]}

        return anode if asynchronous else node

    def route(state: Any) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else "research"

    research = StateGraph(MessagesState)
    research.add_node("helper", agent("Help."))
    research.add_edge(START, "helper")
    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent("Lead."))
    graph.add_node("tools", ToolNode([lint]))
    graph.add_node("research", research.compile())
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", "research"])
    graph.add_edge("tools", "agent")
    graph.add_edge("research", END)
    return graph.compile()


@pytest.mark.parametrize("how", ["invoke", "ainvoke", "stream", "astream"])
@pytest.mark.parametrize("end_session", [False, True])
async def test_langgraph_sync_async_streamed_with_a_subgraph_branch(
    how: str, end_session: bool
) -> None:
    pytest.importorskip("langgraph")
    from agentsdk.integrations.langchain import HintsCallbackHandler

    with recording_server(LG_SCRIPT, control_delay=0.005) as server:
        async with HintedAsyncOpenAI(base_url=server.base_url, api_key="k") as client:
            graph = _lg_graph(client, asynchronous=how.startswith("a"))
            handler = HintsCallbackHandler(client, end_session=end_session)
            config: Any = {"configurable": {"thread_id": "thread-7"}, "callbacks": [handler]}
            state = {"messages": [("user", "go")]}
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no hints lost, nothing to say
                if how == "invoke":
                    await asyncio.to_thread(graph.invoke, state, config)
                    assert handler.flush_sync(timeout=10)
                elif how == "stream":
                    await asyncio.to_thread(lambda: list(graph.stream(state, config)))
                    assert handler.flush_sync(timeout=10)
                elif how == "ainvoke":
                    await graph.ainvoke(state, config)
                else:
                    async for _ in graph.astream(state, config):
                        pass
                await handler.flush()
        hints = server.hints()
        assert {h["sid"] for h in hints} == {"thread-7"}
        assert [(h["br"], h["pbr"]) for h in hints] == [
            (None, None),
            (None, None),
            ("root/research-1", "root"),
        ]
        assert all(isinstance(h["gap"], float) for h in hints)
        assert_forks_first(server)
        events = server.events()
        assert [e["type"] for e in events if e["type"] != "tool_start" or e["tool"] == "lint"] == [
            "tool_start",
            "tool_end",
            "fork",
            "end",
            *(["end"] if end_session else []),
        ]
        assert events[-2] == {"type": "end", "br": "root/research-1"}
        if not end_session:
            assert (events[-1]["type"], events[-1]["tool"]) == ("tool_start", "user")
