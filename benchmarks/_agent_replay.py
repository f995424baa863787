"""The agent replay: each recorded Claude Code session runs as the SDK's own agent loop.

A session becomes an ``agentsdk.Agent`` whose tools are the session's tool kinds
(``Bash-test``, ``Read``, ...), each a real ``@tool`` that sleeps for the
recorded call's scaled duration and returns a result of the recorded size; a
``Task`` call whose sub-agent is in the file runs it with ``Runner.fan_out`` on
a child branch. ``Runner.run`` drives each user turn (an ``InMemorySession``
carries the conversation and the session's tool latencies from turn to turn;
the sessions of one replay pool theirs, ``RunConfig.shared_latency``), so
everything a production agent sends comes from the SDK itself: ``gap`` on every
request from its latency estimator, ``tool_start`` (with the tool's name and
ETA) and ``tool_end`` around every call, ``fork`` and ``end`` for sub-agents,
the wait on the user between turns and the session's ``end``.

The model is ``ReplayModel``, an ``agentsdk.ModelClient``: each chat completion
the loop asks for is the recorded call's prompt, as token ids, on
``/v1/completions`` (through an ``openai.AsyncOpenAI``: the hinted client for the
extension's configurations, the plain one otherwise), with the recorded output
length forced (``max_tokens``, ``ignore_eos``); it answers the loop with the
recorded tool calls. Chat messages would not do: the server renders and
tokenizes them itself, so a transcript that has sizes but no text could not
reproduce the prompt sizes, and the test model's random output could not be the
next prompt's prefix; token ids make every prompt and every shared prefix exact,
and the theoretical reuse computable.

A request that fails is recorded as failed and the session goes on as recorded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import openai
from openai.types import Completion
from openai.types.chat import ChatCompletion

from agentsdk import (
    Agent,
    ControlChannel,
    HintedAsyncOpenAI,
    InMemorySession,
    LatencyEstimator,
    LatencyStats,
    RunConfig,
    RunContext,
    Runner,
    Tool,
    current_hints,
    tool,
)
from hints_spec import USER_TOOL, ControlEvent, ToolStart, serialize_header

from ._claude_code import TASK, Branch, ModelCall, PromptMapper, Session, ToolUse
from ._replay import ReplaySettings, RequestRecord
from ._run import OnDone
from ._traces import ROOT, PrefixIndex

__all__ = [
    "AgentRun",
    "HintedReplayModel",
    "ReplayModel",
    "agent_replay",
    "learned_latencies",
    "predicted_gap",
]

_INPUT = "Replay the recorded turn."
_TOOL_TIMEOUT_S = 3600.0  # a sub-agent's whole run is one Task call
_MAX_TOOL_CONCURRENCY = 64  # Claude Code runs a response's calls all at once
_RECORDED_PRIOR_S = 1.0  # the SDK's default latency prior, in the session's own time


@dataclass(slots=True)
class AgentRun:
    """What one configuration's replay produced: the records in issue order, each
    one's prompt (for the bounds), and the sessions that failed as a whole."""

    records: list[RequestRecord] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


def _instructions(branch: Branch) -> str:
    """The system prompt of a branch's agent: how ``ReplayModel`` knows which
    recording a request continues."""
    return f"Replay of Claude Code branch {branch.name}"


@dataclass(slots=True)
class _Shared:
    """What every session of one configuration's replay shares."""

    settings: ReplaySettings
    run: AgentRun
    index: PrefixIndex
    start: float
    on_done: OnDone | None
    # The tool latencies every session's agent learns into and starts from, as
    # one agent's sessions on one machine would (``RunConfig.shared_latency``).
    latency: LatencyStats


class _Completions:
    def __init__(self, model: ReplayModel) -> None:
        self.create = model.create


class _Chat:
    def __init__(self, model: ReplayModel) -> None:
        self.completions = _Completions(model)


