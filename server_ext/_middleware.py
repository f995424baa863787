"""API-server side: hints from HTTP into the engine, and the control endpoint.

A pure ASGI middleware (``--middleware server_ext.AgentHintsMiddleware``):

- vLLM adds ``--middleware`` classes outside its own API-key check, so this one
  applies that check first (``ApiKeys``, vLLM's keys and code): a request that
  vLLM will answer 401 is handed on before a byte of its body is read.
- the tenant is resolved once per request (``Tenancy``): a gateway's
  ``tenant_header`` from an untrusted source is refused (403).
- every JSON POST's body is rewritten (``_rewrite``): on inference routes the
  hints ride to the engine inside ``kv_transfer_params``, the extension's
  reserved keys are stripped everywhere, and with ``salt_per_tenant`` (the
  default) every request's ``cache_salt`` starts with its tenant, on every
  route, hinted or not.
- it answers ``POST /v1/agent-hints/events`` itself (rate-limited per tenant,
  outcomes in the SPEC's untrusted mode) and forwards valid events to the
  engine core with no inference request.
- on a hinted chat completion it reads the tool calls of the response as it
  passes (``ToolCallNames``) and names them to the engine as the branch's wait
  (none: the user), so the server learns gaps per tool for clients that name
  no tool themselves.
- with ``prefetch`` enabled, every other POST goes through a ``Prefetcher``,
  which watches branches leave and return and warms them before they are back.

Routes are matched below vLLM's ``--root-path``, as vLLM's own routing does.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from hints_spec import (
    CONTROL_PATH,
    ControlResponse,
    EventResult,
    HintError,
    Outcome,
    parse_control,
    to_event,
)
from hints_spec.core import Event, ToolStartEvent

from ._asgi import (
    ASGIApp,
    Message,
    RateLimit,
    Receive,
    Scope,
    Send,
    error_body,
    peer,
    read_body,
    route,
    send_json,
    without_header,
)
from ._config import ExtensionConfig
from ._prefetch import Prefetcher, replay_body
from ._rewrite import CHAT_PATH, Refused, rewrite
from ._routing import RANK_HEADER, SessionRanks
from ._tenant import DEFAULT_TENANT, Tenancy, TenantRefused
from ._tools import ToolCallNames
from ._vllm import ApiKeys, connector_config, send_control
from .policy import BranchKey, GapEstimator, PrefetchPlanner

__all__ = ["AgentHintsMiddleware"]

logger = logging.getLogger(__name__)

MAX_CONTROL_BYTES = 64 * 1024
CONTROL_EVENTS = Counter(
    "agent_hints_control_events", "Control events by outcome", labelnames=["type", "outcome"]
)
LEARNED_WAITS = Counter(
    "agent_hints_learned_waits",
    "Hinted chat completions whose tool calls (none: the user) the server named to the "
    "engine as the wait of their branch",
)
REFUSED = Counter(
    "agent_hints_refused_requests",
    "Requests the middleware refused: untrusted tenant header (untrusted_tenant), "
    "control rate limit (rate_limited), JSON nested too deeply (too_deep)",
    labelnames=["reason"],
)


@dataclass(frozen=True, slots=True)
class _Setup:
    """What the middleware reads once from vLLM's app state."""

    config: ExtensionConfig | None
    keys: ApiKeys
    tenancy: Tenancy | None
    limit: RateLimit | None
    prefetcher: Prefetcher | None
    ranks: SessionRanks | None
    """Data-parallel ranks by session (``_routing``), when vLLM balances them."""


