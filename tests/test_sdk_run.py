"""The agent loop on ScriptedModel: turns, parallel tools, errors, hints, hooks, streaming."""

from __future__ import annotations

import socket
import time
from typing import Any

import anyio
import httpx2
import openai
import pytest

from agentsdk import (
    Agent,
    AgentEndEvent,
    AgentStartEvent,
    HintedAsyncOpenAI,
    HintedOpenAI,
    InMemorySession,
    LatencyEstimator,
    LatencyStats,
    LLMEndEvent,
    LLMStartEvent,
    MaxTurnsExceeded,
    Message,
    MessageOutputItem,
    ModelCallError,
    ModelRequest,
    ModelSettings,
    RunConfig,
    RunContext,
    RunHooks,
    RunItemEvent,
    Runner,
    ScriptedCall,
    ScriptedModel,
    StreamEvent,
    Tool,
    ToolCallItem,
    ToolCallOutputItem,
    ToolEndEvent,
    ToolStartEvent,
    UserError,
    hint_scope,
    tool,
)
from hints_spec import USER_TOOL, End, ToolStart

pytestmark = pytest.mark.anyio


@tool(expected_seconds=2.5)
async def nap(seconds: float = 0.0) -> str:
    """Sleep, then say so."""
    await anyio.sleep(seconds)
    return f"slept {seconds}"


@tool
def boom() -> str:
    raise RuntimeError("disk on fire")


@tool(timeout=0.1)
async def hang() -> str:
    await anyio.sleep_forever()
    return ""


@tool(timeout=0.1)
def hang_sync() -> str:
    time.sleep(1.0)
    return ""


def _agent(*tools: Tool, **settings: Any) -> Agent:
    return Agent(
        name="worker",
        instructions="You work.",
        model="m",
        tools=tools,
        model_settings=ModelSettings(**settings),
    )


def _tool_outputs(messages: list[Message]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


async def test_loop_runs_tools_until_text() -> None:
    model = ScriptedModel(
        [
            [ScriptedCall("nap", {"seconds": 0}, id="a")],
            [ScriptedCall("nap", {}, id="b")],
            "all done",
        ]
    )
    result = await Runner.run(_agent(nap), "go", client=model)
    assert result.final_output == "all done"
    assert result.input == [{"role": "user", "content": "go"}]
    assert [type(i) for i in result.new_items] == [
        ToolCallItem,
        ToolCallOutputItem,
        ToolCallItem,
        ToolCallOutputItem,
        MessageOutputItem,
    ]
    assert _tool_outputs(result.new_messages) == {"a": "slept 0.0", "b": "slept 0.0"}
    assert result.usage.requests == 3
    assert result.usage.input_tokens == sum(r.prompt_tokens for r in model.requests)
    assert result.usage.cached_tokens == sum(r.cached_tokens for r in model.requests) > 0
    first = model.requests[0]
    assert first.messages[0] == {"role": "system", "content": "You work."}
    assert first.kwargs["model"] == "m"
    assert [t["function"]["name"] for t in first.tools] == ["nap"]


async def test_max_turns_is_a_typed_error() -> None:
    model = ScriptedModel(lambda request: [ScriptedCall("nap")])
    with pytest.raises(MaxTurnsExceeded) as caught:
        await Runner.run(_agent(nap), "loop", client=model, max_turns=3)
    assert caught.value.max_turns == 3
    assert len(model.requests) == 3


async def test_tool_failures_go_back_to_the_model() -> None:
    model = ScriptedModel(
        [
            [
                ScriptedCall("boom", id="raise"),
                ScriptedCall("hang", id="async_hang"),
                ScriptedCall("hang_sync", id="sync_hang"),
                ScriptedCall("missing", id="unknown"),
                ScriptedCall("nap", "Infinity", id="garbage"),
                ScriptedCall("nap", '{"seconds": "soon"}', id="invalid"),
                ScriptedCall("nap", '{"seconds": 0.01}', id="fine"),
            ],
            "recovered",
        ]
    )
    started = time.monotonic()
    result = await Runner.run(_agent(boom, hang, hang_sync, nap), "try", client=model)
    assert time.monotonic() - started < 0.8  # timeouts fire; the sync sleeper is abandoned
    assert result.final_output == "recovered"
    outputs = _tool_outputs(result.new_messages)
    assert outputs == {
        "raise": "Error: RuntimeError: disk on fire",
        "async_hang": "Error: tool 'hang' timed out after 0.1 s",
        "sync_hang": "Error: tool 'hang_sync' timed out after 0.1 s",
        "unknown": "Error: unknown tool 'missing' (available: boom, hang, hang_sync, nap)",
        "garbage": "Error: arguments must be a JSON object, got 'Infinity'",
        "invalid": (
            "Error: seconds: Input should be a valid number, unable to parse string as a number"
        ),
        "fine": "slept 0.01",
    }
    errors = {
        i.call.id for i in result.new_items if isinstance(i, ToolCallOutputItem) and i.is_error
    }
    assert errors == set(outputs) - {"fine"}
    # The history keeps a parseable version of garbage arguments (servers re-parse them).
    calls = {c["id"]: c for c in result.new_messages[0]["tool_calls"]}
    assert calls["garbage"]["function"]["arguments"] == "{}"
    assert calls["invalid"]["function"]["arguments"] == '{"seconds": "soon"}'
    # Tool messages follow the calls' order, whatever order the tools finished in.
    assert [m["tool_call_id"] for m in result.new_messages[1:-1]] == list(calls)


async def test_parallel_tool_calls_run_concurrently_under_a_cap() -> None:
    running = peak = 0

    @tool
    async def work() -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.1)
        running -= 1
        return "ok"

    calls = [ScriptedCall("work") for _ in range(6)]
    started = time.monotonic()
    await Runner.run(
        _agent(work),
        "fan",
        client=ScriptedModel([calls, "done"]),
        run_config=RunConfig(max_tool_concurrency=3),
    )
    assert peak == 3
    assert 0.18 < time.monotonic() - started < 0.5  # two waves of 0.1 s, not six


