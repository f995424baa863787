"""What a run needs from a client: chat completions and, optionally, a control sink.

Typed as protocols so a run accepts ``openai.AsyncOpenAI``, ``openai.OpenAI``, their hinted
subclasses and ``ScriptedModel`` alike; ``ControlSender`` keeps a run's control events in
order on their way to the sink.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Sequence
from functools import partial
from typing import Any, Protocol, runtime_checkable

import anyio
import anyio.to_thread
import openai
from openai.types.chat import ChatCompletion
from opentelemetry import context as otel_context

from hints_spec import MAX_EVENTS, ControlEvent

from ._client import HintedAsyncOpenAI, HintedOpenAI
from ._control import CONTROL_TIMEOUT, ControlChannel
from ._errors import ModelCallError

__all__ = [
    "ControlSender",
    "ControlSink",
    "ModelClient",
    "control_sink",
    "create_completion",
    "is_model_client",
    "server_of",
]


class _Completions(Protocol):
    def create(self, *args: Any, **kwargs: Any) -> Any: ...


class _Chat(Protocol):
    @property
    def completions(self) -> _Completions: ...


class ModelClient(Protocol):
    """Anything with ``chat.completions.create`` (sync or async) returning a ``ChatCompletion``."""

    @property
    def chat(self) -> _Chat: ...


@runtime_checkable
class ControlSink(Protocol):
    """Where control events go: a ``ControlChannel``, or a test double that records them."""

    async def send(self, sid: str, events: Sequence[ControlEvent]) -> object: ...


def is_model_client(client: object) -> bool:
    """Whether ``client`` has the ``chat.completions.create`` a run calls."""
    completions = getattr(getattr(client, "chat", None), "completions", None)
    return callable(getattr(completions, "create", None))


def server_of(client: ModelClient) -> tuple[str, int] | None:
    """Host and port the client talks to (``server.address`` / ``server.port``), if known."""
    if not isinstance(client, openai.OpenAI | openai.AsyncOpenAI) or not client.base_url.host:
        return None
    url = client.base_url
    return url.host, url.port or (443 if url.scheme == "https" else 80)


def control_sink(client: ModelClient) -> ControlSink | None:
    """The control channel of a hinted client (or the client itself if it is a sink)."""
    if isinstance(client, HintedAsyncOpenAI | HintedOpenAI):
        return ControlChannel(client)
    return client if isinstance(client, ControlSink) else None


class ControlSender:
    """Delivers a run's control events in order, without ever making the run wait.

    ``submit`` only queues, with the trace context current at that moment (so each POST
    carries the ``traceparent`` of the span that caused its events). One sender task
    posts the queue in order (a ``tool_end`` overtaking its ``tool_start`` would mislead
    the server), merging whatever queued up during the previous POST into the next one,
    up to the protocol's 64 events, as long as the events share a trace context.
    Cancelled with its run, the task still posts what is queued until ``close``, for at
    most ``CONTROL_TIMEOUT``: a cancelled run's last events (its end, or the wait on its
    user) are the ones the server most needs.
    """

    def __init__(self, sink: ControlSink, sid: str) -> None:
        self._sink = sink
        self._sid = sid
        self._queue, self._pending = anyio.create_memory_object_stream[
            tuple[ControlEvent, otel_context.Context]
        ](math.inf)
        self._held: tuple[ControlEvent, otel_context.Context] | None = None

    def submit(
        self, events: Sequence[ControlEvent], trace: otel_context.Context | None = None
    ) -> None:
        """Queue ``events``, sent with ``trace`` (default: the current trace context)."""
        trace = trace if trace is not None else otel_context.get_current()
        with contextlib.suppress(anyio.BrokenResourceError):  # sender cancelled with the run
            for event in events:
                self._queue.send_nowait((event, trace))

    def close(self) -> None:
        """No more events: ``run`` returns once the queue is delivered."""
        self._queue.close()

    async def run(self) -> None:
        async with self._pending:
            try:
                await self._deliver()
            except anyio.get_cancelled_exc_class():
                with anyio.move_on_after(CONTROL_TIMEOUT, shield=True):
                    await self._deliver()
                raise

    async def _deliver(self) -> None:
        """Post the queue in batches until ``close``."""
        while True:
            if self._held is None:
                try:
                    self._held = await self._pending.receive()
                except anyio.EndOfStream:
                    return
            (event, trace), self._held = self._held, None
            batch = [event]
            with contextlib.suppress(anyio.WouldBlock, anyio.EndOfStream):
                while len(batch) < MAX_EVENTS:
                    following = self._pending.receive_nowait()
                    if following[1] is not trace:
                        self._held = following  # another span's events: the next POST
                        break
                    batch.append(following[0])
            token = otel_context.attach(trace)
            try:
                await self._sink.send(self._sid, batch)
            finally:
                otel_context.detach(token)


async def create_completion(client: ModelClient, request: dict[str, Any]) -> ChatCompletion:
    """One ``chat.completions.create`` call; every failure is a ``ModelCallError``.

    A sync ``openai.OpenAI`` runs in a worker thread (the hint scope's context variables
    go with it), so it never blocks the loop that runs tools and sibling branches.
    """
    create = client.chat.completions.create
    try:
        if isinstance(client, openai.OpenAI):
            response = await anyio.to_thread.run_sync(
                partial(create, **request), abandon_on_cancel=True
            )
        else:
            response = create(**request)
            if inspect.isawaitable(response):
                response = await response
    except openai.APIError as err:
        raise ModelCallError(f"model call failed: {err}") from err
    if not isinstance(response, ChatCompletion) or not response.choices:
        raise ModelCallError(f"model call returned no completion: {response!r:.200}")
    return response
