"""Prefix discipline: each request's prompt extends the previous one, byte for byte."""

from __future__ import annotations

import itertools
import json

import pytest

from agentsdk import Agent, InMemorySession, Reply, Runner, ScriptedCall, ScriptedModel, tool

pytestmark = pytest.mark.anyio


@tool
def list_dir(path: str = ".") -> list[str]:
    """List a directory."""
    return ["a.py", "b.py"]


@tool
async def read_file(path: str = "a.py") -> str:
    """Read a file."""
    return f"contents of {path}"


# Declared out of order on purpose: rendering must not depend on it.
AGENT = Agent(name="coder", instructions="You code.", model="m", tools=[read_file, list_dir])
SCRIPT: list[Reply] = [
    [ScriptedCall("list_dir")],
    [ScriptedCall("read_file", {"path": "a.py"}), ScriptedCall("read_file", "garbage")],
    [ScriptedCall("list_dir", "true")],
    "done",
]


def _rendered(value: object) -> str:
    return json.dumps(value, sort_keys=True)


async def test_turn_n_is_a_prefix_of_turn_n_plus_1() -> None:
    model = ScriptedModel(SCRIPT)
    await Runner.run(AGENT, "fix it", client=model)
    requests = model.requests
    assert len(requests) == 4
    for before, after in itertools.pairwise(requests):
        assert after.messages[: len(before.messages)] == before.messages
        assert _rendered(after.tools) == _rendered(before.tools)
        assert after.cached_tokens >= before.prompt_tokens - 1
    assert [t["function"]["name"] for t in requests[0].tools] == ["list_dir", "read_file"]


async def test_nothing_per_run_enters_the_prefix() -> None:
    first, second = ScriptedModel(SCRIPT), ScriptedModel(SCRIPT)
    await Runner.run(AGENT, "fix it", client=first)
    await Runner.run(AGENT, "fix it", client=second)
    # Different runs (different session ids), byte-identical prompts.
    assert first.requests[0].hints != second.requests[0].hints
    for a, b in zip(first.requests, second.requests, strict=True):
        assert _rendered(a.messages) == _rendered(b.messages)
        assert _rendered(a.tools) == _rendered(b.tools)


async def test_a_resumed_session_extends_its_last_prompt() -> None:
    session = InMemorySession("s-prefix")
    model = ScriptedModel([*SCRIPT, [ScriptedCall("list_dir")], "again"])
    await Runner.run(AGENT, "fix it", client=model, session=session)
    last_of_first_run = model.requests[3]
    await Runner.run(AGENT, "and now?", client=model, session=session)
    resumed = model.requests[4]
    assert resumed.messages[: len(last_of_first_run.messages)] == last_of_first_run.messages
    assert resumed.messages[len(last_of_first_run.messages)] == {
        "role": "assistant",
        "content": "done",
    }