async def test_hints_on_every_request_and_control_events() -> None:
    model = ScriptedModel([[ScriptedCall("nap"), ScriptedCall("nap", {"seconds": 0.05})], "done"])
    result = await Runner.run(_agent(nap), "go", client=model)
    sid = result.session_id
    assert sid.startswith("run-")
    for request in model.requests:
        assert request.hints is not None
        assert (request.hints.sid, request.hints.br, request.hints.pbr) == (sid, None, None)
        assert request.hints.gap is not None and request.hints.gap > 0
    # Unseen tool: the gap is its declared expected_seconds; afterwards, what it took.
    assert model.requests[0].hints is not None and model.requests[0].hints.gap == 2.5
    later_gap = model.requests[1].hints.gap if model.requests[1].hints else None
    assert later_gap is not None and later_gap < 2.5
    assert {r.sid for r in model.control_events} == {sid}
    assert [type(r.event) for r in model.control_events] == [
        ToolStart,
        ToolStart,
        End,
    ]  # no tool_end: each batch's next request follows at once
    assert model.events_of(ToolStart)[0] == ToolStart(tool="nap", eta=2.5)
    assert model.events_of(End) == [End()]  # no session: the run ends it


async def test_runs_that_share_latency_stats_start_from_each_others_tool_times() -> None:
    shared = LatencyStats()
    config = RunConfig(shared_latency=shared)
    first = ScriptedModel([[ScriptedCall("nap", {"seconds": 0.05})], "done"])
    await Runner.run(_agent(nap), "go", client=first, run_config=config)
    second = ScriptedModel([[ScriptedCall("nap")], "done"])  # another session
    await Runner.run(_agent(nap), "go", client=second, run_config=config)
    # The declared 2.5 s, and one call that took 0.05 s: the median is the call.
    [eta] = [e.eta for e in second.events_of(ToolStart)]
    assert eta is not None and eta < 0.1
    assert second.requests[0].hints is not None and second.requests[0].hints.gap == eta
    alone = ScriptedModel([[ScriptedCall("nap")], "done"])
    await Runner.run(_agent(nap), "go", client=alone)
    assert [e.eta for e in alone.events_of(ToolStart)] == [2.5]  # nothing shared: the prior


