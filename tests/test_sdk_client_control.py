"""ControlChannel: the wire form it sends and its never-raise, never-stall failure handling."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator

import httpx2
import openai
import pytest

from agentsdk._client import HintedAsyncOpenAI, HintedOpenAI
from agentsdk._control import ControlChannel
from hints_spec import (
    ControlEvent,
    ControlResponse,
    End,
    EventResult,
    Fork,
    Outcome,
    ToolEnd,
    ToolStart,
)

_EVENTS: list[ControlEvent] = [
    ToolStart(type="tool_start", br="root", tool="bash", eta=12.5),
    ToolEnd(type="tool_end", br="root", tool="bash"),
    Fork(type="fork", children=["a", "b"]),
    End(type="end"),
]
_ACCEPTED = ControlResponse(
    results=[EventResult(index=i, outcome=Outcome.ACCEPTED) for i in range(len(_EVENTS))]
)

Handler = Callable[[httpx2.Request], httpx2.Response]


class Recorder:
    """A MockTransport handler answering ``status`` and keeping every request it saw."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        if self.status != 200:
            return httpx2.Response(self.status, json={"error": {"message": "no"}})
        return httpx2.Response(200, json=_ACCEPTED.model_dump(mode="json"))


def _sync_client(handler: Handler, base_url: str = "http://hints.test/v1") -> HintedOpenAI:
    http = httpx2.Client(transport=httpx2.MockTransport(handler))
    return HintedOpenAI(api_key="sk-test", base_url=base_url, http_client=http)


def _async_client(handler: Handler) -> HintedAsyncOpenAI:
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    return HintedAsyncOpenAI(api_key="sk-test", base_url="http://hints.test/v1", http_client=http)


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
def silent_port() -> Iterator[int]:
    """Accepts connections (via the backlog) but never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


def test_sends_the_spec_request_with_the_client_auth() -> None:
    recorder = Recorder()
    channel = ControlChannel(_sync_client(recorder))
    assert channel.send_sync("s1", _EVENTS) == _ACCEPTED
    (request,) = recorder.requests
    assert str(request.url) == "http://hints.test/v1/agent-hints/events"
    assert request.headers["Authorization"] == "Bearer sk-test"
    assert request.headers["X-Session-ID"] == "s1"  # routers with session affinity hash it
    assert json.loads(request.content) == {
        "v": 1,
        "sid": "s1",
        "events": [
            {"type": "tool_start", "br": "root", "tool": "bash", "eta": 12.5},
            {"type": "tool_end", "br": "root", "tool": "bash"},
            {"type": "fork", "children": ["a", "b"]},
            {"type": "end"},
        ],
    }


def test_a_clients_own_session_header_routes_its_events_too() -> None:
    recorder = Recorder()
    http = httpx2.Client(transport=httpx2.MockTransport(recorder))
    client = HintedOpenAI(
        api_key="sk-test",
        base_url="http://hints.test/v1",
        http_client=http,
        default_headers={"x-session-id": "user-7"},
    )
    ControlChannel(client).send_sync("s1", _EVENTS)
    (request,) = recorder.requests
    assert request.headers.get_list("X-Session-ID") == ["user-7"]


def test_control_url_drops_only_a_trailing_v1() -> None:
    client = _sync_client(Recorder(), base_url="http://gw.test/llm/")
    assert ControlChannel(client).url == "http://gw.test/llm/v1/agent-hints/events"


def test_404_returns_none_and_stops_asking() -> None:
    recorder = Recorder(404)
    client = _sync_client(recorder)
    channel = ControlChannel(client)
    assert channel.send_sync("s1", _EVENTS) is None
    assert channel.send_sync("s1", _EVENTS) is None
    assert ControlChannel(client).send_sync("s1", _EVENTS) is None
    assert len(recorder.requests) == 1
    assert not channel.enabled


def test_400_returns_none_and_keeps_trying() -> None:
    recorder = Recorder(400)
    channel = ControlChannel(_sync_client(recorder))
    assert channel.send_sync("s1", _EVENTS) is None
    assert channel.send_sync("s1", _EVENTS) is None
    assert len(recorder.requests) == 2
    assert channel.enabled


def test_refused_connection_returns_none_quickly(closed_port: int) -> None:
    client = openai.OpenAI(api_key="sk-test", base_url=f"http://127.0.0.1:{closed_port}/v1")
    started = time.monotonic()
    assert ControlChannel(client).send_sync("s1", _EVENTS) is None
    assert time.monotonic() - started < 1.0


def test_silent_server_is_cut_off_by_the_timeout(silent_port: int) -> None:
    client = openai.OpenAI(api_key="sk-test", base_url=f"http://127.0.0.1:{silent_port}/v1")
    started = time.monotonic()
    assert ControlChannel(client, timeout=0.3).send_sync("s1", _EVENTS) is None
    assert time.monotonic() - started < 1.5


def test_async_send_submit_and_flush() -> None:
    recorder = Recorder()
    channel = ControlChannel(_async_client(recorder))

    async def main() -> None:
        assert await channel.send("s1", _EVENTS) == _ACCEPTED
        channel.submit("s1", _EVENTS[:1])
        await channel.flush()

    asyncio.run(main())
    assert len(recorder.requests) == 2


def test_async_send_with_a_sync_client_and_a_down_server(closed_port: int) -> None:
    client = HintedOpenAI(api_key="sk-test", base_url=f"http://127.0.0.1:{closed_port}/v1")
    channel = ControlChannel(client)

    async def main() -> None:
        assert await channel.send("s1", _EVENTS) is None
        channel.submit("s1", _EVENTS)
        await channel.flush()

    asyncio.run(main())


def test_async_404_stops_asking() -> None:
    recorder = Recorder(404)
    channel = ControlChannel(_async_client(recorder))

    async def main() -> None:
        assert await channel.send("s1", _EVENTS) is None
        assert await channel.send("s1", _EVENTS) is None

    asyncio.run(main())
    assert len(recorder.requests) == 1
