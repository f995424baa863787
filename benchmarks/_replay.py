"""The replay client: every trace is a session, all sessions run concurrently.

A session sends its root requests in order, waiting each request's scaled think
time after the previous response; at a fork its sub-agents run as branches
(``br=agent_id``, ``pbr="root"``) with their own request sequences, and the root
resumes after the last of them. With hints on, every request carries an
``Agent-Hints`` header whose ``gap`` is built only from think times this session
already observed, never from the trace's future, and each branch's last request
says ``end``. A response that ends the agent's turn (the trace's ``stop`` is
``end_turn``) is followed, as an SDK at the end of a run would, by a
``tool_start`` event for the tool ``user`` whose ``eta`` is the session's median
wait on its user so far: the header's ``gap`` is for responses that end in tool
calls, and a human reply takes one to two orders of magnitude longer.
``ReplaySettings.control`` picks the client's style: header hints only, those
user waits (the default), or the SDK's own events around every tool call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import httpx2

from hints_spec import (
    CONTROL_PATH,
    HEADER_NAME,
    USER_TOOL,
    AgentHints,
    ToolEnd,
    ToolStart,
    serialize_header,
)

from ._traces import ROOT, Fork, PrefixIndex, TokenMapper, Trace, TraceRequest

__all__ = [
    "TRACE_TOOL",
    "ControlStyle",
    "PastGaps",
    "ReplaySettings",
    "RequestRecord",
    "hint_header",
    "replay",
]

ControlStyle = Literal["none", "turns", "tools"]
"""How a hinted replay client uses the control endpoint: ``none`` (header hints
only), ``turns`` (a ``tool_start`` for the user when a turn ends), ``tools``
(that, and ``tool_start`` / ``tool_end`` around every tool wait, as the SDK's
agent loop posts them)."""

TRACE_TOOL = "tool"
"""The tool the ``tools`` style names: the anonymized traces carry no tool names."""

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    """How traces become requests.

    Args:
        base_url: The server, e.g. ``http://127.0.0.1:8000``.
        k: Token ids per trace hash id (64 tokens): ``k=4`` is 1/16 scale.
        time_scale: Think times are divided by this.
        max_think_s: Cap on one scaled wait, s.
        max_out: Cap on ``max_tokens``, so decoding does not dominate.
        hints: Send ``Agent-Hints`` (the extension configuration only).
        block_size: Server KV block size, for the theoretical reuse.
        concurrency: Sessions in flight at once (None: all).
        tenant_per_trace: Each session sends its own API key (``Bearer <trace
            id>``), as independent users would; the extension then budgets each
            as a tenant. Plain vLLM without ``--api-key`` ignores it.
        oracle_gaps: A diagnostic, never a result: every hint carries the
            trace's true next wait (the future) instead of an estimate from
            the past, so a run shows what the server makes of perfect
            predictions.
        control: The hinted client's use of the control endpoint.
        unhinted: Traces whose sessions send no hints even when ``hints`` is
            on (mixed traffic).
    """

    base_url: str
    model: str = "tiny"
    k: int = 4
    time_scale: float = 20.0
    max_think_s: float = 30.0
    max_out: int = 32
    hints: bool = False
    block_size: int = 64
    vocab_size: int = 2048
    concurrency: int | None = None
    tenant_per_trace: bool = False
    oracle_gaps: bool = False
    control: ControlStyle = "turns"
    unhinted: frozenset[str] = field(default_factory=frozenset)
    request_timeout_s: float = 900.0

    def wait_s(self, think_time: float) -> float:
        return min(max(think_time, 0.0) / self.time_scale, self.max_think_s)

    def max_tokens(self, out: int) -> int:
        """The trace's output length at ``k/64`` scale, in ``[1, max_out]``."""
        return max(1, min(out * self.k // 64, self.max_out))

    @property
    def prior_gap_s(self) -> float:
        """Gap assumed before a session has shown any: a typical 10 s think."""
        return self.wait_s(10.0)

    @property
    def prior_user_wait_s(self) -> float:
        """Wait on the user assumed before a session has shown any: a minute."""
        return self.wait_s(60.0)


@dataclass(slots=True)
class RequestRecord:
    """One replayed request; ``sent_at`` is s from the start of the run.

    The agent replay (``benchmarks.agent_replay``) also says what the wait after
    the response is on (``wait_kind``: the tool kind, None when the turn ends),
    when the client expected the branch back (``eta_s``: the largest ``eta`` of
    the response's ``tool_start`` events, or the ``user`` one's), the server's
    own prediction, when the response carries one (``server_gap_s``), and the
    wait the recording had there, scaled as replayed (``recorded_wait_s``: the
    replayed wait also holds the loop's own time, which a compressed replay
    makes comparable to its shortest waits).
    """

    trace_id: str
    branch: str
    seq: int
    sent_at: float
    prompt_tokens: int
    max_tokens: int
    theoretical_cached: int
    hint: str | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    error: str | None = None
    ends_turn: bool = False
    wait_kind: str | None = None
    eta_s: float | None = None
    server_gap_s: float | None = None
    recorded_wait_s: float | None = None


OnDone = Callable[[RequestRecord], None]


class PastGaps:
    """A session's observed gaps (response -> next request of the same
    branch); the hint is their median, ``prior_s`` before the first."""

    def __init__(self, prior_s: float) -> None:
        self._prior = prior_s
        self._seen: list[float] = []

    def observe(self, gap_s: float) -> None:
        self._seen.append(max(gap_s, 0.0))

    def estimate(self) -> float:
        return statistics.median(self._seen) if self._seen else self._prior


def hint_header(sid: str, br: str, pbr: str | None, gap_s: float, end: bool) -> str:
    return serialize_header(AgentHints(sid=sid, br=br, pbr=pbr, gap=round(gap_s, 3), end=end))


class _Session:
    def __init__(
        self,
        trace: Trace,
        settings: ReplaySettings,
        client: httpx2.AsyncClient,
        index: PrefixIndex,
        records: list[RequestRecord],
        clock: Clock,
        sleep: Sleep,
        start: float,
        on_done: OnDone | None,
    ) -> None:
        self.trace = trace
        self.settings = settings
        self.client = client
        self.index = index
        self.records = records
        self.clock = clock
        self.sleep = sleep
        self.start = start
        self.on_done = on_done
        self.mapper = TokenMapper(trace.trace_id, settings.k, settings.vocab_size)
        self.gaps = PastGaps(settings.prior_gap_s)
        self.user_waits = PastGaps(settings.prior_user_wait_s)
        self.hinted = settings.hints and trace.trace_id not in settings.unhinted
        self.control = settings.control if self.hinted else "none"

    async def run(self) -> None:
        await self._branch(ROOT, None, self.trace.steps)

    async def _branch(self, br: str, pbr: str | None, steps: Sequence[TraceRequest | Fork]) -> None:
        last = max(i for i, s in enumerate(steps) if isinstance(s, TraceRequest))
        waits_after = self._waits_after(steps) if self.settings.oracle_gaps else None
        returned: float | None = None
        waited_on: PastGaps = self.gaps
        forked_s = 0.0
        seq = 0
        for i, step in enumerate(steps):
            if isinstance(step, Fork):
                await asyncio.gather(
                    *(self._branch(a.agent_id, br, a.requests) for a in step.agents)
                )
                forked_s += step.duration_s
                continue
            # After a fork the trace's think time includes the sub-agents' run,
            # which the replay just spent for real: wait only the rest.
            await self.sleep(self.settings.wait_s(step.think_time - forked_s))
            forked_s = 0.0
            if returned is not None:
                waited_on.observe(self.clock() - returned)
                if waited_on is self.gaps and self.control == "tools":
                    await self._post_event(ToolEnd(br=br))
            oracle = waits_after[i] if waits_after is not None else None
            gap = self.gaps.estimate() if oracle is None else oracle
            # A sub-agent's end is known (the SDK ends its branch when it is
            # done); the session's is not: its last turn waits on the user too.
            end = i == last and br != ROOT
            await self._send(br, pbr, seq, step, gap, end=end)
            returned = self.clock()
            waited_on = self.gaps
            if step.ends_turn and not end:
                waited_on = self.user_waits
                if self.control != "none":
                    eta = self.user_waits.estimate() if oracle is None else oracle
                    await self._post_event(ToolStart(br=br, tool=USER_TOOL, eta=round(eta, 3)))
            elif not end and self.control == "tools":
                await self._post_event(ToolStart(br=br, tool=TRACE_TOOL, eta=round(gap, 3)))
            seq += 1

    def _waits_after(self, steps: Sequence[TraceRequest | Fork]) -> list[float | None]:
        """The wait after each step, for oracle hints: the next request's think
        time (after a fork it includes the sub-agents' run); None after the last."""
        waits: list[float | None] = [None] * len(steps)
        for i in range(len(steps) - 2, -1, -1):
            after = steps[i + 1]
            waits[i] = (
                self.settings.wait_s(after.think_time)
                if isinstance(after, TraceRequest)
                else waits[i + 1]
            )
        return waits

    async def _post_event(self, event: ToolStart | ToolEnd) -> None:
        """Send one control event of this session (best effort)."""
        body = {"sid": self.trace.trace_id, "events": [event.model_dump(exclude_none=True)]}
        with contextlib.suppress(httpx2.HTTPError):  # a lost hint costs only its benefit
            await self.client.post(
                f"{self.settings.base_url}{CONTROL_PATH}", json=body, headers=self._auth()
            )

    def _auth(self) -> dict[str, str]:
        if self.settings.tenant_per_trace:
            return {"Authorization": f"Bearer {self.trace.trace_id}"}
        return {}

    async def _send(
        self, br: str, pbr: str | None, seq: int, request: TraceRequest, gap_s: float, end: bool
    ) -> None:
        s = self.settings
        prompt = self.mapper.prompt(request.hash_ids)
        record = RequestRecord(
            trace_id=self.trace.trace_id,
            branch=br,
            seq=seq,
            sent_at=round(self.clock() - self.start, 3),
            prompt_tokens=len(prompt),
            max_tokens=s.max_tokens(request.out),
            theoretical_cached=self.index.add(prompt),
            ends_turn=request.ends_turn,
        )
        headers = self._auth()
        if self.hinted:
            record.hint = hint_header(self.trace.trace_id, br, pbr, gap_s, end)
            headers[HEADER_NAME] = record.hint
        self.records.append(record)
        body = {
            "model": s.model,
            "prompt": prompt,
            "max_tokens": record.max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        await self._post(record, body, headers)
        if self.on_done is not None:
            self.on_done(record)

    async def _post(
        self, record: RequestRecord, body: dict[str, object], headers: dict[str, str]
    ) -> None:
        """Send one request and fill ``record`` in: usage and timings, or the error."""
        s = self.settings
        sent = self.clock()
        try:
            async with self.client.stream(
                "POST", f"{s.base_url}/v1/completions", json=body, headers=headers
            ) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    record.error = f"HTTP {response.status_code}: {text[:300]}"
                    return
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    _read_chunk(record, json.loads(data), self.clock() - sent)
            record.latency_s = round(self.clock() - sent, 4)
            if record.cached_tokens is None:
                record.error = "no usage in the stream"
        except httpx2.HTTPError as e:
            record.error = f"{type(e).__name__}: {e}"


def _read_chunk(record: RequestRecord, chunk: dict[str, object], elapsed: float) -> None:
    if record.ttft_s is None and chunk.get("choices"):
        record.ttft_s = round(elapsed, 4)
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details") or {}
        record.cached_tokens = int(details.get("cached_tokens") or 0)
        record.completion_tokens = int(usage.get("completion_tokens") or 0)


async def replay(
    traces: Sequence[Trace],
    settings: ReplaySettings,
    client: httpx2.AsyncClient,
    *,
    clock: Clock = time.monotonic,
    sleep: Sleep = asyncio.sleep,
    on_done: OnDone | None = None,
) -> list[RequestRecord]:
    """Replay ``traces`` concurrently; the records come in issue order.

    ``on_done`` sees each record once it is final (answered or failed), e.g. to
    show progress during a run that takes many minutes.
    """
    records: list[RequestRecord] = []
    index = PrefixIndex(settings.block_size)
    start = clock()
    limit = asyncio.Semaphore(settings.concurrency or max(len(traces), 1))

    async def session(trace: Trace) -> None:
        async with limit:
            await _Session(
                trace, settings, client, index, records, clock, sleep, start, on_done
            ).run()

    await asyncio.gather(*(session(t) for t in traces))
    return records
