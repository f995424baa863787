"""Control events reach the server in the order they were submitted, from the runner and
from any thread, against a real HTTP server whose answers take a random while."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from agentsdk import Agent, ControlChannel, HintedAsyncOpenAI, HintedOpenAI, Runner, tool
from hints_spec import ToolEnd, ToolStart

from recording_server import recording_server
from sdk_calls import chat_reply

pytestmark = pytest.mark.anyio

TRIES = 100
_PAIRS = [e for i in range(TRIES) for e in (("tool_start", f"t{i}"), ("tool_end", f"t{i}"))]


async def test_events_arrive_in_submission_order_in_100_of_100_tries() -> None:
    with recording_server(control_delay=0.003) as server:
        async with (
            HintedAsyncOpenAI(base_url=server.base_url, api_key="k") as client,
            ControlChannel(client) as channel,
        ):
            for i in range(TRIES):
                channel.submit("s", [ToolStart(tool=f"t{i}", eta=1.0)])
                await asyncio.sleep(0)  # let the first POST start: the rest overlap it
                channel.submit("s", [ToolEnd(tool=f"t{i}")])
    assert [(e["type"], e["tool"]) for e in server.events()] == _PAIRS


def test_events_from_threads_without_a_loop_keep_their_order() -> None:
    """A sync caller (LangChain's ``invoke``, a tool's worker thread) on an async client's
    channel: posted by a thread, in order, and ``flush_sync`` waits for them."""
    with recording_server(control_delay=0.003) as server:
        client = HintedAsyncOpenAI(base_url=server.base_url, api_key="k")
        with ControlChannel(client) as channel:
            for i in range(TRIES):
                channel.submit("s", [ToolStart(tool=f"t{i}", eta=1.0)])
                channel.submit("s", [ToolEnd(tool=f"t{i}")])
            assert channel.flush_sync(timeout=30)
        assert len(server.events()) == 2 * TRIES
        kinds = [(e["type"], e["tool"]) for e in server.events()]
    assert kinds == _PAIRS
    assert threading.active_count() < 10  # one worker thread, not one per event


@tool(strict=True)
def delegate() -> str:
    """Hand the work to a helper."""
    return "unused"


def _fork_reply(body: dict[str, Any]) -> dict[str, Any]:
    first = len(body["messages"]) <= 2 and body["messages"][0]["content"] == "Lead."
    if not first:
        return chat_reply("done")
    reply = chat_reply(tool="helper")
    reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"input": "x"}'
    return reply


async def test_a_fork_reaches_the_server_before_its_childrens_first_requests() -> None:
    helper = Agent(name="helper", instructions="Help.", model="tiny")
    lead = Agent(name="lead", instructions="Lead.", model="tiny", tools=[helper.as_tool()])
    for _ in range(20):
        with recording_server(_fork_reply, control_delay=0.01) as server:
            async with HintedAsyncOpenAI(base_url=server.base_url, api_key="k") as client:
                await Runner.run(lead, "go", client=client)
            kinds = [
                ("fork" if any(e["type"] == "fork" for e in r.body["events"]) else "control")
                if r.kind == "control"
                else (r.hints.get("br") or "root")
                for r in server.log
            ]
        assert kinds.index("fork") < kinds.index("root/helper-1"), kinds


def test_run_sync_on_a_sync_client_sends_everything_in_order() -> None:
    with recording_server(lambda body: chat_reply("done")) as server:
        with HintedOpenAI(base_url=server.base_url, api_key="k") as client:
            Runner.run_sync(Agent(name="a", model="tiny", tools=[delegate]), "go", client=client)
        assert server.events() == [{"type": "end"}]
