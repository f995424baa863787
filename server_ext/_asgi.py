"""ASGI plumbing the extension's middleware and prefetcher share: the types,
reading a body whole, answering JSON, and rewriting a scope or a JSON body.

No vLLM import, nothing of the extension's own.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, overload

__all__ = [
    "MAX_RATE_TENANTS",
    "ASGIApp",
    "Message",
    "RateLimit",
    "Receive",
    "Scope",
    "Send",
    "error_body",
    "peer",
    "read_body",
    "route",
    "send_json",
    "splice_members",
    "without_header",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_RATE_TENANTS = 65536
"""Tenants whose control-rate buckets are remembered (least recently used go)."""


class RateLimit:
    """Token buckets per tenant: ``rate`` per second, bursts of ``2 * rate``.

    At most ``MAX_RATE_TENANTS`` buckets are kept; a forgotten tenant starts
    full again, as a new one would.
    """

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate
        self._burst = max(2.0 * rate, 1.0)
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, tenant: str) -> float:
        """0 when ``tenant`` may go on, else the seconds until it may."""
        now = self._clock()
        tokens, then = self._buckets.pop(tenant, (self._burst, now))
        tokens = min(self._burst, tokens + (now - then) * self._rate)
        wait = 0.0 if tokens >= 1 else (1 - tokens) / self._rate
        self._buckets[tenant] = (tokens - 1 if wait == 0 else tokens, now)
        if len(self._buckets) > MAX_RATE_TENANTS:
            self._buckets.popitem(last=False)
        return wait


def route(scope: Scope) -> str:
    """The path below ``--root-path``, as vLLM's routing and auth match it."""
    return str(scope["path"]).removeprefix(scope.get("root_path", ""))


def peer(scope: Scope) -> str | None:
    client = scope.get("client")
    return str(client[0]) if client else None


def without_header(scope: Scope, name: bytes) -> Scope:
    if all(k != name for k, _ in scope["headers"]):
        return scope
    scope = dict(scope)
    scope["headers"] = [(k, v) for k, v in scope["headers"] if k != name]
    return scope


def splice_members(body: bytes, members: dict[str, Any]) -> bytes:
    """``body``, a JSON object with none of ``members``' keys, with ``members``
    added first; the rest of its bytes are kept as they are."""
    start = body.index(b"{") + 1
    rest = body[start:]
    comma = b"" if rest.lstrip()[:1] == b"}" else b","
    return body[:start] + json.dumps(members)[1:-1].encode() + comma + rest


@overload
async def read_body(receive: Receive) -> bytes: ...
@overload
async def read_body(receive: Receive, limit: int) -> bytes | None: ...
async def read_body(receive: Receive, limit: int | None = None) -> bytes | None:
    """The whole request body; None when it exceeds ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


async def send_json(
    send: Send,
    status: int,
    payload: dict[str, Any],
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    data = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})
