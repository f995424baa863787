"""Test doubles for the server side, as pydantic-ai ships ``TestModel`` and httpx ``MockTransport``.

No vLLM import. ``ManualClock`` stands in for ``time.monotonic`` wherever the
policy, the engine glue or the prefetcher take a ``clock``; ``FakeBlockPool`` is
a ``BlockPort`` (``EngineRetention``'s view of vLLM's block pool) that counts
references; ``FakeDownstream`` is the ASGI app behind the middleware or the
prefetcher (vLLM's OpenAI server), recording what reaches it.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FakeBlockPool", "FakeDownstream", "ManualClock", "Received"]

Message = dict[str, Any]


class ManualClock:
    """A clock that moves only when told: set ``now`` or call ``advance``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move the clock forward by ``seconds``; returns the new time."""
        self.now += seconds
        return self.now


class FakeBlockPool:
    """A ``BlockPort`` with ``free`` unreferenced blocks and a reference count
    per held block (``refs``; ``+refs`` drops the zeros). The free count is the
    test's to set: holds and releases do not move it."""

    def __init__(self, free: int = 0, releases_for_room: bool = True) -> None:
        self.free = free
        self.releases_for_room = releases_for_room
        self.refs: Counter[int] = Counter()

    def hold(self, block_ids: Sequence[int]) -> None:
        self.refs.update(block_ids)

    def release(self, block_ids: Sequence[int], evict_first: bool = False) -> None:
        self.refs.subtract(block_ids)

    def free_blocks(self) -> int:
        return self.free


@dataclass(frozen=True)
class Received:
    """One request as it reached the downstream app."""

    path: str
    body: bytes
    headers: dict[bytes, bytes]

    def json(self) -> Any:
        return json.loads(self.body)


class FakeDownstream:
    """An ASGI app that reads each request whole, records it (``requests``)
    and answers 200 with ``headers`` and the body ``chunks`` (streamed, one
    message each). A ``content-length`` that does not match the body is a
    ``ValueError`` (the middleware rewrites bodies).

    ``hold(received)`` may return an event to wait on before answering (as a
    request waits for the engine); ``tail(received)`` one to wait on after the
    response has started with an empty chunk (as a stream decodes).
    ``cancelled`` counts requests cancelled while held."""

    def __init__(
        self,
        headers: Sequence[tuple[bytes, bytes]] = (),
        chunks: Sequence[bytes] = (b"{}",),
        hold: Callable[[Received], asyncio.Event | None] | None = None,
        tail: Callable[[Received], asyncio.Event | None] | None = None,
    ) -> None:
        self.headers = list(headers)
        self.chunks = list(chunks)
        self.hold = hold
        self.tail = tail
        self.requests: list[Received] = []
        self.cancelled = 0

    async def __call__(
        self, scope: Message, receive: Callable[[], Awaitable[Message]], send: Any
    ) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        received = Received(scope["path"], body, dict(scope["headers"]))
        length = received.headers.get(b"content-length")
        if length is not None and int(length) != len(body):
            raise ValueError(f"content-length {length!r} for a body of {len(body)} bytes")
        self.requests.append(received)
        held = self.hold(received) if self.hold is not None else None
        if held is not None:
            try:
                await held.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        tail = self.tail(received) if self.tail is not None else None
        await send({"type": "http.response.start", "status": 200, "headers": self.headers})
        if tail is not None:
            await send({"type": "http.response.body", "body": b"", "more_body": True})
            await tail.wait()
        for i, chunk in enumerate(self.chunks):
            more = i < len(self.chunks) - 1
            await send({"type": "http.response.body", "body": chunk, "more_body": more})
