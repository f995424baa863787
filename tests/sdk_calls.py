"""Test helpers: a scripted coding agent, a run on a real server that keeps what each
model call cost, and an OpenAI-compatible server in a MockTransport.

Random weights write garbage arguments, so the agent is forced through named tools that
take no parameters and are ``strict`` (the server then constrains the arguments to
``{}``), and ends with ``tool_choice="none"``: every turn is deterministic in shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx2

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
from hints_spec import CONTROL_PATH, HEADER_NAME, parse_header
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


def chat_reply(content: str | None = None, tool: str | None = None) -> dict[str, Any]:
    """A chat completion: text, or one call of ``tool`` with no arguments."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool is not None:
        message["tool_calls"] = [
            {
                "id": f"call-{tool}",
                "type": "function",
                "function": {"name": tool, "arguments": "{}"},
            }
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "tiny",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if tool else "stop"}
        ],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 5,
            "total_tokens": 105,
            "prompt_tokens_details": {"cached_tokens": 64},
        },
    }


def _sse(reply: dict[str, Any]) -> bytes:
    """``reply`` (a ``chat_reply``) as a chat completion stream: the message in one
    chunk, then the usage, then ``[DONE]``."""
    choice = reply["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
    if "tool_calls" in message:
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
    head = {k: reply[k] for k in ("id", "created", "model")}
    chunks = [
        {**head, "object": "chat.completion.chunk",
         "choices": [{"index": 0, "delta": delta, "finish_reason": choice["finish_reason"]}]},
        {**head, "object": "chat.completion.chunk", "choices": [], "usage": reply["usage"]},
    ]  # fmt: skip
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


@dataclass
class FakeServer:
    """An OpenAI-compatible server in a MockTransport: scripted chats, recorded requests."""

    replies: list[dict[str, Any]]
    chats: list[tuple[httpx2.Headers, dict[str, Any]]] = field(default_factory=list)
    control: list[tuple[httpx2.Headers, dict[str, Any]]] = field(default_factory=list)

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        if request.url.path == CONTROL_PATH:
            self.control.append((request.headers, body))
            results = [{"index": i, "outcome": "accepted"} for i in range(len(body["events"]))]
            return httpx2.Response(200, json={"v": 1, "results": results})
        self.chats.append((request.headers, body))
        reply = self.replies.pop(0)
        if body.get("stream"):
            return httpx2.Response(
                200, content=_sse(reply), headers={"content-type": "text/event-stream"}
            )
        return httpx2.Response(200, json=reply)

    def hints(self) -> list[dict[str, object]]:
        return [parse_header(headers[HEADER_NAME]).normalized() for headers, _ in self.chats]

    def events(self) -> list[dict[str, Any]]:
        return [event for _, body in self.control for event in body["events"]]

    def client(self) -> HintedAsyncOpenAI:
        transport = httpx2.MockTransport(self)
        return HintedAsyncOpenAI(
            base_url="http://model.test:8000/v1",
            api_key="k",
            http_client=httpx2.AsyncClient(transport=transport),
        )