class ReplayModel:
    """One session's model for the agent loop (an ``agentsdk.ModelClient``).

    Each ``chat.completions.create`` is matched to its recorded call by the
    request's system prompt (which branch) and its number of assistant messages
    (which call of it), sent as that call's token-id prompt through ``backend``
    (whose own hooks add the hints of the loop's ``hint_scope``), and answered
    with the recorded tool calls (none for a call that ends its turn).
    """

    def __init__(self, session: Session, backend: openai.AsyncOpenAI, shared: _Shared) -> None:
        self.session = session
        self.chat = _Chat(self)
        self.sent: list[tuple[RequestRecord, ModelCall]] = []
        self._backend = backend
        self._shared = shared
        self._prompts = PromptMapper(session, shared.settings.k, shared.settings.vocab_size)
        self._branches = {_instructions(b): b for b in session.branches()}

    async def create(self, **request: Any) -> ChatCompletion:
        messages: Sequence[Mapping[str, Any]] = request["messages"]
        branch = self._branches[str(messages[0].get("content"))]
        seq = sum(1 for m in messages if m.get("role") == "assistant")
        call = branch.calls[seq]
        record, prompt = self._record(branch, call, seq)
        text = await self._complete(record, prompt)
        if self._shared.on_done is not None:
            self._shared.on_done(record)
        return _completion(call, record, text, str(request["model"]))

    def _record(self, branch: Branch, call: ModelCall, seq: int) -> tuple[RequestRecord, list[int]]:
        shared, settings = self._shared, self._shared.settings
        prompt = self._prompts.prompt(branch, call)
        hints = current_hints()
        record = RequestRecord(
            trace_id=self.session.session_id,
            branch=hints.br if hints is not None and hints.br else ROOT,
            seq=seq,
            sent_at=round(time.monotonic() - shared.start, 3),
            prompt_tokens=len(prompt),
            max_tokens=settings.max_tokens(call.output_tokens),
            theoretical_cached=shared.index.add(prompt),
            hint=serialize_header(hints) if settings.hints and hints is not None else None,
            ends_turn=call.ends_turn,
            wait_kind=None if call.ends_turn else call.wait_kind,
            recorded_wait_s=_recorded_wait(branch, seq, settings),
        )
        shared.run.records.append(record)
        shared.run.prompts.append(prompt)
        self.sent.append((record, call))
        return record, prompt

    async def _complete(self, record: RequestRecord, prompt: list[int]) -> str:
        """Stream the prompt's completion into ``record`` (TTFT = the first chunk,
        usage, the server's predicted gap) or its error; the generated text."""
        text: list[str] = []
        sent = time.monotonic()
        try:
            body = {
                "model": self._shared.settings.model,
                "prompt": prompt,
                "max_tokens": record.max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            # ``completions.create`` would transform the prompt id by id (~100 ms of
            # client CPU for 4,000 ids): the same POST, untransformed.
            stream = await self._backend.post(
                "/completions",
                body=body,
                cast_to=Completion,
                stream=True,
                stream_cls=openai.AsyncStream[Completion],
            )
            async with stream:
                async for chunk in stream:
                    if chunk.choices:
                        if record.ttft_s is None:
                            record.ttft_s = round(time.monotonic() - sent, 4)
                        text.append(chunk.choices[0].text)
                    if chunk.usage is not None:
                        details = chunk.usage.prompt_tokens_details
                        record.cached_tokens = (details.cached_tokens if details else 0) or 0
                        record.completion_tokens = chunk.usage.completion_tokens
                    gap = predicted_gap(chunk)
                    if gap is not None:
                        record.server_gap_s = gap
            record.latency_s = round(time.monotonic() - sent, 4)
            if record.cached_tokens is None:
                record.error = "no usage in the stream"
        except openai.APIError as err:
            record.error = f"{type(err).__name__}: {err}"
        return "".join(text)


class HintedReplayModel(ReplayModel):
    """``ReplayModel`` that is also the run's control sink, as a hinted client is:
    the loop's events go to ``control``, and its ``tool_start`` events are kept to
    score their ETAs against the waits that followed."""

    def __init__(
        self,
        session: Session,
        backend: openai.AsyncOpenAI,
        shared: _Shared,
        control: ControlChannel[openai.AsyncOpenAI],
    ) -> None:
        super().__init__(session, backend, shared)
        self.tool_starts: list[ToolStart] = []
        self._control = control

    async def send(self, sid: str, events: Sequence[ControlEvent]) -> object:
        self.tool_starts.extend(e for e in events if isinstance(e, ToolStart))
        return await self._control.send(sid, events)

    def assign_etas(self) -> None:
        """Give each sent record the ETA the loop announced for the wait after it:
        the largest of its response's ``tool_start`` ETAs (the branch is back when
        the last tool is done), or, after a turn, the ``user`` one's.

        A branch's events come in the order the loop submitted them, one per tool
        call of each response, then one ``user`` after a turn that keeps the
        session: so they are matched by counting, checked by tool name.
        """
        queues: dict[str, list[ToolStart]] = {}
        for event in self.tool_starts:
            queues.setdefault(event.br or ROOT, []).append(event)
        taken: dict[str, int] = {}
        for record, call in self.sent:
            queue, at = queues.get(record.branch, []), taken.get(record.branch, 0)
            if not call.ends_turn:
                batch = queue[at : at + len(call.tools)]
                taken[record.branch] = at + len(call.tools)
                etas = [e.eta for e in batch if e.eta is not None]
                if [e.tool for e in batch] == [u.kind for u in call.tools] and etas:
                    record.eta_s = max(etas)
            elif at < len(queue) and queue[at].tool == USER_TOOL:
                record.eta_s = queue[at].eta
                taken[record.branch] = at + 1


def _recorded_wait(branch: Branch, seq: int, settings: ReplaySettings) -> float | None:
    """The wait the recording had after ``branch``'s call ``seq`` (on its tools, or
    on the user after a turn), as the replay scales it; None after the last."""
    call = branch.calls[seq]
    if not call.ends_turn:
        wait = call.wait_s
    elif seq + 1 < len(branch.calls):
        wait = branch.calls[seq + 1].user_wait_s
    else:
        wait = None
    return None if wait is None else settings.wait_s(wait)


def predicted_gap(response: object) -> float | None:
    """The server's predicted gap for the branch a response leaves, when the server
    reports one: ``kv_transfer_params["agent_hints"]["predicted_gap_s"]`` of a
    completion or of a streamed chunk."""
    params = getattr(response, "kv_transfer_params", None)
    hints = params.get("agent_hints") if isinstance(params, dict) else None
    gap = hints.get("predicted_gap_s") if isinstance(hints, dict) else None
    if isinstance(gap, int | float) and not isinstance(gap, bool) and gap >= 0:
        return float(gap)
    return None


def _completion(call: ModelCall, record: RequestRecord, text: str, model: str) -> ChatCompletion:
    """The loop's answer: the generated text and the recorded tool calls, each
    naming its recorded call (the tools look it up by id)."""
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if not call.ends_turn and call.tools:
        message["tool_calls"] = [
            {
                "id": use.call_id,
                "type": "function",
                "function": {"name": use.kind, "arguments": json.dumps({"call": use.call_id})},
            }
            for use in call.tools
        ]
    completion = record.completion_tokens or 0
    return ChatCompletion.model_validate(
        {
            "id": f"replay-{record.trace_id}-{record.seq}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if "tool_calls" in message else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": record.prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": record.prompt_tokens + completion,
                "prompt_tokens_details": {"cached_tokens": record.cached_tokens or 0},
            },
        }
    )


