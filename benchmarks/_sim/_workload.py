"""Sessions as the simulator replays them: branches of timed model calls.

Both session models of the benchmarks become one here: the anonymized traces
(``_traces.Trace``, hash ids per 64 tokens: two prompts share a prefix exactly
as far as their hash ids agree) and the session model of the Claude Code
transcripts and the generated sessions (``_claude_code.Session``: a call's
prompt is its branch's share of the system prefix, then its chain's own
tokens, as ``PromptMapper`` lays them out). A trace is paced as
``_replay`` paces it (the think time before each request, scaled and capped;
after a fork only what the sub-agents did not already spend); a session as
recorded (a tool's duration, the user's wait, sub-agents as forks).

Block keys are ints: ``namespace << 40 | local``. Every session replica gets
its own namespace; the system prefix of a model is namespace 0, shared by all
sessions of that model. Keys are made when a request is sent, not before, so
a run of 10,000 sessions holds only the live ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from .._claude_code import Branch, ModelCall, Session
from .._traces import ROOT, TRACE_BLOCK, Fork, Trace, TraceRequest

__all__ = [
    "Pacing",
    "SimBranch",
    "SimFork",
    "SimRequest",
    "Template",
    "from_session",
    "from_trace",
]

_NS_SHIFT = 40
_CHAIN_SHIFT = 24
"""A chain's local keys: its index << 24 | block (16M blocks per chain)."""


@dataclass(frozen=True, slots=True)
class Pacing:
    """How recorded waits become simulated ones, and tokens engine tokens.

    Args:
        time_scale: Waits are divided by this (the suite's ``time_scale``).
        max_wait_s: ...and capped at this (0: no cap).
        token_scale: Engine tokens per recorded token (the test bed's k/64).
        block_tokens: Engine tokens per block.
        max_out: Cap on output tokens (0: none).
    """

    time_scale: float = 1.0
    max_wait_s: float = 0.0
    token_scale: float = 1.0
    block_tokens: int = 256
    max_out: int = 0
    max_prompt: int = 0
    """Prompts are cut to this many engine tokens, their prefix kept (the
    model's context; 0: no cap)."""

    def wait(self, recorded_s: float | None) -> float:
        w = max(recorded_s or 0.0, 0.0) / self.time_scale
        return min(w, self.max_wait_s) if self.max_wait_s > 0 else w

    def tokens(self, recorded: int) -> int:
        """Engine tokens of a prompt of ``recorded`` tokens, whole 64-token
        hash blocks as the replays send them."""
        return self.cut(round(math.ceil(recorded / TRACE_BLOCK) * TRACE_BLOCK * self.token_scale))

    def cut(self, tokens: int) -> int:
        return min(tokens, self.max_prompt) if self.max_prompt > 0 else tokens

    def output(self, recorded: int) -> int:
        out = max(1, int(recorded * self.token_scale))
        return min(out, self.max_out) if self.max_out > 0 else out

    @property
    def hashes_per_block(self) -> int:
        """Trace hash ids per engine block."""
        per = self.block_tokens / (TRACE_BLOCK * self.token_scale)
        if per != int(per) or per < 1:
            raise ValueError(
                f"a block of {self.block_tokens} engine tokens is no whole number of "
                f"64-token hash blocks at token scale {self.token_scale}"
            )
        return int(per)


@dataclass(slots=True)
class SimRequest:
    """One model call: sent ``wait_s`` after its branch's previous event.

    ``tool``: what the branch waits on after the response (None: the turn
    ends, the user is next; ignored when ``end``). ``chain``: the keys'
    source (``_Chain`` or a tuple of trace hash ids)."""

    wait_s: float
    prompt_tokens: int
    output_tokens: int
    ends_turn: bool
    end: bool
    tool: str | None
    chain: _Chain | tuple[int, ...]
    nominal_s: float = 0.0
    """When it would be sent if every response were instant (Belady's clock)."""
    next_in_branch: SimRequest | None = None
    """The branch's next request (None: the last)."""


@dataclass(slots=True)
class SimFork:
    """Sub-agents that start together; the parent resumes after the last."""

    branches: list[SimBranch]


@dataclass(slots=True)
class SimBranch:
    name: str
    parent: str | None
    steps: list[SimRequest | SimFork]


@dataclass(frozen=True, slots=True)
class _Chain:
    """A prompt laid out as ``PromptMapper`` does: ``system`` blocks of the
    model's prefix, then the chain's own."""

    model: int
    system_blocks: int
    chain: int


@dataclass(slots=True)
class Template:
    """A session to replay, any number of times (each replica its own keys)."""

    session_id: str
    root: SimBranch
    requests: int
    hashed: bool
    """Keys from trace hash ids (a trie per replica) rather than chains."""
    tools: set[str] = field(default_factory=set)

    def walk(self) -> Iterator[SimRequest]:
        stack: list[SimBranch] = [self.root]
        while stack:
            branch = stack.pop()
            for step in branch.steps:
                if isinstance(step, SimFork):
                    stack.extend(step.branches)
                else:
                    yield step


