"""Best-effort sender of control events (tool_start with ETA, tool_end, fork, end).

Control events only improve the server's cache retention: losing one costs some cache hits,
while raising or stalling would cost the agent its turn. So every failure becomes ``None``, each
POST is a single attempt with a short timeout, and a server without the endpoint (404/405) is not
asked again by that client. The POST goes through the openai client itself, so it shares the
connection pool, auth (API key, provider, workload identity) and default headers, and it
carries the W3C ``traceparent`` of the span current when it is sent.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Sequence
from typing import Generic, TypeVar

import anyio.to_thread
import httpx2
from openai import APIStatusError, AsyncOpenAI, OpenAI
from openai._types import RequestOptions
from opentelemetry import propagate

from hints_spec import (
    CONTROL_PATH,
    PROTOCOL_VERSION,
    SESSION_HEADER,
    ControlEvent,
    ControlResponse,
)

from ._client import has_header
from ._errors import UserError

__all__ = ["CONTROL_TIMEOUT", "ControlChannel"]

_log = logging.getLogger(__name__)

CONTROL_TIMEOUT = 2.0
"""Default bound, in seconds, on one control POST: a lost event costs less than a stall."""

_ClientT = TypeVar("_ClientT", bound=OpenAI | AsyncOpenAI, covariant=True)

# Statuses meaning "this server has no control endpoint", as opposed to "these events are bad".
_UNSUPPORTED_STATUS = frozenset({404, 405})
# Clients whose server answered _UNSUPPORTED_STATUS; weak so that clients can still be collected.
_unsupported: weakref.WeakSet[OpenAI | AsyncOpenAI] = weakref.WeakSet()


def _control_url(client: OpenAI | AsyncOpenAI) -> str:
    """``{base_url without a trailing /v1}`` + ``CONTROL_PATH``."""
    base = str(client.base_url).rstrip("/")
    return base.removesuffix("/v1") + CONTROL_PATH


def _request_body(sid: str, events: Sequence[ControlEvent]) -> dict[str, object]:
    return {
        "v": PROTOCOL_VERSION,
        "sid": sid,
        "events": [event.model_dump(mode="json", exclude_none=True) for event in events],
    }


class ControlChannel(Generic[_ClientT]):
    """Sends SPEC control events for sessions served through ``client``.

    ``send`` works with either client (a sync client's POST runs in a worker thread);
    ``send_sync`` needs a sync client; ``submit`` schedules ``send`` on the running asyncio
    loop without awaiting it. None of them raises on network or server errors: they return
    ``None``.
    """

    def __init__(self, client: _ClientT, *, timeout: float = CONTROL_TIMEOUT) -> None:
        if not isinstance(client, OpenAI | AsyncOpenAI):
            raise UserError(
                f"ControlChannel: client must be an openai.OpenAI or openai.AsyncOpenAI,"
                f" got {type(client).__name__}"
            )
        if not (isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0):
            raise UserError(f"ControlChannel: timeout must be seconds > 0, got {timeout!r}")
        self._client: _ClientT = client
        self._url = _control_url(client)
        self._options: RequestOptions = {"timeout": timeout, "max_retries": 0}
        # A client whose own headers route by another value posts its events the same way.
        self._routes_itself = has_header(client.default_headers, SESSION_HEADER)
        self._pending: set[asyncio.Task[ControlResponse | None]] = set()

    @property
    def url(self) -> str:
        return self._url

    @property
    def enabled(self) -> bool:
        """False once the server answered that it has no control endpoint."""
        return self._client not in _unsupported

    def send_sync(
        self: ControlChannel[OpenAI], sid: str, events: Sequence[ControlEvent]
    ) -> ControlResponse | None:
        """POST ``events`` for session ``sid``; the server's per-event outcomes, or None."""
        client = self._client
        if not isinstance(client, OpenAI):  # only reachable by ignoring the type error
            raise TypeError("send_sync needs an openai.OpenAI client; use `await send(...)`")
        return self._post_sync(client, sid, events)

    async def send(self, sid: str, events: Sequence[ControlEvent]) -> ControlResponse | None:
        """POST ``events`` for session ``sid``; the server's per-event outcomes, or None."""
        client = self._client
        if isinstance(client, OpenAI):
            return await anyio.to_thread.run_sync(
                self._post_sync, client, sid, events, abandon_on_cancel=True
            )
        if not self.enabled:
            return None
        try:
            response = await client.post(
                self._url,
                cast_to=httpx2.Response,
                body=_request_body(sid, events),
                options=self._request_options(sid),
            )
            return ControlResponse.model_validate_json(response.content)
        except Exception as err:  # never into the agent: see the module docstring
            self._failed(err)
            return None

    def submit(
        self, sid: str, events: Sequence[ControlEvent]
    ) -> asyncio.Task[ControlResponse | None]:
        """Schedule ``send`` on the running loop and return at once (fire and forget).

        The channel holds the task until it finishes, so it is not garbage-collected
        mid-flight; ``flush`` waits for all of them.
        """
        task = asyncio.get_running_loop().create_task(self.send(sid, tuple(events)))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    async def flush(self) -> None:
        """Wait for every submitted send (e.g. before closing the client)."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    def _post_sync(
        self, client: OpenAI, sid: str, events: Sequence[ControlEvent]
    ) -> ControlResponse | None:
        if not self.enabled:
            return None
        try:
            response = client.post(
                self._url,
                cast_to=httpx2.Response,
                body=_request_body(sid, events),
                options=self._request_options(sid),
            )
            return ControlResponse.model_validate_json(response.content)
        except Exception as err:  # never into the agent: see the module docstring
            self._failed(err)
            return None

    def _request_options(self, sid: str) -> RequestOptions:
        """One POST's options: the session in ``X-Session-ID`` too, so that a router with
        session affinity delivers the events to the instance serving the session, and
        the current trace context."""
        headers: dict[str, str] = {} if self._routes_itself else {SESSION_HEADER: sid}
        propagate.inject(headers)
        return {**self._options, "headers": headers} if headers else self._options

    def _failed(self, err: Exception) -> None:
        if isinstance(err, APIStatusError) and err.status_code in _UNSUPPORTED_STATUS:
            _unsupported.add(self._client)
            _log.debug(
                "no control endpoint at %s (HTTP %d): not sending control events from this client",
                self._url,
                err.status_code,
            )
        else:
            _log.debug("control events to %s not delivered: %r", self._url, err)