def _result(use: ToolUse) -> str:
    """A tool result of the recorded size."""
    return "." * use.result_chars


def _agent_tools(session: Session, settings: ReplaySettings) -> list[Tool]:
    """One ``@tool`` per tool kind of the session: it waits as the recorded call
    (named by its id) did, or for ``Task`` runs the recorded sub-agent."""
    uses = {u.call_id: u for b in session.branches() for c in b.calls for u in c.tools}
    tools: list[Tool] = []

    async def replay_call(call: str = "") -> str:
        use = uses[call]
        await anyio.sleep(settings.wait_s(use.duration_s or 0.0))
        return _result(use)

    async def replay_task(ctx: RunContext, call: str = "") -> str:
        use = uses[call]
        if use.agent is None:  # its lines are not in the file (Claude Code 2.1 writes them apart)
            await anyio.sleep(settings.wait_s(use.duration_s or 0.0))
        else:
            agent = Agent(name="task", instructions=_instructions(use.agent), tools=tools)
            await Runner.fan_out(
                ctx, [(agent, _INPUT)], fork_context=False, max_turns=len(use.agent.calls) + 1
            )
        return _result(use)

    for kind in sorted({u.kind for u in uses.values()}):
        function = replay_task if kind == TASK else replay_call
        described = tool(name=kind, description=f"The recorded {kind} calls.", lenient=True)
        tools.append(described(function))
    return tools