async def test_a_tools_eta_is_the_branchs_wait_as_the_server_sees_it() -> None:
    """The server waits from a response to the branch's next request: the tool's
    own time and the loop's around it (here a slow hook). The ETA learns both."""

    class SlowHook(RunHooks):
        async def on_tool_end(
            self, context: RunContext, agent: Agent, tool: Tool, result: str
        ) -> None:
            await anyio.sleep(0.3)

    model = ScriptedModel([[ScriptedCall("nap")], [ScriptedCall("nap")], "done"])
    await Runner.run(_agent(nap), "go", client=model, hooks=SlowHook())
    first, second = (e.eta for e in model.events_of(ToolStart))
    assert first == 2.5  # the prior
    # The prior and one wait of ~0.3 s (the nap itself took ~0): the median is the wait.
    assert second is not None and 0.25 < second < 1.0
    assert model.requests[2].hints is not None and model.requests[2].hints.gap == second


async def test_durations_learned_elsewhere_plus_this_loops_own_time() -> None:
    """Tool durations learned on another host stay true here; this loop's own time
    around a batch (a slow hook) is learned from the first wait and added to every
    tool's ETA, however many shared calls say otherwise."""

    class SlowHook(RunHooks):
        async def on_tool_end(
            self, context: RunContext, agent: Agent, tool: Tool, result: str
        ) -> None:
            await anyio.sleep(0.3)

    elsewhere = LatencyEstimator(shared=(shared := LatencyStats()))
    for _ in range(20):
        elsewhere.observe("nap", 0.05)
    model = ScriptedModel([[ScriptedCall("nap")], [ScriptedCall("nap")], "done"])
    config = RunConfig(shared_latency=shared)
    await Runner.run(_agent(nap), "go", client=model, hooks=SlowHook(), run_config=config)
    first, second = (e.eta for e in model.events_of(ToolStart))
    assert first is not None and first < 0.1  # the shared durations; no overhead seen yet
    assert second is not None and 0.3 < second < 0.5  # ~0.05 s of nap and ~0.3 s around


async def test_no_tools_means_no_gap_and_outer_scope_is_kept() -> None:
    model = ScriptedModel(["hi"])
    with hint_scope(session="outer-session", ttl=600, prio=1):
        result = await Runner.run(Agent(name="chat", model="m"), "hello", client=model)
    hints = model.requests[0].hints
    assert hints is not None
    assert (hints.sid, hints.gap, hints.ttl, hints.prio) == ("outer-session", None, 600, 1)
    assert result.session_id == "outer-session"
    assert "tools" not in model.requests[0].kwargs


async def test_a_kept_session_waits_on_its_user_and_learns_the_reply_time() -> None:
    session = InMemorySession("s-user")
    first = ScriptedModel(["hi"])
    await Runner.run(_agent(), "x", client=first, session=session)
    # The run ended with the session kept: the branch now waits on its user, for the
    # prior at first; the run's end is remembered to time the reply.
    assert first.events_of(End) == []
    assert first.events_of(ToolStart) == [ToolStart(tool=USER_TOOL, eta=60.0)]
    ended = (await session.get_stats()).turn_ended_at
    assert ended is not None and abs(ended - time.time()) < 5.0
    second = ScriptedModel(["again"])
    await Runner.run(_agent(), "y", client=second, session=session)
    [wait] = second.events_of(ToolStart)
    assert wait.tool == USER_TOOL and wait.eta is not None and wait.eta < 1.0  # a fast user
    assert USER_TOOL in (await session.get_stats()).latency.tools
    with pytest.raises(ValueError, match="user_wait_prior"):
        RunConfig(user_wait_prior=0.0)


async def test_end_session_can_be_turned_off() -> None:
    model = ScriptedModel(["hi"])
    await Runner.run(_agent(), "x", client=model, run_config=RunConfig(end_session=False))
    assert model.events_of(End) == []


