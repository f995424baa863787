"""API-server side: hints from HTTP into the engine, and the control endpoint.

A pure ASGI middleware (``--middleware server_ext.AgentHintsMiddleware``):

- on inference routes it parses ``Agent-Hints`` (header), ``agent_hints`` (body)
  and interop fields with the ``hints_spec`` codec, and rewrites the JSON body so
  that vLLM's ``session_id`` is set and the normalized hints ride to the engine
  inside ``kv_transfer_params``. A malformed hint is counted and dropped; the
  request is served exactly as if it had none.
- on every JSON POST it strips the extension's reserved ``kv_transfer_params``
  keys, so a client can never forge a tenant or a control message.
- with ``salt_per_tenant``, every inference request's ``cache_salt`` starts
  with its tenant (a client's own salt is kept after it), hinted or not.
- it answers ``POST /v1/agent-hints/events`` itself and forwards valid events to
  the engine core with no inference request.
- with ``prefetch`` enabled, every other POST goes through a ``Prefetcher``,
  which watches branches leave and return and warms them before they are back.

Bodies without any hint-related bytes pass through untouched (no JSON round trip);
when such a body's request is hinted by headers, its new fields are spliced in
front of its members, still without decoding it. Such bytes are looked for in the
raw body, so a body that could spell them otherwise (a JSON ``\\u`` escape, or
not UTF-8) is parsed too.
"""

from __future__ import annotations

import json
from typing import Any, overload

from prometheus_client import Counter

from hints_spec import (
    BODY_FIELD,
    CONTROL_PATH,
    HEADER_NAME,
    SESSION_HEADER,
    ControlResponse,
    EventResult,
    HintError,
    Outcome,
    ToolStart,
    parse_control,
    resolve_hints,
)

from ._config import ExtensionConfig
from ._engine import RESERVED_KEYS, hint_params
from ._prefetch import ASGIApp, Branch, Prefetcher, Receive, Scope, Send, replay_body
from ._tenant import resolve_tenant
from ._vllm import connector_config, send_control
from .policy import ROOT, BranchKey, GapEstimator, PrefetchPlanner

__all__ = ["INFERENCE_PATHS", "AgentHintsMiddleware"]

INFERENCE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})
MAX_CONTROL_BYTES = 64 * 1024
_HEADER = HEADER_NAME.lower()
_INTEROP_HEADERS = (SESSION_HEADER.lower(), "x-dynamo-session-id")
# Any of these keys in a body means it may carry hints or reserved keys (each has
# a "_", which a token-id prompt never does); so does a JSON escape
# (``agent\u005fhints``) or a NUL byte (a UTF-16 or UTF-32 body, which vLLM
# decodes like UTF-8): they can spell a key without its bytes.
_KEYS = (
    BODY_FIELD.encode(),
    b"prompt_cache_key",
    b"prompt_cache_retention",
    b"session_id",
    b"cache_control",
)

PARSE_ERRORS = Counter(
    "agent_hints_parse_errors",
    "Malformed hints ignored; the request was served without them",
    labelnames=["source", "code"],
)
HINTED_REQUESTS = Counter("agent_hints_requests", "Inference requests that carried hints")
CONTROL_EVENTS = Counter(
    "agent_hints_control_events", "Control events by outcome", labelnames=["type", "outcome"]
)


