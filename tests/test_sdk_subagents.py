"""Sub-agents: Agent.as_tool and Runner.fan_out on child branches, with fork/end events."""

from __future__ import annotations

from collections import Counter

import pytest

from agentsdk import (
    Agent,
    MaxTurnsExceeded,
    ModelRequest,
    Reply,
    RunContext,
    Runner,
    RunResult,
    ScriptedCall,
    ScriptedModel,
    tool,
)
from agentsdk._env import BranchContext, RunEnv, root_context
from hints_spec import End, Fork, ToolStart

pytestmark = pytest.mark.anyio


@tool
def lookup(key: str = "") -> str:
    """Look a key up."""
    return f"value of {key}"


@tool
def summarize() -> str:
    return "summary"


def _per_branch(replies: dict[str, list[Reply]]) -> ScriptedModel:
    """Reply by branch, in order within each branch (branches run concurrently)."""
    served: Counter[str] = Counter()

    def script(request: ModelRequest) -> Reply:
        index = served[request.branch]
        served[request.branch] += 1
        return replies[request.branch][index]

    return ScriptedModel(script)


async def test_agent_as_tool_runs_on_a_child_branch() -> None:
    researcher = Agent(name="researcher", instructions="Research.", tools=[lookup])
    parent = Agent(
        name="lead", instructions="Lead.", model="m", tools=[researcher.as_tool(), summarize]
    )
    model = _per_branch(
        {
            "root": [[ScriptedCall("researcher", {"input": "find x"})], "final"],
            "root/researcher-1": [[ScriptedCall("lookup", {"key": "x"})], "x is 1"],
        }
    )
    result = await Runner.run(parent, "go", client=model)
    assert result.final_output == "final"
    child_requests = [r for r in model.requests if r.branch == "root/researcher-1"]
    assert len(child_requests) == 2
    for request in child_requests:
        assert request.hints is not None
        assert (request.hints.sid, request.hints.pbr) == (result.session_id, "root")
        assert request.kwargs["model"] == "m"  # inherited from the parent agent
    first = child_requests[0]
    assert first.messages == [
        {"role": "system", "content": "Research."},
        {"role": "user", "content": "find x"},
    ]
    assert [t["function"]["name"] for t in first.tools] == ["lookup"]
    tool_messages = [m for m in result.new_messages if m["role"] == "tool"]
    assert tool_messages[0]["content"] == "x is 1"
    assert result.usage.requests == 4  # the parent's usage includes its child's
    assert model.events_of(Fork) == [Fork(parent=None, children=["root/researcher-1"])]
    assert End(br="root/researcher-1") in model.events_of(End)
    assert ToolStart(br="root/researcher-1", tool="lookup", eta=1.0) in model.events_of(ToolStart)


async def test_fan_out_children_share_the_parent_prefix() -> None:
    alpha = Agent(name="alpha", instructions="Be alpha.")
    beta = Agent(name="beta", tools=[summarize])
    results: list[RunResult] = []

    @tool
    async def delegate(ctx: RunContext) -> str:
        results.extend(await Runner.fan_out(ctx, [(alpha, "a?"), (beta, "b?"), (alpha, "c?")]))
        return " | ".join(r.final_output for r in results)

    parent = Agent(name="lead", instructions="Lead.", model="m", tools=[delegate, lookup])
    model = _per_branch(
        {
            "root": [[ScriptedCall("lookup"), ScriptedCall("delegate")], "merged"],
            "root/alpha-1": ["A"],
            "root/beta-1": [[ScriptedCall("lookup", {"key": "b"})], "B"],
            "root/alpha-2": ["C"],
        }
    )
    result = await Runner.run(parent, "go", client=model)
    assert [r.branch for r in results] == ["root/alpha-1", "root/beta-1", "root/alpha-2"]
    assert [r.final_output for r in results] == ["A", "B", "C"]
    assert model.events_of(Fork) == [
        Fork(parent=None, children=["root/alpha-1", "root/beta-1", "root/alpha-2"])
    ]
    assert {e.br for e in model.events_of(End)} == {
        "root/alpha-1",
        "root/beta-1",
        "root/alpha-2",
        None,
    }
    parent_prompt = model.requests[0]
    for branch, opening in [("root/alpha-1", "Be alpha.\n\na?"), ("root/beta-1", "b?")]:
        first = next(r for r in model.requests if r.branch == branch)
        assert first.messages == [*parent_prompt.messages, {"role": "user", "content": opening}]
        assert first.tools[:2] == parent_prompt.tools  # the parent's tools first
    alpha_first = next(r for r in model.requests if r.branch == "root/alpha-1")
    assert alpha_first.tools == parent_prompt.tools
    assert alpha_first.cached_tokens >= parent_prompt.prompt_tokens - 1  # all of the parent
    # A child with tools of its own diverges where they are rendered, after the parent's.
    beta_first = next(r for r in model.requests if r.branch == "root/beta-1")
    assert [t["function"]["name"] for t in beta_first.tools] == ["delegate", "lookup", "summarize"]
    assert 0 < beta_first.cached_tokens < parent_prompt.prompt_tokens
    assert result.usage.requests == 2 + 1 + 2 + 1


