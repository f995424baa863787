"""Agent sessions drawn from measured figures: the workload a clone carries.

The real sessions cannot ship (the Claude Code transcripts are GPL-2.0; the
anonymized traces name no tools), so the repository carries what was measured
on them instead: ``workload_figures.json``, written by ``python -m
benchmarks.workload_figures``, holds each statistic as a distribution (its
quantiles, or counts), which set it was measured on, and when. ``generate``
draws seeded sessions from those figures in the agent replay's session model
(``_claude_code.Session``), so the agent replay runs them exactly as it runs
recorded ones: tool calls by kind with their waits, parallel calls, sub-agents,
user turns with the user's reply time between them.

A generated session: a system prefix (shared by all generated sessions up to
the shorter one's, as sessions of one model share it), the task, then per user
turn a run of model calls, each but the last calling tools; its prompt grows
by a drawn amount per call (the tools' results take what the output leaves).
A tool-calling response starts sub-agents (``Task``) as often as measured, each
a short branch of its own that calls no ``Task``.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._claude_code import CHARS_PER_TOKEN, TASK, Branch, ModelCall, Session, ToolUse
from ._traces import ROOT

__all__ = [
    "FIGURES_PATH",
    "GENERATED_MODEL",
    "TRACES",
    "TRANSCRIPTS",
    "Counts",
    "Figures",
    "Quantiles",
    "generated_sessions",
    "measure",
]

FIGURES_PATH = Path(__file__).with_name("workload_figures.json")
"""The committed figures (``python -m benchmarks.workload_figures`` writes them)."""

GENERATED_MODEL = "generated"
"""The model every generated session names: they share its system prefix."""

QUANTILE_POINTS = 21
"""A distribution is kept as its minimum, 5%, 10%, ..., 95% quantiles and maximum."""


@dataclass(frozen=True, slots=True)
class Quantiles:
    """A continuous distribution as evenly spaced quantiles (the first the minimum,
    the last the maximum); a draw interpolates between two neighbours (inverse
    transform sampling), so draws stay within what was measured.

    Args:
        values: ``QUANTILE_POINTS`` quantiles, ascending.
        n: How many samples they summarize.
        measured_on: Which sets the samples came from.
    """

    values: tuple[float, ...]
    n: int
    measured_on: tuple[str, ...]

    @classmethod
    def of(cls, samples: Iterable[float], measured_on: Sequence[str], digits: int) -> Quantiles:
        ordered = sorted(samples)
        if not ordered:
            raise ValueError(f"no samples to measure on {', '.join(measured_on)}")
        last = len(ordered) - 1
        values = []
        for i in range(QUANTILE_POINTS):
            pos = last * i / (QUANTILE_POINTS - 1)
            low, frac = int(pos), pos - int(pos)
            high = ordered[min(low + 1, last)]
            values.append(round(ordered[low] + (high - ordered[low]) * frac, digits))
        return cls(tuple(values), len(ordered), tuple(measured_on))

    def draw(self, rng: random.Random) -> float:
        pos = rng.random() * (len(self.values) - 1)
        low = int(pos)
        high = self.values[min(low + 1, len(self.values) - 1)]
        return self.values[low] + (high - self.values[low]) * (pos - low)

    def draw_int(self, rng: random.Random, least: int = 0) -> int:
        return max(least, round(self.draw(rng)))

    def to_json(self) -> dict[str, Any]:
        return {"measured_on": list(self.measured_on), "n": self.n, "quantiles": list(self.values)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Quantiles:
        values = tuple(float(v) for v in data["quantiles"])
        if len(values) != QUANTILE_POINTS or list(values) != sorted(values):
            raise ValueError(f"expected {QUANTILE_POINTS} ascending quantiles, got {values}")
        return cls(values, int(data["n"]), tuple(data["measured_on"]))


@dataclass(frozen=True, slots=True)
class Counts:
    """A discrete distribution: how often each value (a kind, or a count as a
    string) was seen; a draw picks one with those weights."""

    counts: Mapping[str, int]
    measured_on: tuple[str, ...]

    @classmethod
    def of(cls, samples: Iterable[object], measured_on: Sequence[str]) -> Counts:
        counts: dict[str, int] = {}
        for sample in samples:
            counts[str(sample)] = counts.get(str(sample), 0) + 1
        if not counts:
            raise ValueError(f"no samples to count on {', '.join(measured_on)}")
        ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return cls(dict(ordered), tuple(measured_on))

    @property
    def n(self) -> int:
        return sum(self.counts.values())

    def draw(self, rng: random.Random) -> str:
        return rng.choices(list(self.counts), weights=list(self.counts.values()))[0]

    def draw_int(self, rng: random.Random) -> int:
        return int(self.draw(rng))

    def to_json(self) -> dict[str, Any]:
        return {"measured_on": list(self.measured_on), "counts": dict(self.counts)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Counts:
        counts = {str(k): int(v) for k, v in data["counts"].items()}
        if not counts or any(v < 0 for v in counts.values()) or not sum(counts.values()):
            raise ValueError(f"expected positive counts, got {counts}")
        return cls(counts, tuple(data["measured_on"]))


@dataclass(frozen=True, slots=True)
class Figures:
    """What a generated session is drawn from (tokens are prompt tokens at full
    scale, waits seconds as recorded).

    Args:
        system_tokens: A session's system prefix (system prompt, tool schemas).
        task_tokens: Its first prompt beyond the system prefix (the task).
        turns: User turns per session.
        user_wait_s: How long the user takes to reply between turns.
        calls_per_turn: Model calls of one agent turn.
        growth_tokens: How much a branch's prompt grows from one call to the next.
        output_tokens: Output of one call.
        tools_per_call: Parallel tool calls of a response that calls tools.
        tool_kinds: Tool calls by kind (``Bash`` by command kind; ``Task`` apart).
        tool_wait_s: Per kind, the wait from the response to the tool's result.
        sub_agents_per_call: Sub-agents a tool-calling response starts (mostly 0).
        sub_agent_calls: Model calls of one sub-agent.
        sub_agent_first_tokens: A sub-agent's first prompt.
        sub_agent_system_tokens: How much of the session's system prefix it shares.
        provenance: Which data, when, how (``workload_figures.json``'s own).
    """

    system_tokens: Quantiles
    task_tokens: Quantiles
    turns: Counts
    user_wait_s: Quantiles
    calls_per_turn: Quantiles
    growth_tokens: Quantiles
    output_tokens: Quantiles
    tools_per_call: Counts
    tool_kinds: Counts
    tool_wait_s: Mapping[str, Quantiles]
    sub_agents_per_call: Counts
    sub_agent_calls: Quantiles
    sub_agent_first_tokens: Quantiles
    sub_agent_system_tokens: Quantiles
    provenance: Mapping[str, Any]

    def __post_init__(self) -> None:
        missing = sorted(set(self.tool_kinds.counts) - set(self.tool_wait_s))
        if missing:
            raise ValueError(f"tool kinds without waits: {', '.join(missing)}")
        if TASK in self.tool_kinds.counts:
            raise ValueError(f"{TASK} is a sub-agent (sub_agents_per_call), not a tool kind")

    def to_json(self) -> dict[str, Any]:
        figures: dict[str, Any] = {}
        for name in _DISTRIBUTIONS:
            figures[name] = getattr(self, name).to_json()
        figures["tool_wait_s"] = {k: q.to_json() for k, q in self.tool_wait_s.items()}
        return {"provenance": dict(self.provenance), "figures": figures}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Figures:
        figures = data["figures"]
        fields: dict[str, Any] = {}
        for name, kind in _DISTRIBUTIONS.items():
            fields[name] = kind.from_json(figures[name])
        waits = {k: Quantiles.from_json(q) for k, q in figures["tool_wait_s"].items()}
        return cls(**fields, tool_wait_s=waits, provenance=data["provenance"])

    @classmethod
    def load(cls, path: Path = FIGURES_PATH) -> Figures:
        """The figures at ``path``; a file of another shape raises ``ValueError``
        naming it."""
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: not a workload figures file ({e!r})") from e

    def write(self, path: Path = FIGURES_PATH) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")


_DISTRIBUTIONS: dict[str, type[Quantiles] | type[Counts]] = {
    "system_tokens": Quantiles,
    "task_tokens": Quantiles,
    "turns": Counts,
    "user_wait_s": Quantiles,
    "calls_per_turn": Quantiles,
    "growth_tokens": Quantiles,
    "output_tokens": Quantiles,
    "tools_per_call": Counts,
    "tool_kinds": Counts,
    "sub_agents_per_call": Counts,
    "sub_agent_calls": Quantiles,
    "sub_agent_first_tokens": Quantiles,
    "sub_agent_system_tokens": Quantiles,
}
"""The fields of ``Figures`` that are one distribution, and of which type."""


TRANSCRIPTS = "claude-code"
TRACES = "traces"
"""The names ``Figures`` gives the two measured sets."""


def _sub_agents(sessions: Iterable[Session]) -> Iterator[Branch]:
    return (b for s in sessions for b in s.branches() if b.name != ROOT)


def _tool_calls(sessions: Iterable[Session], roots_only: bool = False) -> Iterator[ModelCall]:
    """The calls whose tools the replay runs (a call that ends its turn runs none)."""
    for session in sessions:
        branches = [session.root] if roots_only else list(session.branches())
        yield from (c for b in branches for c in b.calls if c.tools and not c.ends_turn)


def measure(
    transcripts: Sequence[Session], traces: Sequence[Session], provenance: Mapping[str, Any]
) -> Figures:
    """The figures of two sets: Claude Code ``transcripts`` (tool names and
    kinds, parallel calls, the system prefix; headless, one user turn each) and
    the anonymized ``traces`` as sessions (``_sessions.session_from_trace``:
    people's sessions, with user turns, but no tool names). Each statistic is
    measured on the sets that have it."""
    both, cc, tr = (TRANSCRIPTS, TRACES), (TRANSCRIPTS,), (TRACES,)
    everything = [*transcripts, *traces]
    branches = [b for s in everything for b in s.branches()]
    uses = [u for c in _tool_calls(transcripts) for u in c.tools if u.name != TASK]
    waits: dict[str, list[float]] = {}
    for use in uses:
        if use.duration_s is not None:
            waits.setdefault(use.kind, []).append(use.duration_s)
    return Figures(
        system_tokens=Quantiles.of((s.root.system_tokens for s in transcripts), cc, 0),
        task_tokens=Quantiles.of(
            (
                s.root.calls[0].prompt_tokens - s.root.system_tokens
                for s in transcripts
                if s.root.calls
            ),
            cc,
            0,
        ),
        turns=Counts.of((len(s.root.turns()) for s in traces if s.root.calls), tr),
        user_wait_s=Quantiles.of(
            (c.user_wait_s for s in traces for c in s.root.calls if c.user_wait_s is not None),
            tr,
            3,
        ),
        calls_per_turn=Quantiles.of((len(t) for s in everything for t in s.root.turns()), both, 0),
        growth_tokens=Quantiles.of(
            (
                b.prompt_tokens - a.prompt_tokens
                for branch in branches
                for a, b in zip(branch.calls, branch.calls[1:], strict=False)
                if a.chain == b.chain
            ),
            both,
            0,
        ),
        output_tokens=Quantiles.of((c.output_tokens for b in branches for c in b.calls), both, 0),
        tools_per_call=Counts.of(
            (
                len(c.tools)
                for c in _tool_calls(transcripts)
                if all(u.name != TASK for u in c.tools)
            ),
            cc,
        ),
        tool_kinds=Counts.of((u.kind for u in uses if u.kind in waits), cc),
        tool_wait_s={k: Quantiles.of(w, cc, 3) for k, w in sorted(waits.items())},
        sub_agents_per_call=Counts.of(
            (
                sum(u.name == TASK for u in c.tools)
                for c in _tool_calls(everything, roots_only=True)
            ),
            both,
        ),
        sub_agent_calls=Quantiles.of((len(b.calls) for b in _sub_agents(everything)), both, 0),
        sub_agent_first_tokens=Quantiles.of(
            (b.calls[0].prompt_tokens for b in _sub_agents(everything)), both, 0
        ),
        sub_agent_system_tokens=Quantiles.of(
            (b.system_tokens for b in _sub_agents(everything)), both, 0
        ),
        provenance=provenance,
    )


class _Drawer:
    """The draws of one session. ``max_prompt`` ends a branch, as its turn's
    answer, before a call whose prompt would exceed it."""

    def __init__(
        self, figures: Figures, session_id: str, rng: random.Random, max_prompt: int | None
    ) -> None:
        self.figures = figures
        self.session_id = session_id
        self.rng = rng
        self.max_prompt = max_prompt
        self.clock = 0.0  # the session's recorded time: the waits add up
        self.uses = 0  # tool call ids are unique within the session
        self.sub_agents = 0

    def fits(self, prompt: int) -> bool:
        return self.max_prompt is None or prompt <= self.max_prompt

    def turn(
        self,
        branch: str,
        first_seq: int,
        prompt: int,
        forks: bool,
        user_wait_s: float | None = None,
        n: int | None = None,
    ) -> tuple[list[ModelCall], int, bool]:
        """One agent turn of ``branch`` from ``prompt`` (``n`` calls, else drawn):
        its calls, the prompt after it, whether the prompt limit cut it short."""
        f, rng = self.figures, self.rng
        n = f.calls_per_turn.draw_int(rng, least=1) if n is None else n
        calls: list[ModelCall] = []
        for i in range(n):
            output = f.output_tokens.draw_int(rng, least=1)
            growth = f.growth_tokens.draw_int(rng, least=1)
            last = i == n - 1 or not self.fits(prompt + growth)
            started = round(self.clock, 3)
            tools = () if last else self.tools(growth, output, forks)
            call = ModelCall(
                message_id=f"{self.session_id}-{branch}-{first_seq + i}",
                started=started,
                ended=started,
                prompt_tokens=prompt,
                output_tokens=output,
                tools=tools,
                ends_turn=last,
                user_wait_s=user_wait_s if i == 0 else None,
            )
            self.clock += call.wait_s or 0.0
            calls.append(call)
            prompt += growth
            if last:
                return calls, prompt, i < n - 1
        return calls, prompt, False

    def tools(self, growth: int, output: int, forks: bool) -> tuple[ToolUse, ...]:
        """The tool calls of a response after which the prompt grows by ``growth``:
        sub-agents as often as measured (when ``forks``), else tools of drawn
        kinds whose results fill what the output leaves of the growth."""
        f, rng = self.figures, self.rng
        agents = f.sub_agents_per_call.draw_int(rng) if forks else 0
        if agents:
            return tuple(
                ToolUse(self._use_id(), TASK, TASK, None, agent=self.sub_agent())
                for _ in range(agents)
            )
        kinds = [f.tool_kinds.draw(rng) for _ in range(max(f.tools_per_call.draw_int(rng), 1))]
        result_chars = max(growth - output, 0) * CHARS_PER_TOKEN // len(kinds)
        return tuple(
            ToolUse(
                self._use_id(),
                kind.split("-")[0],
                kind,
                round(f.tool_wait_s[kind].draw(rng), 3),
                result_chars,
            )
            for kind in kinds
        )

    def _use_id(self) -> str:
        self.uses += 1
        return f"{self.session_id}-use-{self.uses}"

    def sub_agent(self) -> Branch:
        """A sub-agent: one turn from its own first prompt, no ``Task`` of its own."""
        f, rng = self.figures, self.rng
        self.sub_agents += 1
        name = f"agent-{self.sub_agents}"
        first = f.sub_agent_first_tokens.draw_int(rng, least=1)
        first = first if self.max_prompt is None else min(first, self.max_prompt)
        system = min(f.sub_agent_system_tokens.draw_int(rng), first)
        n = f.sub_agent_calls.draw_int(rng, least=1)
        calls, _, _ = self.turn(name, 0, first, forks=False, n=n)
        return Branch(name, tuple(calls), system)


def _session(figures: Figures, session_id: str, seed: str, max_prompt: int | None) -> Session:
    rng = random.Random(seed)
    drawer = _Drawer(figures, session_id, rng, max_prompt)
    system = figures.system_tokens.draw_int(rng)
    prompt = system + figures.task_tokens.draw_int(rng, least=1)
    if max_prompt is not None:
        prompt = min(prompt, max_prompt)
        system = min(system, prompt)
    calls: list[ModelCall] = []
    for turn in range(max(figures.turns.draw_int(rng), 1)):
        user_wait = round(figures.user_wait_s.draw(rng), 3) if turn else None
        drawer.clock += user_wait or 0.0
        turn_calls, prompt, cut = drawer.turn(ROOT, len(calls), prompt, True, user_wait)
        calls += turn_calls
        if cut or not drawer.fits(prompt):
            break
    return Session(session_id, GENERATED_MODEL, Branch(ROOT, tuple(calls), system))


def generated_sessions(
    figures: Figures, seed: int = 0, *, max_prompt_tokens: int | None = None
) -> Iterator[Session]:
    """Sessions drawn from ``figures``, without end: session ``i`` depends on
    ``seed`` and ``i`` only, so the same seed gives the same sessions on any
    machine. ``max_prompt_tokens`` ends a branch (as its turn's answer) before a
    call whose prompt would exceed it."""
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
    for i in itertools.count():
        yield _session(figures, f"generated-{i:03d}", f"{seed}:{i}", max_prompt_tokens)
