"""API-server prefetch: re-prefill an idle branch's last prompt just before it returns.

Retention cannot hold every idle branch when memory is short. The hints say when
each branch will be back, and the engine often has compute to spare during tool
gaps (idle, or only decoding), so the ``Prefetcher`` replays a branch's last
hinted request as a 1-token warm-up at (expected return - lead time): the
prompt's KV is then back in the prefix cache, and retained again by the engine,
when the real request arrives. Warm-ups are low priority: one at a time, and
only while no real request awaits its first response bytes, so they run beside
decodes, never beside a prefill (the engine, which sees every API server's
traffic, holds one back while any real request waits or prefills too, and a
running one sits out the steps of a real prefill). A warm-up is cancelled when
its branch returns or ends first.

No vLLM import: it drives the downstream ASGI app, so tests run it against a
fake app.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from hints_spec.core import ROOT_BRANCH, USER_TOOL, EndEvent, Event, ToolEndEvent, ToolStartEvent

from ._asgi import ASGIApp, Message, Receive, Scope, Send
from ._contract import PREFETCH_KEY, read_hint_params
from .policy import BranchKey, PrefetchPlanner

__all__ = ["Branch", "Prefetcher", "replay_body"]

logger = logging.getLogger(__name__)


PREFETCHES = Counter(
    "agent_hints_prefetch",
    "Prefetch warm-ups: issued, completed, failed; cancelled (the branch came back "
    "or ended first), skipped (past its return window, or its request was forgotten)",
    labelnames=["result"],
)

RETURN_ERROR = Gauge(
    "agent_hints_prefetch_return_error_seconds",
    "Mean |actual - predicted| return time of branches planned for prefetch",
)
EARLY_RETURNS = Gauge(
    "agent_hints_prefetch_early_return_ratio",
    "Fraction of planned branches that came back before their warm-up time",
)

_OUTPUT_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# Not replayed: a warm-up must not reuse the request id of the request it copies.
_DROPPED_HEADERS = (b"content-length", b"x-request-id")
_PROMPT_TOKENS = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')


@dataclass(frozen=True, slots=True)
class Branch:
    """What the prefetcher needs of a hinted request: its branch and timing hints."""

    key: BranchKey
    gap: float | None
    end: bool


@dataclass(frozen=True, slots=True)
class _LastRequest:
    scope: Scope
    body: bytes
    tokens: int


class Prefetcher:
    """Plans and issues warm-ups; the middleware routes every POST through ``serve``.

    Invariants: at most one warm-up runs at a time (``step`` awaits it), and a
    warm-up starts only when no real request awaits its first response bytes
    (a real request that arrives meanwhile is served concurrently, never
    queued behind it in the API server); a
    warm-up whose branch returns or ends is cancelled (its engine request
    aborted); remembered requests are bounded by count and bytes, and each
    tenant's by ``tenant_share`` of both (least recently used dropped first,
    a tenant over its share losing its own first: no tenant can flush
    another's branches out).

    Args:
        app: The downstream ASGI app (vLLM's routes).
        planner: When to warm which branch (default: a new one on ``clock``).
        clock: Monotonic seconds, shared with the planner.
        interval_s: Planner polling period.
        max_requests: Branches whose last request is remembered.
        max_bytes: Total body bytes remembered.
        timeout_s: A warm-up running longer is cancelled.
        tenant_share: Fraction of ``max_requests`` and ``max_bytes`` one
            tenant's remembered requests may take.
    """

    def __init__(
        self,
        app: ASGIApp,
        planner: PrefetchPlanner | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        interval_s: float = 0.1,
        max_requests: int = 1024,
        max_bytes: int = 64 << 20,
        timeout_s: float = 60.0,
        tenant_share: float = 0.25,
    ) -> None:
        self.app = app
        self.planner = planner or PrefetchPlanner(clock=clock)
        self._clock = clock
        self._interval = interval_s
        self._max_requests = max_requests
        self._max_bytes = max_bytes
        self._timeout = timeout_s
        self._tenant_requests = max(1, int(max_requests * tenant_share))
        self._tenant_bytes = max_bytes * tenant_share
        self._last: OrderedDict[BranchKey, _LastRequest] = OrderedDict()
        self._bytes = 0
        self._by_tenant: dict[str, list[int]] = {}  # tenant -> [requests, bytes]
        self._ready: dict[BranchKey, None] = {}
        self._prefilling = 0
        self._warming: tuple[BranchKey, asyncio.Task[None]] | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def prefilling(self) -> int:
        """Real requests being served that have sent no response body yet."""
        return self._prefilling

    # -- real traffic

    async def serve(
        self, scope: Scope, body: bytes, branch: Branch | None, receive: Receive, send: Send
    ) -> None:
        """Serve one real request through ``app``, watching its branch come and go."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        saved = dict(scope)  # routing mutates the scope in place
        if branch is not None:
            self.planner.returned(branch.key)
            stats = self.planner.stats
            RETURN_ERROR.set(stats.mean_abs_error_s)
            EARLY_RETURNS.set(stats.early_fraction)
            if branch.key in self._ready:
                del self._ready[branch.key]
                PREFETCHES.labels("cancelled").inc()
            self._cancel_warmup(lambda key: key == branch.key)
        status = 0
        tokens = len(body) // 4  # rough, until the response reports its usage
        prefilled = False

        def first_bytes() -> None:
            nonlocal prefilled
            if not prefilled:
                prefilled = True
                self._prefilling -= 1

        async def watch(message: Message) -> None:
            nonlocal status, tokens
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                first_bytes()
                if branch is not None:
                    tokens = _prompt_tokens(message.get("body", b""), tokens)
            await send(message)

        self._prefilling += 1
        try:
            await self.app(scope, receive, watch)
        finally:
            first_bytes()
        if branch is None or not 200 <= status < 300:
            return
        if branch.end:
            self._ended(branch.key)
            return
        self._remember(branch.key, _LastRequest(saved, body, tokens))
        self.planner.depart(branch.key, gap_hint=branch.gap, tokens=tokens)

    def control(self, tenant: str, sid: str, events: Iterable[Event]) -> None:
        """Apply accepted control events of ``tenant``'s session ``sid``."""
        for event in events:
            if isinstance(event, ToolStartEvent):
                # A wait on a human is not warmed: its length is a guess (often
                # the session is over), and a warm-up at the guess would evict
                # branches whose tools are due back. A tier brings it back.
                key = BranchKey(tenant, sid, event.br or ROOT_BRANCH)
                self.planner.tool_start(
                    key, eta=event.eta, tool=event.tool, warm=event.tool != USER_TOOL
                )
            elif isinstance(event, ToolEndEvent):
                self.planner.tool_end(BranchKey(tenant, sid, event.br or ROOT_BRANCH))
            elif isinstance(event, EndEvent):
                self._ended(BranchKey(tenant, sid, event.br or ROOT_BRANCH))

    async def aclose(self) -> None:
        """Stop the background task (tests; a server just exits)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- warm-ups

    async def step(self) -> None:
        """One planner poll: collect due branches, warm the most urgent unless a
        real request prefills."""
        now = self._clock()
        for key in self.planner.due(now):
            self._ready[key] = None
        ranked: list[tuple[float, BranchKey]] = []
        for key in self._ready:
            plan = self.planner.plan(key)
            if plan is None:  # ended (or forgotten) before its warm-up
                PREFETCHES.labels("cancelled").inc()
            elif not plan.fired:  # re-planned later: ``due`` hands it out again
                continue
            elif now > plan.deadline or key not in self._last:
                PREFETCHES.labels("skipped").inc()
            else:
                ranked.append((plan.expected_return, key))
        ranked.sort(key=lambda r: r[0])
        self._ready = {key: None for _, key in ranked}
        if ranked and self._prefilling == 0:
            key = ranked[0][1]
            del self._ready[key]
            await self._warm(key)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.step()
            except Exception:  # prefetch is advisory: log and keep polling
                logger.exception("agent-hints: prefetch step failed")

    async def _warm(self, key: BranchKey) -> None:
        last = self._last[key]
        body = _warmup_body(last.body, last.scope["path"])
        if body is None:
            PREFETCHES.labels("skipped").inc()
            return
        scope = dict(last.scope)
        scope["headers"] = [
            (k, v) for k, v in last.scope["headers"] if k.lower() not in _DROPPED_HEADERS
        ] + [(b"content-length", str(len(body)).encode())]
        status = 0
        tokens = last.tokens
        receive = replay_body(body, _no_client)

        async def discard(message: Message) -> None:
            nonlocal status, tokens
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                tokens = _prompt_tokens(message.get("body", b""), tokens)

        PREFETCHES.labels("issued").inc()
        start = self._clock()
        warmup = asyncio.ensure_future(self.app(scope, receive, discard))
        self._warming = (key, warmup)
        try:
            done, _ = await asyncio.wait([warmup], timeout=self._timeout)
        finally:
            self._warming = None
            warmup.cancel()  # past its timeout (or this step cancelled); else a no-op
        if not done:
            logger.warning("agent-hints: prefetch warm-up timed out")
            status = 0
        elif warmup.cancelled():  # its branch came back or ended first
            PREFETCHES.labels("cancelled").inc()
            return
        elif warmup.exception() is not None:
            logger.warning("agent-hints: prefetch warm-up failed", exc_info=warmup.exception())
            status = 0
        if 200 <= status < 300:
            PREFETCHES.labels("completed").inc()
            self.planner.observe_warmup(self._clock() - start, tokens)
        else:
            PREFETCHES.labels("failed").inc()

    # -- remembered requests

    def _remember(self, key: BranchKey, last: _LastRequest) -> None:
        self._forget(key)
        self._last[key] = last
        self._bytes += len(last.body)
        use = self._by_tenant.setdefault(key.tenant, [0, 0])
        use[0] += 1
        use[1] += len(last.body)
        while use[0] > self._tenant_requests or use[1] > self._tenant_bytes:
            self._forget(next(k for k in self._last if k.tenant == key.tenant))
        while self._last and (
            len(self._last) > self._max_requests or self._bytes > self._max_bytes
        ):
            self._forget(next(iter(self._last)))

    def _forget(self, key: BranchKey) -> None:
        last = self._last.pop(key, None)
        if last is not None:
            self._bytes -= len(last.body)
            use = self._by_tenant[key.tenant]
            use[0] -= 1
            use[1] -= len(last.body)
            if use[0] == 0:
                del self._by_tenant[key.tenant]

    def _cancel_warmup(self, obsolete: Callable[[BranchKey], bool]) -> None:
        """Cancel the running warm-up if its branch is ``obsolete``."""
        if self._warming is not None and obsolete(self._warming[0]):
            self._warming[1].cancel()

    def _ended(self, key: BranchKey) -> None:
        """``key`` ended (its whole session on the root branch)."""
        self.planner.ended(key)
        session = key.br == ROOT_BRANCH
        self._cancel_warmup(lambda k: k == key or (session and k.sibling(ROOT_BRANCH) == key))
        if key.br != ROOT_BRANCH:
            self._forget(key)
            return
        for k in [k for k in self._last if (k.tenant, k.sid) == (key.tenant, key.sid)]:
            self._forget(k)


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields ``body`` once, then defers to ``receive``."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _no_client() -> Message:
    """A warm-up has no client to disconnect: wait to be cancelled."""
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


def _prompt_tokens(chunk: bytes, default: int) -> int:
    """The prompt size a response reports in its usage, else ``default``."""
    match = _PROMPT_TOKENS.search(chunk)
    return int(match.group(1)) if match else default


def _warmup_body(body: bytes, path: str) -> bytes | None:
    """``body`` as a non-streamed 1-token request marked as a prefetch; None if
    it carries no lowered hints (nothing to mark)."""
    try:
        payload = json.loads(body)
        transfer = payload["kv_transfer_params"]
    except (ValueError, KeyError, TypeError):
        return None
    if read_hint_params(transfer) is None:
        return None
    transfer[PREFETCH_KEY] = True
    limits = [f for f in _OUTPUT_LIMITS if f in payload] or [
        "max_output_tokens" if path == "/v1/responses" else "max_tokens"
    ]
    for field in limits:
        payload[field] = 1
    payload["stream"] = False
    for field in ("stream_options", "min_tokens", "background", "request_id"):
        payload.pop(field, None)
    if "n" in payload:
        payload["n"] = 1
    if path == "/v1/responses":
        payload["store"] = False  # a warm-up leaves no stored response behind
    return json.dumps(payload).encode()
