"""Drop-in ``OpenAI`` / ``AsyncOpenAI`` subclasses that attach the ambient ``hint_scope``.

Subclassing (not wrapping) keeps the typed resource tree and ``isinstance``, so the clients drop
into the OpenAI Agents SDK, pydantic-ai or plain code unchanged. The single hook is
``_prepare_options``, which openai runs on a fresh shallow copy of the options for every retry
attempt; the hook replaces (never mutates) the headers and body mappings it touches, so a retried
request is identical to the first. ``copy`` / ``with_options`` rebuild via ``self.__class__`` with
the shared http client, so they stay hinted and keep the connection pool.

Inside a scope each request also carries the W3C ``traceparent`` of the current span
(vLLM started with ``--otlp-traces-endpoint`` parents its request span on it). A model
request outside any scope warns once per client (``NoSessionWarning``): the server then
learns nothing, which is almost always a missing ``hint_scope`` or adapter.
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio
from openai import AsyncOpenAI, OpenAI
from openai._models import FinalRequestOptions
from opentelemetry import propagate
from typing_extensions import override

from hints_spec import HEADER_NAME, SESSION_HEADER, AgentHints, serialize_header

from ._errors import NoSessionWarning, warn_user
from ._scope import active_scope, note_sent, take_pending

__all__ = [
    "CONTROL_TIMEOUT",
    "HintedAsyncOpenAI",
    "HintedOpenAI",
    "has_header",
    "hint_headers",
    "sync_twin",
]

_CACHE_KEY = "prompt_cache_key"
# Bound on the wait for events that must precede a request (``deliver_before_next_request``):
# a lost fork costs less than a stalled request.
CONTROL_TIMEOUT = 2.0
# Endpoints whose request body has a typed ``prompt_cache_key`` (chat completions, responses);
# legacy completions has none and is only given the header.
_CACHE_KEY_PATHS = ("/chat/completions", "/responses")
_MODEL_PATHS = (*_CACHE_KEY_PATHS, "/completions")
_NO_SESSION = (
    "{client} sent a model request outside any session, so the server cannot keep its"
    " cache for the next turn: run it inside hint_scope(session=...), through"
    " agentsdk.Runner, or through the framework's adapter in agentsdk.integrations."
    " In a thread, the scope of the code that started it does not apply: start it with"
    " agentsdk.ContextThreadPoolExecutor, asyncio.to_thread or contextvars.copy_context().run"
    " (this warning is shown once per client)"
)


def has_header(mapping: Mapping[str, object], name: str) -> bool:
    """Whether ``mapping`` sets header ``name`` (names are case-insensitive)."""
    lower = name.lower()
    return any(key.lower() == lower for key in mapping)


def hint_headers(hints: AgentHints) -> dict[str, str]:
    """The headers a hinted client would add for ``hints``: for a framework that lets a run
    set request headers but was given a plain client."""
    headers = {HEADER_NAME: serialize_header(hints)}
    if hints.sid is not None:
        headers[SESSION_HEADER] = hints.sid
    return headers


def sync_twin(client: AsyncOpenAI) -> OpenAI:
    """A sync client with ``client``'s settings (hinted if it is): for code that has to
    reach the same server without an event loop (LangChain's sync calls, control events
    submitted from threads). It has a connection pool of its own."""
    kind = HintedOpenAI if isinstance(client, HintedAsyncOpenAI) else OpenAI
    return kind(
        api_key=client.api_key,
        organization=client.organization,
        project=client.project,
        base_url=client.base_url,
        timeout=client.timeout,
        max_retries=client.max_retries,
        default_headers=client._custom_headers,
        default_query=client._custom_query,
    )


def _with_hints(
    options: FinalRequestOptions, client: HintedOpenAI | HintedAsyncOpenAI
) -> FinalRequestOptions:
    """Add the scope's headers and session cache key to one attempt's options.

    ``Agent-Hints`` carries the hints; ``X-Session-ID`` repeats the session for routers
    with session affinity, so every turn and sub-agent of a session reaches the instance
    that holds its KV. Anything the caller set explicitly wins: either header in
    ``default_headers`` or ``extra_headers`` (``Omit()`` included), and ``prompt_cache_key``
    in the call or ``extra_body``.
    """
    scope = active_scope()
    if options.url.startswith(("ws://", "wss://")):
        return options
    if scope is None or scope.hints.sid is None:
        _warn_once(options, client)
    if scope is None:
        return options
    note_sent()
    client_headers = client._custom_headers
    headers = options.headers if isinstance(options.headers, Mapping) else {}
    sid = scope.hints.sid
    wanted = {HEADER_NAME: scope.header} | ({SESSION_HEADER: sid} if sid is not None else {})
    propagate.inject(wanted)  # traceparent (and tracestate) of the current span, if any
    added = {
        name: value
        for name, value in wanted.items()
        if not (has_header(headers, name) or has_header(client_headers, name))
    }
    if added:
        options.headers = {**headers, **added}
    body = options.json_data
    if (
        sid is not None
        and isinstance(body, Mapping)
        and _CACHE_KEY not in body
        and not (options.extra_json is not None and _CACHE_KEY in options.extra_json)
        and options.method.lower() == "post"
        and options.url.partition("?")[0].endswith(_CACHE_KEY_PATHS)
    ):
        options.json_data = {**body, _CACHE_KEY: sid}
    return options


def _warn_once(options: FinalRequestOptions, client: HintedOpenAI | HintedAsyncOpenAI) -> None:
    if client._warned_no_session or options.method.lower() != "post":
        return
    if options.url.partition("?")[0].endswith(_MODEL_PATHS):
        client._warned_no_session = True
        warn_user(_NO_SESSION.format(client=type(client).__name__), NoSessionWarning)


class HintedOpenAI(OpenAI):
    """``openai.OpenAI`` that sends the ambient ``hint_scope`` with every request.

    Outside any scope it sends exactly what ``openai.OpenAI`` sends.
    """

    _warned_no_session = False

    @property
    @override
    def user_agent(self) -> str:
        # The base class derives it from the class name; keep the plain client's value.
        return f"{OpenAI.__name__}/Python {self._version}"

    @override
    def _prepare_options(self, options: FinalRequestOptions) -> FinalRequestOptions:
        pending = take_pending()
        if pending is not None:
            pending.flush_sync(timeout=CONTROL_TIMEOUT)
        return super()._prepare_options(_with_hints(options, self))


class HintedAsyncOpenAI(AsyncOpenAI):
    """``openai.AsyncOpenAI`` that sends the ambient ``hint_scope`` with every request.

    Outside any scope it sends exactly what ``openai.AsyncOpenAI`` sends.
    """

    _warned_no_session = False

    @property
    @override
    def user_agent(self) -> str:
        return f"{AsyncOpenAI.__name__}/Python {self._version}"

    @override
    async def _prepare_options(self, options: FinalRequestOptions) -> FinalRequestOptions:
        pending = take_pending()
        if pending is not None:
            with anyio.move_on_after(CONTROL_TIMEOUT):
                await pending.flush()
        return await super()._prepare_options(_with_hints(options, self))
