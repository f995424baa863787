"""Test helpers: a scripted coding agent, and a run on a real server that keeps what
each model call cost.

Random weights write garbage arguments, so the agent is forced through named tools that
take no parameters and are ``strict`` (the server then constrains the arguments to
``{}``), and ends with ``tool_choice="none"``: every turn is deterministic in shape.
"""

from __future__ import annotations

from agentsdk import (
    Agent,
    HintedAsyncOpenAI,
    LLMEndEvent,
    ModelSettings,
    Runner,
    RunResult,
    Session,
    Usage,
    tool,
)
from server_ext import LocalServer

# Long enough to fill several 64-token KV blocks, so that reuse shows in cached_tokens.
INSTRUCTIONS = "You are a coding agent working on a small Python project. " * 12


@tool(strict=True)
def list_dir() -> str:
    """List the project files."""
    return "calc.py\ntest_calc.py\nREADME.md"


@tool(strict=True, expected_seconds=0.5)
def run_tests() -> str:
    """Run the test suite."""
    return "FAILED test_calc.py::test_add - assert -1 == 5"


def coder(server: LocalServer, *tool_choice: str) -> Agent:
    """An agent that calls ``tool_choice``'s tools in that order, then answers."""
    return Agent(
        name="coder",
        instructions=INSTRUCTIONS,
        model=server.model,
        tools=[list_dir, run_tests],
        model_settings=ModelSettings(tool_choice=[*tool_choice, "none"], max_tokens=128),
    )


async def run_recording(
    agent: Agent, server: LocalServer, prompt: str, session: Session | None = None
) -> tuple[RunResult, list[tuple[str, Usage]]]:
    """Run streamed on a fresh hinted client, keeping each call's branch and usage."""
    calls: list[tuple[str, Usage]] = []
    client = HintedAsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    async with (
        client,
        Runner.run_streamed(agent, prompt, client=client, session=session) as stream,
    ):
        async for event in stream:
            if isinstance(event, LLMEndEvent):
                calls.append((event.context.branch, Usage.from_completion(event.response.usage)))
    return stream.result, calls