async def test_tool_choice_schedule_forces_then_releases() -> None:
    model = ScriptedModel([[ScriptedCall("nap")], [ScriptedCall("nap")], "done"])
    agent = _agent(nap, tool_choice=["nap", "required"], max_tokens=16, temperature=0.0)
    await Runner.run(agent, "go", client=model)
    choices = [r.kwargs["tool_choice"] for r in model.requests]
    assert choices == [{"type": "function", "function": {"name": "nap"}}, "required", "auto"]
    assert all(
        r.kwargs["max_tokens"] == 16 and r.kwargs["temperature"] == 0.0 for r in model.requests
    )
    with pytest.raises(UserError, match=r"tool_choice forces \['nope'\], which are not among"):
        await Runner.run(_agent(nap, tool_choice="nope"), "go", client=ScriptedModel(["x"]))


async def test_hooks_fire_in_order_with_the_openai_agents_signatures() -> None:
    seen: list[str] = []

    class Recorder(RunHooks):
        async def on_agent_start(self, context: RunContext, agent: Agent) -> None:
            seen.append(f"agent_start {agent.name} {context.branch} {context.context}")

        async def on_llm_start(
            self,
            context: RunContext,
            agent: Agent,
            system_prompt: str | None,
            input_items: list[Message],
        ) -> None:
            seen.append(f"llm_start {system_prompt} {len(input_items)}")

        async def on_llm_end(self, context: RunContext, agent: Agent, response: Any) -> None:
            seen.append("llm_end")

        async def on_tool_start(self, context: RunContext, agent: Agent, tool: Tool) -> None:
            assert context.tool_call is not None
            seen.append(f"tool_start {tool.name} {context.tool_call.id}")

        async def on_tool_end(
            self, context: RunContext, agent: Agent, tool: Tool, result: str
        ) -> None:
            seen.append(f"tool_end {result}")

        async def on_agent_end(self, context: RunContext, agent: Agent, output: Any) -> None:
            seen.append(f"agent_end {output}")

    model = ScriptedModel([[ScriptedCall("nap", id="c7")], "bye"])
    await Runner.run(_agent(nap), "go", client=model, hooks=Recorder(), context="deps")
    assert seen == [
        "agent_start worker root deps",
        "llm_start You work. 1",
        "llm_end",
        "tool_start nap c7",
        "tool_end slept 0.0",
        "llm_start You work. 3",
        "llm_end",
        "agent_end bye",
    ]


async def test_streamed_run_yields_events_then_result() -> None:
    model = ScriptedModel([[ScriptedCall("nap", id="c1")], "streamed"])
    events: list[StreamEvent] = []
    async with Runner.run_streamed(_agent(nap), "go", client=model) as stream:
        async for event in stream:
            events.append(event)
    assert stream.is_complete
    assert stream.result.final_output == "streamed"
    kinds = [type(e) for e in events]
    assert kinds == [
        AgentStartEvent,
        LLMStartEvent,
        LLMEndEvent,
        RunItemEvent,  # the call
        ToolStartEvent,
        ToolEndEvent,
        RunItemEvent,  # its output
        LLMStartEvent,
        LLMEndEvent,
        RunItemEvent,  # the text
        AgentEndEvent,
    ]
    items = [e.item for e in events if isinstance(e, RunItemEvent)]
    assert items == stream.result.new_items


async def test_streamed_run_reraises_and_can_be_left_early() -> None:
    async with Runner.run_streamed(_agent(), "go", client=ScriptedModel([])) as stream:
        with pytest.raises(RuntimeError, match="script exhausted"):
            async for _ in stream:
                pass
    with pytest.raises(RuntimeError, match="script exhausted"):
        _ = stream.result

    slow = ScriptedModel(lambda request: [ScriptedCall("nap", {"seconds": 10})])
    started = time.monotonic()
    async with Runner.run_streamed(_agent(nap), "go", client=slow) as stream:
        async for event in stream:
            if isinstance(event, ToolStartEvent):
                break  # leaving the block cancels the run
    assert time.monotonic() - started < 1
    assert not stream.is_complete