async def test_nested_children_and_failures() -> None:
    leaf = Agent(name="leaf", tools=[lookup])
    middle = Agent(name="middle", tools=[leaf.as_tool()])
    root = Agent(name="root agent", model="m", tools=[middle.as_tool(max_turns=3)])
    model = _per_branch(
        {
            "root": [[ScriptedCall("middle", {"input": "go"})], "gave up"],
            "root/middle-1": [[ScriptedCall("leaf", {"input": "deeper"})], "mid done"],
            "root/middle-1/leaf-1": [[ScriptedCall("lookup")]] * 10,  # never finishes
        }
    )
    result = await Runner.run(root, "go", client=model)
    leaf_requests = [r for r in model.requests if r.branch == "root/middle-1/leaf-1"]
    assert len(leaf_requests) == 10  # DEFAULT_MAX_TURNS: the leaf's own limit
    assert leaf_requests[0].hints is not None and leaf_requests[0].hints.pbr == "root/middle-1"
    tool_outputs = [m["content"] for m in result.new_messages if m["role"] == "tool"]
    assert tool_outputs == ["mid done"]
    middle_second = [r for r in model.requests if r.branch == "root/middle-1"][1]
    error = middle_second.messages[-1]["content"]
    assert error.startswith("Error: MaxTurnsExceeded: agent 'leaf' still called tools after")
    # Called directly, fan_out raises the child's failure.
    with pytest.raises(MaxTurnsExceeded):
        looping = _per_branch({"root/leaf-1": [[ScriptedCall("lookup")]]})
        await Runner.fan_out(_root_context(looping), [(leaf, "x")], max_turns=1)


def _root_context(model: ScriptedModel) -> BranchContext:
    from agentsdk import RunConfig
    from agentsdk._latency import LatencyEstimator
    from agentsdk._loop import run_agent
    from agentsdk._tracing import ClientMetrics, tracer

    async def emit(event: object) -> None:
        return None

    env = RunEnv(
        model,
        RunConfig(),
        emit,
        "s",
        None,
        LatencyEstimator(),
        tracer(None),
        ClientMetrics(None),
        None,
        run_agent,
    )
    return root_context(Agent(name="p", model="m"), "m", "s1", None, env)


def test_branch_ids_are_deterministic_and_bounded() -> None:
    env = _root_context(ScriptedModel([]))._branch.env
    assert env.new_branch("root", "Code Reviewer!") == "root/Code-Reviewer-1"
    assert env.new_branch("root", "Code Reviewer!") == "root/Code-Reviewer-2"
    assert env.new_branch("root/x-1", "Code Reviewer!") == "root/x-1/Code-Reviewer-1"
    deep = "root" + "/agent-1" * 20
    branch = env.new_branch(deep, "agent")
    assert len(branch) <= 128 and branch.startswith("agent-1~")
    assert branch == _root_context(ScriptedModel([]))._branch.env.new_branch(deep, "agent")
