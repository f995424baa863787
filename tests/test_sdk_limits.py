"""Runaway runs stop: a model-call budget per run, a fork depth, and children that do not
inherit the tool that forked them."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agentsdk import (
    DEFAULT_MAX_MODEL_CALLS,
    Agent,
    ForkDepthExceeded,
    ModelCallLimitExceeded,
    ModelRequest,
    Reply,
    RunConfig,
    RunContext,
    Runner,
    ScriptedCall,
    ScriptedModel,
    ToolCallOutputItem,
    tool,
)
from hints_spec import End, Fork

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]

HELPERS = [Agent(name=name, instructions=f"Be the {name}.") for name in ("a", "b", "c")]


def _fan_out_agent(recursive: bool) -> Agent:
    @tool
    async def investigate(ctx: RunContext) -> str:
        """Ask three helpers in parallel."""
        results = await Runner.fan_out(ctx, [(h, "go") for h in HELPERS], recursive=recursive)
        return " | ".join(r.final_output for r in results)

    return Agent(name="lead", instructions="Lead.", model="m", tools=[investigate])


def _always_fork(request: ModelRequest) -> Reply:
    return [ScriptedCall("investigate")]


def _ended_every_child(model: ScriptedModel) -> None:
    forked = [child for fork in model.events_of(Fork) for child in fork.children]
    ended = [end.br for end in model.events_of(End) if end.br is not None]
    assert forked and Counter(ended) == Counter(forked)


async def test_the_runaway_fan_out_stops_at_the_call_budget() -> None:
    # The case: a model that always calls the forking tool, max_turns=3.
    model = ScriptedModel(_always_fork)
    with pytest.raises(ModelCallLimitExceeded) as caught:
        await Runner.run(_fan_out_agent(recursive=False), "go", client=model, max_turns=3)
    assert caught.value.limit == DEFAULT_MAX_MODEL_CALLS < 100
    assert len(model.requests) == DEFAULT_MAX_MODEL_CALLS
    # Children never forked again: they cannot call the tool that started them.
    assert {r.branch.count("/") for r in model.requests} == {0, 1}
    _ended_every_child(model)
    assert model.events_of(End)[-1] == End()  # and the session's end


async def test_children_keep_the_forking_tool_in_their_prompt_but_cannot_call_it() -> None:
    served: Counter[str] = Counter()

    def script(request: ModelRequest) -> Reply:
        served[request.branch] += 1
        if request.branch == "root":
            return [ScriptedCall("investigate")] if served["root"] == 1 else "merged"
        return [ScriptedCall("investigate")] if served[request.branch] == 1 else "done"

    model = ScriptedModel(script)
    result = await Runner.run(_fan_out_agent(recursive=False), "go", client=model)
    assert result.final_output == "merged"
    assert len(model.requests) == 2 + 3 * 2
    first_child = next(r for r in model.requests if r.branch == "root/a-1")
    assert first_child.tools == model.requests[0].tools  # the shared prefix is intact
    second_child = [r for r in model.requests if r.branch == "root/a-1"][1]
    refusal = second_child.messages[-1]["content"]
    assert refusal.startswith("Error: tool 'investigate' started this sub-agent")
    assert len(model.events_of(Fork)) == 1


async def test_a_recursive_fan_out_stops_at_the_fork_depth() -> None:
    model = ScriptedModel(_always_fork)
    config = RunConfig(max_fork_depth=2, max_model_calls=10_000)
    with pytest.raises(ForkDepthExceeded, match="max_fork_depth=2"):
        await Runner.run(_fan_out_agent(recursive=True), "go", client=model, run_config=config)
    depths = Counter(r.branch.count("/") for r in model.requests)
    assert set(depths) == {0, 1, 2}
    assert depths[2] <= 9  # the grandchildren's first calls, at most, before the run stopped
    _ended_every_child(model)


async def test_an_agent_tool_child_is_bounded_too() -> None:
    helper = Agent(name="helper", instructions="Help.")
    lead = Agent(name="lead", model="m", tools=[helper.as_tool(fork_context=True)])
    model = ScriptedModel(lambda request: [ScriptedCall("helper", {"input": "x"})])
    with pytest.raises(ModelCallLimitExceeded):
        await Runner.run(lead, "go", client=model, run_config=RunConfig(max_model_calls=12))
    assert len(model.requests) == 12
    # Each child was refused the agent tool that started it and ran out of turns.
    child = [r for r in model.requests if r.branch == "root/helper-1"]
    assert len(child) == 10
    assert "started this sub-agent" in child[1].messages[-1]["content"]


async def test_a_child_that_runs_out_of_turns_is_news_for_its_parent() -> None:
    helper = Agent(name="helper", instructions="Help.")
    lead = Agent(name="lead", model="m", tools=[helper.as_tool(max_turns=2)])
    served: Counter[str] = Counter()

    def script(request: ModelRequest) -> Reply:
        served[request.branch] += 1
        if request.branch == "root":
            return [ScriptedCall("helper", {"input": "x"})] if served["root"] == 1 else "ok"
        return [ScriptedCall("nothing")]

    result = await Runner.run(lead, "go", client=ScriptedModel(script))
    [output] = [i for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    assert output.is_error and "MaxTurnsExceeded" in output.output
    assert result.final_output == "ok"


class _AlwaysFork(BaseHTTPRequestHandler):
    """An OpenAI-compatible stub whose model asks for ``investigate`` on every call."""

    chats = 0
    _count = threading.Lock()  # forked branches call at once: one thread per request

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path.endswith("/chat/completions"):
            with self._count:
                type(self).chats += 1
                n = self.chats
            reply: dict[str, Any] = {
                "id": f"c{n}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls",
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": f"call{n}",
                                    "type": "function",
                                    "function": {"name": "investigate", "arguments": "{}"},
                                }
                            ],
                        },
                    }
                ],
            }
        else:  # control events
            reply = {"v": 1, "results": [{"index": 0, "outcome": "accepted"}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_fan_out_example_finishes_against_a_model_that_always_forks() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _AlwaysFork)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "fan_out.py"), "--base-url", base_url],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stopped: the run made its 50 model calls" in done.stdout
    # The run counts a call before it is sent, and stopping cancels the branches
    # still calling: a counted call may never reach the server, none past the limit may.
    assert DEFAULT_MAX_MODEL_CALLS // 2 < _AlwaysFork.chats <= DEFAULT_MAX_MODEL_CALLS