def test_run_sync_with_a_sync_client_and_input_list() -> None:
    model = ScriptedModel(["sync ok"])
    result = Runner.run_sync(
        _agent(),
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
        client=model,
    )
    assert result.final_output == "sync ok"
    assert len(result.to_input_list()) == 3


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_server_down_is_a_model_call_error_not_a_hang() -> None:
    base_url = f"http://127.0.0.1:{_closed_port()}/v1"
    agent = _agent(nap)
    started = time.monotonic()
    async_client = HintedAsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
    with pytest.raises(ModelCallError) as caught:
        async with async_client:
            await Runner.run(agent, "hi", client=async_client)
    assert isinstance(caught.value.__cause__, openai.APIConnectionError)
    sync_client = HintedOpenAI(base_url=base_url, api_key="x", max_retries=0)
    with pytest.raises(ModelCallError):
        await Runner.run(agent, "hi", client=sync_client)  # sync client: in a worker thread
    assert time.monotonic() - started < 10


async def test_model_errors_are_typed() -> None:
    error = openai.APITimeoutError(request=httpx2.Request("POST", "http://model/v1"))
    with pytest.raises(ModelCallError, match="timed out"):
        await Runner.run(_agent(), "x", client=ScriptedModel([error]))


async def test_request_records_match_model_request_type() -> None:
    model = ScriptedModel(["x"])
    await Runner.run(_agent(), "x", client=model)
    assert isinstance(model.requests[0], ModelRequest)
    assert model.requests[0].branch == "root"


async def test_the_root_branch_sends_no_branch_even_inside_a_branch_scope() -> None:
    # Requests and control events must agree: both name the root branch by omitting br.
    model = ScriptedModel([[ScriptedCall("nap")], "done"])
    with hint_scope(session="outer", branch="b1", parent="p0"):
        result = await Runner.run(_agent(nap), "go", client=model)
    assert result.branch == "root"
    assert [r.branch for r in model.requests] == ["root", "root"]
    assert all(r.hints is not None and r.hints.pbr is None for r in model.requests)
    assert [r.event for r in model.control_events] == [
        ToolStart(tool="nap", eta=2.5),
        End(),
    ]


class _StalledSink(ScriptedModel):
    """A control sink whose POSTs never return."""

    async def send(self, sid: str, events: Any) -> None:
        await anyio.sleep_forever()


async def test_a_cancelled_run_still_delivers_its_last_control_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slow = [ScriptedCall("nap", {"seconds": 10})]
    model = ScriptedModel([slow])
    with anyio.move_on_after(0.2):
        await Runner.run(_agent(nap), "go", client=model)
    assert [r.event for r in model.control_events] == [ToolStart(tool="nap", eta=2.5), End()]

    kept = ScriptedModel([slow])
    session = InMemorySession("s-left")
    async with Runner.run_streamed(_agent(nap), "go", client=kept, session=session) as stream:
        async for event in stream:
            if isinstance(event, ToolStartEvent):
                break  # leaving the block cancels the run
    assert [type(r.event) for r in kept.control_events] == [ToolStart, ToolStart]
    assert kept.events_of(ToolStart)[-1].tool == USER_TOOL

    # Delivery is bounded: a server that never answers holds a cancelled run only briefly.
    monkeypatch.setattr("agentsdk._run.CONTROL_TIMEOUT", 0.2)
    started = time.monotonic()
    with anyio.move_on_after(0.1):
        await Runner.run(_agent(nap), "go", client=_StalledSink([slow]))
    assert time.monotonic() - started < 1.5  # the patched 0.2 s, not the default 2 s


async def test_the_callers_own_errors_come_out_unwrapped() -> None:
    with pytest.raises(KeyError) as caught:
        async with Runner.run_streamed(_agent(), "go", client=ScriptedModel(["hi"])):
            raise KeyError("consumer")
    assert type(caught.value) is KeyError

    class Failing(RunHooks):
        async def on_tool_end(
            self, context: RunContext, agent: Agent, tool: Tool, result: str
        ) -> None:
            raise KeyError("hook")

    model = ScriptedModel([[ScriptedCall("nap"), ScriptedCall("nap", {"seconds": 5})], "done"])
    started = time.monotonic()
    with pytest.raises(KeyError) as caught:
        await Runner.run(_agent(nap), "go", client=model, hooks=Failing())
    assert type(caught.value) is KeyError
    assert time.monotonic() - started < 2.5  # the failing hook stops the 5 s tool