class AgentHintsMiddleware:
    """ASGI middleware: see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._config: ExtensionConfig | None = None
        self._config_read = False
        self._prefetcher: Prefetcher | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        if scope["path"] == CONTROL_PATH:
            await self._control(scope, headers, receive, send)
            return
        body = await _read_body(receive)
        rewritten, branch = self._rewrite(scope, headers, body)
        if rewritten is not body:
            scope = dict(scope)
            scope["headers"] = [
                (k, v) for k, v in scope["headers"] if k.lower() != b"content-length"
            ] + [(b"content-length", str(len(rewritten)).encode())]
        replay = replay_body(rewritten, receive)
        if self._prefetcher is None:
            await self.app(scope, replay, send)
        else:
            await self._prefetcher.serve(scope, rewritten, branch, replay, send)

    def _extension(self, scope: Scope) -> ExtensionConfig | None:
        if not self._config_read:
            app = scope.get("app")
            self._config = connector_config(getattr(app, "state", None))
            self._config_read = True
            if self._config is not None and self._config.prefetch:
                estimator = GapEstimator(self._config.estimator_config())
                self._prefetcher = Prefetcher(self.app, PrefetchPlanner(estimator))
        return self._config

    # -- inference requests

    def _rewrite(
        self, scope: Scope, headers: dict[str, str], body: bytes
    ) -> tuple[bytes, Branch | None]:
        """The body to forward (``body`` itself unless hints or reserved keys
        changed it) and the branch of its lowered hints."""
        config = self._extension(scope)
        inference = scope["path"] in INFERENCE_PATHS
        salted = inference and config is not None and config.salt_per_tenant
        has_header = _HEADER in headers or any(h in headers for h in _INTEROP_HEADERS)
        marked = _may_carry_hints(body)
        if not (salted or has_header or marked):
            return body, None
        # A body with nothing to read or edit (hints only in headers, the SDK's
        # way) is not decoded: the new top-level fields are spliced in front of
        # its members. Re-encoding a 100k-token prompt took 4-27 ms here, on
        # the event loop every other request's stream shares.
        splice = (
            not marked
            and not _mentions(body, b"kv_transfer_params")
            and not (salted and _mentions(body, b"cache_salt"))
            and body.lstrip()[:1] == b"{"
        )
        try:
            payload = {} if splice else json.loads(body)
        except ValueError:
            return body, None  # vLLM answers malformed JSON itself
        if not isinstance(payload, dict):
            return body, None
        hints = None
        if inference:
            hints, errors = resolve_hints(headers, payload)
            for source, error in errors:
                PARSE_ERRORS.labels(source, error.code).inc()
        changed = payload.pop(BODY_FIELD, None) is not None
        transfer = payload.get("kv_transfer_params")
        if isinstance(transfer, dict):
            for key in RESERVED_KEYS:
                changed |= transfer.pop(key, None) is not None
        branch = None
        tenant = resolve_tenant(headers, config.tenant_header) if config is not None else None
        if salted and tenant is not None:
            client_salt = payload.get("cache_salt")
            if client_salt is None or isinstance(client_salt, str):  # else vLLM rejects it
                payload["cache_salt"] = f"{tenant}/{client_salt}" if client_salt else tenant
                changed = True
        if hints is not None and hints.sid is not None and tenant is not None:
            branch = Branch(BranchKey(tenant, hints.sid, hints.br or ROOT), hints.gap, hints.end)
            payload.setdefault("session_id", hints.sid)
            if not isinstance(transfer, dict):
                transfer = payload["kv_transfer_params"] = {}
            transfer.update(hint_params(tenant, hints))
            HINTED_REQUESTS.inc()
            changed = True
        if not changed:
            return body, branch
        return (_splice(body, payload) if splice else json.dumps(payload).encode()), branch

    # -- control endpoint

    async def _control(
        self, scope: Scope, headers: dict[str, str], receive: Receive, send: Send
    ) -> None:
        config = self._extension(scope)
        if config is None:
            await _json(
                send, 404, _error("not_enabled", "the agent-hints connector is not enabled")
            )
            return
        body = await _read_body(receive, limit=MAX_CONTROL_BYTES)
        if body is None:
            await _json(send, 413, _error("too_long", f"body over {MAX_CONTROL_BYTES} bytes"))
            return
        try:
            sid, events = parse_control(json.loads(body))
        except ValueError as e:  # HintError, and JSON errors
            code = e.code if isinstance(e, HintError) else "syntax"
            await _json(send, 400, _error(str(code), str(e)))
            return
        results: list[EventResult] = []
        accepted: list[dict[str, Any]] = []
        for index, event in enumerate(events):
            if isinstance(event, HintError):
                result = EventResult(index=index, outcome=Outcome.REJECTED, reason=event.code)
                kind = "invalid"
            else:
                kind = event.type
                accepted.append(event.model_dump(exclude_none=True))
                clipped = (
                    isinstance(event, ToolStart)
                    and event.eta is not None
                    and event.eta > config.ttl_cap_s
                )
                result = (
                    EventResult(index=index, outcome=Outcome.CLIPPED, reason="ttl_capped")
                    if clipped
                    else EventResult(index=index, outcome=Outcome.ACCEPTED)
                )
            CONTROL_EVENTS.labels(kind, result.outcome).inc()
            results.append(result)
        if accepted:
            tenant = resolve_tenant(headers, config.tenant_header)
            await send_control(scope["app"].state, tenant, sid, accepted)
            if self._prefetcher is not None:
                self._prefetcher.control(tenant, sid, events)
        await _json(send, 200, ControlResponse(results=results).model_dump(exclude_none=True))


def _may_carry_hints(body: bytes) -> bool:
    """Whether ``body`` has bytes that could spell a hint or a reserved key.

    Single bytes are looked for first (a fast ``memchr``): scanning a 100k-token
    prompt for each key takes milliseconds, one byte a few microseconds.
    """
    if b"\x00" in body or (b"\\" in body and b"\\u" in body):
        return True
    return b"_" in body and any(key in body for key in _KEYS)


def _mentions(body: bytes, key: bytes) -> bool:
    """Whether ``body`` has the bytes of ``key``, a name with a "_" in it."""
    return b"_" in body and key in body


def _splice(body: bytes, members: dict[str, Any]) -> bytes:
    """``body``, a JSON object with none of ``members``' keys, with ``members``
    added first; the rest of its bytes are kept as they are."""
    start = body.index(b"{") + 1
    rest = body[start:]
    comma = b"" if rest.lstrip()[:1] == b"}" else b","
    return body[:start] + json.dumps(members)[1:-1].encode() + comma + rest


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


@overload
async def _read_body(receive: Receive) -> bytes: ...
@overload
async def _read_body(receive: Receive, limit: int) -> bytes | None: ...
async def _read_body(receive: Receive, limit: int | None = None) -> bytes | None:
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


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


async def _json(send: Send, status: int, payload: dict[str, Any]) -> None:
    data = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})
