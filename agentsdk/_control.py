"""Best-effort, ordered sender of control events (tool_start with ETA, tool_end, fork, end).

Control events only improve the server's cache retention: losing one costs some cache hits,
while raising or stalling would cost the agent its turn. So every failure becomes ``None``, each
POST is a single attempt with a short timeout, and a server without the endpoint (404/405) is not
asked again by that client. The POST goes through the openai client itself, so it shares the
connection pool, auth (API key, provider, workload identity) and default headers, and it
carries the W3C ``traceparent`` of the span current when it is sent. A channel's
``ControlSender`` keeps the events in the order they were submitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, Protocol, TypeVar, runtime_checkable

import anyio.to_thread
import httpx2
from openai import APIStatusError, AsyncOpenAI, OpenAI
from openai._types import RequestOptions
from opentelemetry import context as otel_context
from opentelemetry import propagate

from hints_spec import (
    CONTROL_PATH,
    MAX_EVENTS,
    PROTOCOL_VERSION,
    SESSION_HEADER,
    ControlEvent,
    ControlResponse,
)

from ._client import CONTROL_TIMEOUT, has_header, sync_twin
from ._errors import UserError, warn_user

__all__ = ["CONTROL_TIMEOUT", "ControlChannel", "ControlSender", "ControlSink"]

_log = logging.getLogger(__name__)


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


@runtime_checkable
class ControlSink(Protocol):
    """Where a ``ControlSender`` posts: a ``ControlChannel``, or a test double that records."""

    async def send(self, sid: str, events: Sequence[ControlEvent]) -> object: ...


@dataclass(frozen=True, slots=True)
class _Queued:
    sid: str
    event: ControlEvent
    trace: otel_context.Context


class ControlSender:
    """Delivers control events in the order they were submitted, never making the caller wait.

    One per control channel: the runner and every adapter submit through it. ``submit``
    only queues (from any thread, with or without an event loop), with the trace context
    current at that moment, so each POST carries the ``traceparent`` of the span that
    caused its events. One worker at a time posts the queue in order (a ``tool_end``
    overtaking its ``tool_start`` would mislead the server): a task on the submitting
    thread's event loop (from a thread without one, on the loop that last submitted, if
    it still runs), or else a daemon thread. Whatever queued up during
    a POST goes in the next, merged up to the protocol's 64 events while the events share
    a session and a trace context. A worker cancelled with its loop hands what is left to
    a thread, so a cancelled run's last events (its end, or the wait on its user), the ones
    the server most needs, still go out. ``flush`` / ``flush_sync`` wait until what was
    submitted before them is posted (or dropped: every POST is bounded by the channel's
    timeout).
    """

    def __init__(self, sink: ControlSink) -> None:
        self._sink = sink
        self._lock = threading.Condition()
        self._queue: deque[_Queued] = deque()
        self._submitted = 0  # events ever queued
        self._done = 0  # events posted or given up
        self._working = False
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # of the last submit from a loop
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def submit(
        self, sid: str, events: Sequence[ControlEvent], trace: otel_context.Context | None = None
    ) -> None:
        """Queue ``events`` for session ``sid``, sent with ``trace`` (default: the current
        trace context)."""
        trace = trace if trace is not None else otel_context.get_current()
        with self._lock:
            self._queue.extend(_Queued(sid, event, trace) for event in events)
            self._submitted += len(events)
            if self._working or not self._queue:
                return
            self._working = True
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop in this thread: the last one used, else a thread
            loop = self._loop
            try:
                if loop is None or not loop.is_running():
                    raise RuntimeError("no loop")
                loop.call_soon_threadsafe(self._start_task)
            except RuntimeError:
                self._start_thread()
        else:
            self._start_task()

    def bind_loop(self) -> None:
        """Post on this thread's running loop (if any) from now on, also what threads
        without a loop submit: where an async client's pool lives, for an adapter whose
        events can come from worker threads before any from the loop."""
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()

    async def flush(self) -> None:
        """Wait until every event submitted so far is posted (or given up)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._done >= self._submitted:
                return
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((self._submitted, loop, future))
        await future

    def flush_sync(self, timeout: float | None = None) -> bool:
        """``flush`` for code without an event loop; False if ``timeout`` ran out first, or
        at once where the worker is a task of this thread's loop (it could not run)."""
        with self._lock:
            task = self._task
            if self._working and task is not None and not task.done():
                with contextlib.suppress(RuntimeError):
                    if task.get_loop() is asyncio.get_running_loop():
                        return False
            mark = self._submitted
            return self._lock.wait_for(lambda: self._done >= mark, timeout)

    def _start_task(self) -> None:
        """Start the worker on this thread's running loop (it keeps the client's own
        connection pool); held, so that it is not collected mid-POST."""
        self._task = asyncio.get_running_loop().create_task(self._work_async())

    def _start_thread(self) -> None:
        threading.Thread(target=self._work_thread, name="agent-hints-control", daemon=True).start()

    def _next_batch(self) -> list[_Queued]:
        """The next POST's events (empty: the queue is done and the worker stops)."""
        with self._lock:
            if not self._queue:
                self._working = False
                return []
            batch = [self._queue.popleft()]
            while self._queue and len(batch) < MAX_EVENTS:
                following = self._queue[0]
                if following.sid != batch[0].sid or following.trace is not batch[0].trace:
                    break
                batch.append(self._queue.popleft())
            return batch

    def _finished(self, count: int) -> None:
        with self._lock:
            self._done += count
            ready = [w for w in self._waiters if w[0] <= self._done]
            self._waiters = [w for w in self._waiters if w[0] > self._done]
            self._lock.notify_all()
        for _, loop, future in ready:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, future)

    async def _work_async(self) -> None:
        batch: list[_Queued] = []
        try:
            while batch := self._next_batch():
                token = otel_context.attach(batch[0].trace)
                try:
                    await self._sink.send(batch[0].sid, [queued.event for queued in batch])
                except Exception as err:  # never into the agent: see the module docstring
                    _log.debug("control events not delivered: %r", err)
                finally:
                    otel_context.detach(token)
                self._finished(len(batch))
        except BaseException:  # cancelled with its loop: a thread posts the rest
            with self._lock:
                self._queue.extendleft(reversed(batch))
            self._start_thread()
            raise

    def _work_thread(self) -> None:
        send_sync = getattr(self._sink, "send_sync", None)
        while batch := self._next_batch():
            token = otel_context.attach(batch[0].trace)
            try:
                events = [queued.event for queued in batch]
                if send_sync is not None:
                    send_sync(batch[0].sid, events)
                else:  # a sink with only ``send`` (a test double)
                    asyncio.run(self._sink.send(batch[0].sid, events))
            except Exception as err:  # never into the agent: see the module docstring
                _log.debug("control events not delivered: %r", err)
            finally:
                otel_context.detach(token)
            self._finished(len(batch))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class ControlChannel(Generic[_ClientT]):
    """Sends SPEC control events for sessions served through ``client``.

    ``submit`` queues events on the channel's ``ControlSender`` and returns at once (from
    any thread, with or without a running loop); they are posted in submission order, and
    ``flush`` / ``flush_sync`` wait for them. ``send`` (either client; a sync client's POST
    runs in a worker thread) and ``send_sync`` (either client; an async one's through a
    sync twin sharing its settings) post one batch now. None of them raises on network or
    server errors: they return ``None``. As a context manager (``with`` or ``async
    with``) the channel flushes on exit.
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
        self._twin: OpenAI | None = None  # an async client's, for posts without a loop
        self.sender = ControlSender(self)

    @property
    def url(self) -> str:
        return self._url

    @property
    def enabled(self) -> bool:
        """False once the server answered that it has no control endpoint."""
        return self._client not in _unsupported

    def send_sync(self, sid: str, events: Sequence[ControlEvent]) -> ControlResponse | None:
        """POST ``events`` for session ``sid``; the server's per-event outcomes, or None."""
        client = self._client
        if isinstance(client, OpenAI):
            return self._post_sync(client, sid, events)
        if self._twin is None:
            self._twin = sync_twin(client)
        return self._post_sync(self._twin, sid, events)

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
        self, sid: str, events: Sequence[ControlEvent], trace: otel_context.Context | None = None
    ) -> None:
        """Queue ``events`` for session ``sid`` and return at once (``ControlSender.submit``)."""
        self.sender.submit(sid, events, trace)

    async def flush(self) -> None:
        """Wait for every submitted event (e.g. before closing the client)."""
        await self.sender.flush()

    def flush_sync(self, timeout: float | None = None) -> bool:
        """``flush`` without an event loop; False if ``timeout`` ran out first."""
        return self.sender.flush_sync(timeout)

    def __enter__(self) -> ControlChannel[_ClientT]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.flush_sync():
            warn_user(
                "ControlChannel: a `with` block in a running event loop cannot wait for its"
                " events (they are still sent): use `async with` there",
                RuntimeWarning,
            )
        self._close_twin()

    async def __aenter__(self) -> ControlChannel[_ClientT]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.flush()
        self._close_twin()

    def _close_twin(self) -> None:
        twin, self._twin = self._twin, None
        if twin is not None:
            twin.close()

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
