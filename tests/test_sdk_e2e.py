"""The agent framework against the real vLLM CPU server (random weights, hermes tool parser).

The agents are scripted as in ``sdk_calls``: every turn is deterministic in shape.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentsdk import (
    Agent,
    ControlChannel,
    HintedAsyncOpenAI,
    HintedOpenAI,
    InMemorySession,
    ModelSettings,
    RunContext,
    Runner,
    ToolCallOutputItem,
    tool,
)
from server_ext import LocalServer

from sdk_calls import INSTRUCTIONS, coder, run_recording

pytestmark = [pytest.mark.server, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[1]


async def test_multi_turn_loop_with_real_tool_calls(vllm_server: LocalServer) -> None:
    agent = coder(vllm_server, "list_dir", "run_tests", "list_dir")
    session = InMemorySession("e2e-loop")
    before = vllm_server.metrics()
    result, calls = await run_recording(agent, vllm_server, "Fix it.", session=session)
    after = vllm_server.metrics()
    # The server saw the session: every model call carried hints, and the tool
    # lifecycle arrived as accepted control events.
    seen = after["agent_hints_requests_total"] - before.get("agent_hints_requests_total", 0)
    assert seen == 4
    events = after.get("agent_hints_control_events_total", 0) - before.get(
        "agent_hints_control_events_total", 0
    )
    assert events >= 3  # three tool_start (each batch's next request is its tool_end)
    outputs = [i for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    assert [(o.call.name, o.is_error) for o in outputs] == [
        ("list_dir", False),
        ("run_tests", False),
        ("list_dir", False),
    ]
    assert len(calls) == 4
    assert all(usage.cached_tokens > 0 for _, usage in calls[1:])  # turns 2+ reuse the prefix
    assert result.usage.cached_tokens == sum(usage.cached_tokens for _, usage in calls)
    stats = await session.get_stats()
    assert stats.usage == result.usage
    assert set(stats.latency.tools) == {"list_dir", "run_tests"}


async def test_forked_children_reuse_the_parent_prefix(vllm_server: LocalServer) -> None:
    child_settings = ModelSettings(tool_choice="none", max_tokens=16)
    reviewer = Agent(name="reviewer", instructions="Review.", model_settings=child_settings)
    tester = Agent(name="tester", instructions="Test.", model_settings=child_settings)

    @tool(strict=True)
    async def delegate(ctx: RunContext) -> str:
        """Ask the reviewer and the tester."""
        results = await Runner.fan_out(ctx, [(reviewer, "Look."), (tester, "Look.")])
        return "\n".join(r.final_output for r in results)

    lead = Agent(
        name="lead",
        instructions=INSTRUCTIONS,
        model=vllm_server.model,
        tools=[delegate],
        model_settings=ModelSettings(tool_choice=["delegate", "none"], max_tokens=128),
    )
    result, calls = await run_recording(lead, vllm_server, "Review the change.")
    branches = [branch for branch, _ in calls]
    assert branches[0] == "root" and branches[-1] == "root"
    assert sorted(branches[1:-1]) == ["root/reviewer-1", "root/tester-1"]
    lead_prompt = calls[0][1].input_tokens
    for branch, usage in calls[1:-1]:
        # The child's first (and only) call starts with the lead's whole prompt.
        assert usage.cached_tokens >= 64, branch
        assert usage.cached_tokens >= (lead_prompt // 64 - 1) * 64, branch
    assert result.usage.requests == 4


def test_sync_client_in_a_worker_thread(vllm_server: LocalServer) -> None:
    agent = coder(vllm_server, "run_tests")
    client = HintedOpenAI(base_url=vllm_server.base_url, api_key="unused", max_retries=0)
    result = Runner.run_sync(agent, "Run the tests.", client=client)
    assert result.usage.requests == 2
    assert result.usage.cached_tokens > 0


async def test_a_hinted_agent_runs_unchanged_on_plain_vllm(plain_vllm_server: LocalServer) -> None:
    """Without the extension the hints cost nothing: vLLM ignores the header, the
    control endpoint's 404 turns the channel off for that client, and vLLM's own
    prefix cache still serves the later turns."""
    client = HintedAsyncOpenAI(base_url=plain_vllm_server.base_url, api_key="unused", max_retries=0)
    async with client:
        result = await Runner.run(
            coder(plain_vllm_server, "list_dir", "run_tests"), "Fix.", client=client
        )
        assert not ControlChannel(client).enabled
    outputs = [i for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    assert [(o.call.name, o.is_error) for o in outputs] == [
        ("list_dir", False),
        ("run_tests", False),
    ]
    assert result.usage.requests == 3
    assert result.usage.cached_tokens > 0


@pytest.mark.parametrize("example", ["coding_agent.py", "fan_out.py", "swap_client.py"])
def test_examples_run_against_the_server(vllm_server: LocalServer, example: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / example),
            "--base-url",
            vllm_server.base_url,
            "--model",
            vllm_server.model,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "cached" in done.stdout
