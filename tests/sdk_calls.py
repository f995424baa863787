"""Test helper: run an agent on a real server and keep what each model call cost."""

from __future__ import annotations

from agentsdk import Agent, HintedAsyncOpenAI, LLMEndEvent, Runner, RunResult, Session, Usage
from server_ext import LocalServer


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
