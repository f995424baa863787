"""Fan-out: a lead agent forks three sub-agents from its own context, then merges.

The children start from the lead's prompt (same system prompt, tools and history), so
their first requests hit the prefix the server already holds for the lead: watch the
cached tokens of each child's first call. The lead sends one ``fork`` control event
naming the three child branches, and each child's requests carry ``pbr`` (its parent).
The children cannot call ``investigate`` themselves, and the run stops after
``RunConfig.max_model_calls`` (50) whatever the model does.

    python examples/fan_out.py --base-url http://127.0.0.1:8000/v1 --model tiny
"""

from __future__ import annotations

import argparse

import anyio

from agentsdk import (
    Agent,
    HintedAsyncOpenAI,
    LLMEndEvent,
    ModelSettings,
    RunContext,
    RunLimitExceeded,
    Runner,
    RunResult,
    Usage,
    tool,
)

SETTINGS = ModelSettings(max_tokens=32, tool_choice="none")  # the children just answer

REVIEWER = Agent(
    name="reviewer", instructions="Review the change for bugs.", model_settings=SETTINGS
)
TESTER = Agent(
    name="tester", instructions="List the tests this change needs.", model_settings=SETTINGS
)
WRITER = Agent(name="writer", instructions="Draft the release note.", model_settings=SETTINGS)


@tool(strict=True)
async def investigate(ctx: RunContext) -> str:
    """Ask the reviewer, the tester and the writer in parallel."""
    results = await Runner.fan_out(
        ctx, [(REVIEWER, "The change."), (TESTER, "The change."), (WRITER, "The change.")]
    )
    return "\n".join(f"{r.agent_name}: {r.final_output[:80]}" for r in results)


async def main(base_url: str, model: str) -> None:
    lead = Agent(
        name="lead",
        instructions=(
            "You lead a code review. The change replaces the retention policy's LRU order "
            "with next-use order and adds a budget per tenant. " * 4
        ),
        model=model,
        tools=[investigate],
        # Force the fan-out, then an answer (random weights would not choose either).
        model_settings=ModelSettings(tool_choice=["investigate", "none"], max_tokens=128),
    )
    client = HintedAsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    first_call: dict[str, Usage] = {}
    result: RunResult | None = None
    try:
        async with Runner.run_streamed(lead, "Review the change.", client=client) as stream:
            async for event in stream:
                if isinstance(event, LLMEndEvent):
                    branch = event.context.branch
                    first_call.setdefault(branch, Usage.from_completion(event.response.usage))
        result = stream.result
    except RunLimitExceeded as stopped:  # a model that only ever asks for tools ends here
        print(f"stopped: {stopped}")
    for branch, usage in first_call.items():
        print(
            f"{branch:>18}: first call {usage.input_tokens} input tokens, "
            f"{usage.cached_tokens} cached"
        )
    if result is not None:
        print(f"lead: {result.final_output[:120]!r}")
        print(f"run total: {result.usage.requests} requests, {result.usage.cached_tokens} cached")
    await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args()
    anyio.run(main, args.base_url, args.model)