class AgentHintsMiddleware:
    """ASGI middleware: see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._setup: _Setup | None = None

    @property
    def prefetcher(self) -> Prefetcher | None:
        """The prefetcher, once the first request (or start-up) read the settings."""
        return self._setup.prefetcher if self._setup is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            self._ready(scope)  # at start-up: bad settings stop it, warnings are logged
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        setup = self._ready(scope)
        verified = setup.keys.verifies(scope)
        if setup.keys.configured and not verified and setup.keys.guards(scope):
            # vLLM's AuthenticationMiddleware, further in, answers 401.
            await self.app(scope, receive, send)
            return
        tenant: str | None = None
        if setup.tenancy is not None:
            try:
                tenant = setup.tenancy.resolve(
                    scope["headers"], peer(scope), verified or not setup.keys.configured
                )
            except TenantRefused as e:
                REFUSED.labels("untrusted_tenant").inc()
                await send_json(send, 403, error_body("untrusted_tenant", str(e)))
                return
            if setup.tenancy.secret_header is not None:
                scope = without_header(scope, setup.tenancy.secret_header)
        if route(scope) == CONTROL_PATH:
            await self._control(setup, tenant or DEFAULT_TENANT, scope, receive, send)
            return
        body = await read_body(receive)
        try:
            rewritten, branch = rewrite(setup.config, tenant, scope, body)
        except Refused as e:
            REFUSED.labels(e.code).inc()
            await send_json(send, e.status, error_body(e.code, str(e)))
            return
        if rewritten is not body:
            scope = dict(scope)
            scope["headers"] = [
                (k, v) for k, v in scope["headers"] if k.lower() != b"content-length"
            ] + [(b"content-length", str(len(rewritten)).encode())]
        if branch is not None and setup.ranks is not None:
            scope = _on_rank(scope, setup.ranks.rank(branch.key.tenant, branch.key.sid))
        replay = replay_body(rewritten, receive)
        if branch is not None and not branch.end and route(scope) == CHAT_PATH:
            send = _naming_waits(send, scope["app"].state, branch.key, setup.ranks)
        if setup.prefetcher is None:
            await self.app(scope, replay, send)
        else:
            await setup.prefetcher.serve(scope, rewritten, branch, replay, send)

    def _ready(self, scope: Scope) -> _Setup:
        if self._setup is None:
            state = getattr(scope.get("app"), "state", None)
            config = connector_config(state)
            keys = ApiKeys(state)
            prefetcher = None
            if config is not None and config.prefetch:
                estimator = GapEstimator(config.estimator_config())
                prefetcher = Prefetcher(self.app, PrefetchPlanner(estimator))
            self._setup = _Setup(
                config,
                keys,
                Tenancy(config) if config is not None else None,
                RateLimit(config.control_rate) if config and config.control_rate > 0 else None,
                prefetcher,
                SessionRanks.of(state) if config is not None else None,
            )
            if config is not None:
                _warn_about(config, keys)
        return self._setup

    # -- control endpoint

    async def _control(
        self, setup: _Setup, tenant: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        if setup.config is None:
            await send_json(
                send, 404, error_body("not_enabled", "the agent-hints connector is not enabled")
            )
            return
        if setup.limit is not None and (wait := setup.limit.take(tenant)) > 0:
            REFUSED.labels("rate_limited").inc()
            await send_json(
                send,
                429,
                error_body("rate_limited", "too many control requests; retry later"),
                [(b"retry-after", str(math.ceil(wait)).encode())],
            )
            return
        body = await read_body(receive, limit=MAX_CONTROL_BYTES)
        if body is None:
            await send_json(
                send, 413, error_body("too_long", f"body over {MAX_CONTROL_BYTES} bytes")
            )
            return
        try:
            sid, events = parse_control(json.loads(body))
        except (ValueError, RecursionError) as e:  # HintError, and JSON errors
            code = e.code if isinstance(e, HintError) else "syntax"
            message = str(e) if isinstance(e, ValueError) else "JSON nested too deeply"
            await send_json(send, 400, error_body(str(code), message))
            return
        # SPEC 6.4, untrusted mode: "accepted" for every valid event, "rejected"
        # with its validation code otherwise; nothing depends on engine state
        # or on the server's caps.
        results: list[EventResult] = []
        accepted: list[Event] = []
        for index, event in enumerate(events):
            if isinstance(event, HintError):
                result = EventResult(index=index, outcome=Outcome.REJECTED, reason=event.code)
                kind = "invalid"
            else:
                kind = event.type
                accepted.append(to_event(event))
                result = EventResult(index=index, outcome=Outcome.ACCEPTED)
            CONTROL_EVENTS.labels(kind, result.outcome).inc()
            results.append(result)
        if accepted:
            rank = setup.ranks.rank(tenant, sid) if setup.ranks is not None else None
            await send_control(scope["app"].state, tenant, sid, accepted, rank=rank)
            if setup.prefetcher is not None:
                setup.prefetcher.control(tenant, sid, accepted)
        await send_json(send, 200, ControlResponse(results=results).model_dump(exclude_none=True))


def _on_rank(scope: Scope, rank: int) -> Scope:
    """``scope`` sent to data-parallel ``rank`` (``_routing``), unless the
    client named one itself (vLLM's header: an operator's explicit choice)."""
    if any(k.lower() == RANK_HEADER for k, _ in scope["headers"]):
        return scope
    return {**scope, "headers": [*scope["headers"], (RANK_HEADER, str(rank).encode())]}


def _warn_about(config: ExtensionConfig, keys: ApiKeys) -> None:
    """Log, once at start-up, the settings under which tenants are not isolated."""
    if not keys.configured and config.tenant_header is None:
        logger.warning(
            "agent-hints: no --api-key and no tenant_header: a client's tenant is "
            "whatever Authorization it sends, unchecked, and every client without "
            "one shares the tenant %r; per-tenant budgets and session scoping then "
            "hold only among honest clients (docs/security.md)",
            DEFAULT_TENANT,
        )
    if not config.salt_per_tenant:
        logger.warning(
            "agent-hints: salt_per_tenant is off: tenants share prefix-cache "
            "entries, and each can time guesses of another's prompts (SPEC 8.2)"
        )


def _naming_waits(send: Send, state: Any, key: BranchKey, ranks: SessionRanks | None) -> Send:
    """``send`` that reads the response's tool calls as they pass
    (``ToolCallNames``) and, after its last byte, names the branch's wait to
    the engine; a failure there costs the response nothing."""
    names = ToolCallNames()

    async def watched(message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            names.start(message["status"], list(message.get("headers", ())))
        elif kind == "http.response.body":
            names.feed(message.get("body", b""))
        await send(message)
        if kind != "http.response.body" or message.get("more_body", False):
            return
        wait = names.wait()
        if wait is None:
            return
        event = ToolStartEvent(tool=wait, br=key.br)
        try:
            rank = ranks.rank(key.tenant, key.sid) if ranks is not None else None
            await send_control(state, key.tenant, key.sid, [event], learned=True, rank=rank)
        except Exception:
            logger.debug("agent-hints: could not name a branch's wait", exc_info=True)
            return
        LEARNED_WAITS.inc()

    return watched