async def _replay_session(
    session: Session,
    backend: openai.AsyncOpenAI,
    control: ControlChannel[openai.AsyncOpenAI] | None,
    shared: _Shared,
) -> None:
    """Run ``session``'s turns through ``Runner.run``, one run per user turn."""
    settings = shared.settings
    model = (
        ReplayModel(session, backend, shared)
        if control is None
        else HintedReplayModel(session, backend, shared, control)
    )
    agent = Agent(
        name="claude-code",
        instructions=_instructions(session.root),
        model=settings.model,
        tools=_agent_tools(session, settings),
    )
    store = InMemorySession(session.session_id)
    turns = session.root.turns()
    try:
        for i, turn in enumerate(turns):
            if i and turn[0].user_wait_s is not None:
                await anyio.sleep(settings.wait_s(turn[0].user_wait_s))
            config = RunConfig(
                end_session=i == len(turns) - 1,
                latency_prior=settings.wait_s(_RECORDED_PRIOR_S),
                shared_latency=shared.latency,
                user_wait_prior=settings.prior_user_wait_s,
                tool_timeout=_TOOL_TIMEOUT_S,
                max_tool_concurrency=_MAX_TOOL_CONCURRENCY,
                max_model_calls=session.num_calls + 1,
            )
            await Runner.run(
                agent,
                _INPUT,
                client=model,
                session=store,
                max_turns=len(turn) + 1,
                run_config=config,
            )
    except Exception as err:  # the other sessions go on; the report names this one
        shared.run.errors[session.session_id] = f"{type(err).__name__}: {err}"
    finally:
        if isinstance(model, HintedReplayModel):
            model.assign_etas()


def learned_latencies(history: Sequence[Session], settings: ReplaySettings) -> LatencyStats:
    """What an agent that ran ``history`` first has learned of its tools' and its
    user's waits, as the replay scales them: its ``RunConfig.shared_latency``
    when the replayed sessions come after those."""
    estimator = LatencyEstimator()
    for session in history:
        for branch in session.branches():
            for call in branch.calls:
                if call.user_wait_s is not None:
                    estimator.observe(USER_TOOL, settings.wait_s(call.user_wait_s))
                for use in call.tools:
                    if use.duration_s is not None:
                        estimator.observe(use.kind, settings.wait_s(use.duration_s))
    return estimator.stats


async def agent_replay(
    sessions: Sequence[Session],
    settings: ReplaySettings,
    *,
    history: LatencyStats | None = None,
    on_done: OnDone | None = None,
    http_client: httpx2.AsyncClient | None = None,
) -> AgentRun:
    """Replay ``sessions`` concurrently (at most ``settings.concurrency`` at once)
    against ``settings.base_url``: through ``HintedAsyncOpenAI`` and its control
    channel when ``settings.hints``, else through the plain ``openai.AsyncOpenAI``
    (either on ``http_client`` when given: a proxy, a test transport). The
    sessions' agents start from ``history`` (``learned_latencies``; copied, so
    that every configuration starts from the same), else from nothing. ``on_done``
    sees each record once it is final."""
    if settings.tenant_per_trace or settings.oracle_gaps:
        raise ValueError("the agent replay has no tenant per trace and no oracle gaps")
    shared = _Shared(
        settings,
        AgentRun(),
        PrefixIndex(settings.block_size),
        time.monotonic(),
        on_done,
        history.model_copy(deep=True) if history is not None else LatencyStats(),
    )
    client = HintedAsyncOpenAI if settings.hints else openai.AsyncOpenAI
    async with client(
        base_url=f"{settings.base_url}/v1",
        api_key="EMPTY",
        max_retries=0,  # a failed request is a result, not something to hide
        timeout=settings.request_timeout_s,
        http_client=http_client,
    ) as backend:
        control = ControlChannel(backend) if settings.hints else None
        limit = anyio.Semaphore(settings.concurrency or max(len(sessions), 1))

        async def one(session: Session) -> None:
            async with limit:
                await _replay_session(session, backend, control, shared)

        async with anyio.create_task_group() as group:
            for session in sessions:
                group.start_soon(one, session)
    return shared.run