class Keys:
    """The block keys of one session replica's prompts."""

    __slots__ = ("_base", "_hashes_per_block", "_next", "_trie")

    def __init__(self, namespace: int, hashes_per_block: int) -> None:
        self._base = namespace << _NS_SHIFT
        self._hashes_per_block = hashes_per_block
        self._trie: dict[tuple[int, tuple[int, ...]], int] = {}
        self._next = 0

    def of(self, request: SimRequest, block_tokens: int) -> list[int]:
        n = request.prompt_tokens // block_tokens
        chain = request.chain
        if isinstance(chain, _Chain):
            shared = min(chain.system_blocks, n)
            system = (chain.model << _CHAIN_SHIFT) + 1
            own = self._base + (chain.chain << _CHAIN_SHIFT)
            return [*range(system, system + shared), *range(own + shared, own + n)]
        per = self._hashes_per_block
        keys: list[int] = []
        parent = -1
        for j in range(n):
            node = (parent, chain[j * per : (j + 1) * per])
            key = self._trie.get(node)
            if key is None:
                key = self._trie[node] = self._base + self._next
                self._next += 1
            keys.append(key)
            parent = key
        return keys


def from_trace(trace: Trace, pacing: Pacing) -> Template:
    """A trace paced as ``benchmarks._replay`` replays it."""
    count = 0

    def branch(name: str, parent: str | None, steps: Sequence[TraceRequest | Fork]) -> SimBranch:
        nonlocal count
        out: list[SimRequest | SimFork] = []
        last = max(i for i, s in enumerate(steps) if isinstance(s, TraceRequest))
        forked_s = 0.0
        for i, step in enumerate(steps):
            if isinstance(step, Fork):
                out.append(SimFork([branch(a.agent_id, name, a.requests) for a in step.agents]))
                forked_s += step.duration_s
                continue
            end = i == last and name != ROOT
            count += 1
            out.append(
                SimRequest(
                    wait_s=pacing.wait(step.think_time - forked_s),
                    prompt_tokens=pacing.cut(
                        round(len(step.hash_ids) * TRACE_BLOCK * pacing.token_scale)
                    ),
                    output_tokens=pacing.output(step.out),
                    ends_turn=step.ends_turn,
                    end=end,
                    tool=None if step.ends_turn else "tool",
                    chain=step.hash_ids,
                )
            )
            forked_s = 0.0
        return SimBranch(name, parent, out)

    root = branch(ROOT, None, trace.steps)
    template = Template(trace.trace_id, root, count, hashed=True)
    _set_nominal(template.root, 0.0)
    return template


def from_session(session: Session, pacing: Pacing, model_index: int) -> Template:
    """A session of the session model (transcripts, generated) as recorded."""
    chains: dict[tuple[str, int], int] = {}
    count = 0

    def branch(b: Branch, parent: str | None) -> SimBranch:
        nonlocal count
        out: list[SimRequest | SimFork] = []
        previous: ModelCall | None = None
        system = int(b.system_tokens * pacing.token_scale) // pacing.block_tokens
        for j, call in enumerate(b.calls):
            wait = 0.0
            if previous is not None:
                if previous.ends_turn:
                    wait = pacing.wait(call.user_wait_s)
                else:
                    forked = [t.duration_s or 0.0 for t in previous.tools if t.agent is not None]
                    wait = pacing.wait((previous.wait_s or 0.0) - max(forked, default=0.0))
            chain = chains.setdefault((b.name, call.chain), len(chains))
            end = parent is not None and j == len(b.calls) - 1
            count += 1
            out.append(
                SimRequest(
                    wait_s=wait,
                    prompt_tokens=pacing.tokens(call.prompt_tokens),
                    output_tokens=pacing.output(call.output_tokens),
                    ends_turn=call.ends_turn,
                    end=end,
                    tool=None if call.ends_turn else call.wait_kind,
                    chain=_Chain(model_index, system, chain),
                )
            )
            subs = [t.agent for t in call.tools if t.agent is not None]
            if subs and not call.ends_turn:
                out.append(SimFork([branch(a, b.name) for a in subs]))
            previous = call
        return SimBranch(b.name, parent, out)

    root = branch(session.root, None)
    template = Template(session.session_id, root, count, hashed=False)
    _set_nominal(template.root, 0.0)
    template.tools = {r.tool for r in template.walk() if r.tool}
    return template


def _set_nominal(branch: SimBranch, start: float) -> float:
    """Each request's send time were every response instant, and its
    branch's next request; returns when the branch is done."""
    t = start
    previous: SimRequest | None = None
    for step in branch.steps:
        if isinstance(step, SimFork):
            t = max((_set_nominal(b, t) for b in step.branches), default=t)
        else:
            t += step.wait_s
            step.nominal_s = t
            if previous is not None:
                previous.next_in_branch = step
            previous = step
    return t
