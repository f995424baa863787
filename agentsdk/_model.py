"""What a run needs from a client: chat completions and, optionally, a control sink.

Typed as protocols so a run accepts ``openai.AsyncOpenAI``, ``openai.OpenAI``, their hinted
subclasses and ``ScriptedModel`` alike; a hinted client's (or a test double's) control
events go through the ordered ``ControlSender`` of its channel.
"""

from __future__ import annotations

import inspect
from functools import partial
from typing import Any, Protocol

import anyio
import anyio.to_thread
import openai
from openai.types.chat import ChatCompletion

from ._client import HintedAsyncOpenAI, HintedOpenAI
from ._control import ControlChannel, ControlSender, ControlSink
from ._errors import ModelCallError

__all__ = [
    "ModelClient",
    "control_sender",
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


def control_sender(client: ModelClient) -> ControlSender | None:
    """The ordered sender of a hinted client's control channel (or of the client itself,
    a test double with ``send``); None for a client that sends no control events."""
    if isinstance(client, HintedAsyncOpenAI | HintedOpenAI):
        return ControlChannel(client).sender
    return ControlSender(client) if isinstance(client, ControlSink) else None


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
        raise ModelCallError.from_openai(err) from err
    if not isinstance(response, ChatCompletion) or not response.choices:
        raise ModelCallError(f"model call returned no completion: {response!r:.200}")
    return response
