"""Where the agent replay's sessions come from.

Three sources, one session model (``_claude_code.Session``):

- ``claude-code``: Claude Code transcripts (``~/.claude/projects``, or
  ``../shared/traces-claude-code``), tool calls named by kind;
- ``traces``: the anonymized traces (``../shared/traces``): sizes and timings
  but no tool names, so each wait is on one tool, ``tool``;
- ``generated``: sessions drawn from the figures the repository carries
  (``_synthetic``), which needs nothing outside it.

A source is picked by an argument, else the transcripts of
``$AGENT_HINTS_CLAUDE_CODE`` or ``../shared``, else the traces of
``$AGENT_HINTS_TRACES`` or ``../shared``; where none is found the demo falls
back to ``generated``.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ._claude_code import (
    TASK,
    Branch,
    ModelCall,
    PromptMapper,
    Session,
    ToolUse,
    default_claude_code_dir,
    read_session,
    replayed_calls,
)
from ._replay import TRACE_TOOL
from ._synthetic import FIGURES_PATH, Figures, generated_sessions
from ._traces import (
    ROOT,
    TRACE_BLOCK,
    Fork,
    SubAgent,
    Trace,
    TraceRequest,
    default_traces_dir,
    load_trace,
)

__all__ = [
    "SessionSource",
    "SourceKind",
    "find_source",
    "load_history",
    "load_sessions",
    "select_sessions",
    "session_from_trace",
]

SourceKind = Literal["claude-code", "traces", "generated"]

_DRAWS_PER_SESSION = 100
"""The generator gives up after this many draws per session wanted (figures whose
sessions never call a tool would otherwise draw forever)."""


@dataclass(frozen=True, slots=True)
class SessionSource:
    """A set of sessions: a directory of transcripts or traces, or a figures file."""

    kind: SourceKind
    path: Path

    def describe(self) -> str:
        what = {
            "claude-code": "Claude Code transcripts",
            "traces": "anonymized traces",
            "generated": "sessions generated from the figures in",
        }[self.kind]
        try:
            shown = self.path.resolve().relative_to(Path.cwd())
        except ValueError:  # not under the working directory
            shown = self.path
        return f"{what} {shown}"


def find_source(
    repo_root: Path,
    *,
    claude_code: Path | None = None,
    traces: Path | None = None,
    generated: bool = False,
    fallback: bool = False,
) -> SessionSource:
    """The source the arguments name; else the transcripts
    (``$AGENT_HINTS_CLAUDE_CODE``, else ``../shared/traces-claude-code``), which
    name the tools; else the traces (``$AGENT_HINTS_TRACES``, else
    ``../shared/traces``); else, with ``fallback``, the generated sessions.

    A directory named by an argument or a variable must exist; when none is
    found, ``FileNotFoundError`` says how to name one.
    """
    if generated:
        return SessionSource("generated", FIGURES_PATH)
    named: list[tuple[SourceKind, Path | None, str]] = [
        ("claude-code", claude_code, "--claude-code"),
        ("traces", traces, "--traces"),
    ]
    defaults: list[tuple[SourceKind, Path, str]] = [
        ("claude-code", default_claude_code_dir(repo_root), "AGENT_HINTS_CLAUDE_CODE"),
        ("traces", default_traces_dir(repo_root), "AGENT_HINTS_TRACES"),
    ]
    for kind, path, origin in named:
        if path is not None:
            if not path.is_dir():
                raise FileNotFoundError(f"{origin}: directory {path} not found")
            return SessionSource(kind, path)
    for kind, path, variable in defaults:
        if path.is_dir():
            return SessionSource(kind, path)
        if os.environ.get(variable):
            raise FileNotFoundError(f"{variable}: directory {path} not found")
    if fallback:
        return SessionSource("generated", FIGURES_PATH)
    raise FileNotFoundError(
        f"no sessions: neither {defaults[0][1]} nor {defaults[1][1]} found; pass "
        "--claude-code DIR (your own sessions: ~/.claude/projects), --traces DIR or "
        "--generated, or set AGENT_HINTS_CLAUDE_CODE or AGENT_HINTS_TRACES"
    )


def _trace_calls(branch: str, steps: Sequence[TraceRequest | Fork]) -> list[ModelCall]:
    """The calls of one branch of a trace; a sub-agent's (no forks) end with its
    first answer, as a sub-agent answers once."""
    requests = [(i, s) for i, s in enumerate(steps) if isinstance(s, TraceRequest)]
    calls: list[ModelCall] = []
    for j, (i, request) in enumerate(requests):
        after = steps[i + 1] if i + 1 < len(steps) else None
        following = requests[j + 1][1] if j + 1 < len(requests) else None
        ends_turn = following is None or request.ends_turn
        tools: tuple[ToolUse, ...] = ()
        if not ends_turn and isinstance(after, Fork):
            tools = tuple(_task(agent) for agent in after.agents)
        elif not ends_turn and following is not None:
            tools = (ToolUse(f"{branch}-{j}", TRACE_TOOL, TRACE_TOOL, following.think_time),)
        prompt = len(request.hash_ids) * TRACE_BLOCK
        chain = calls[-1].chain if calls else 0
        user_waits = bool(calls) and calls[-1].ends_turn
        calls.append(
            ModelCall(
                message_id=f"{branch}-{j}",
                started=request.t,
                ended=request.t,
                prompt_tokens=prompt,
                output_tokens=max(request.out, 1),
                tools=tools,
                chain=chain + 1 if calls and prompt < calls[-1].prompt_tokens else chain,
                ends_turn=ends_turn,
                user_wait_s=request.think_time if user_waits else None,
            )
        )
        if ends_turn and branch != ROOT:
            break
    return calls


def _task(agent: SubAgent) -> ToolUse:
    calls = _trace_calls(agent.agent_id, agent.requests)
    branch = Branch(agent.agent_id, tuple(calls))
    return ToolUse(f"{TASK}-{agent.agent_id}", TASK, TASK, agent.duration_s, agent=branch)


def session_from_trace(trace: Trace) -> Session:
    """An anonymized trace in the session model.

    Each request is a model call of its 64-token blocks; one that does not end
    its turn calls one tool, ``tool``, that waits the next request's think time,
    or, before a fork, one ``Task`` per sub-agent; after a turn's end the think
    time is the user's. Hash ids are trace-local, so the session's model is its
    own id (no prefix shared with other sessions) and a sub-agent shares no
    system prefix (the traces' sub-agents share no block with their parent).
    Within a branch a prompt extends the previous one; a shorter one starts a
    new chain (as ``_claude_code`` reads compaction).
    """
    root = Branch(ROOT, tuple(_trace_calls(ROOT, trace.steps)))
    return Session(trace.trace_id, trace.trace_id, root)


def _candidates(source: SessionSource, seed: int, max_prompt_tokens: int) -> Iterator[Session]:
    if source.kind == "claude-code":
        return (read_session(p) for p in sorted(source.path.rglob("*.jsonl")))
    if source.kind == "traces":
        return (session_from_trace(load_trace(p)) for p in sorted(source.path.glob("*.json")))
    return generated_sessions(Figures.load(source.path), seed, max_prompt_tokens=max_prompt_tokens)


def select_sessions(
    candidates: Iterable[Session], k: int, max_prompt: int, n: int
) -> list[Session]:
    """The first ``n`` of ``candidates`` with at least one tool call whose every
    prompt fits ``max_prompt`` token ids at ``k``."""
    chosen: list[Session] = []
    for session in candidates:
        if len(chosen) == n:
            break
        mapper = PromptMapper(session, k)
        calls = list(replayed_calls(session))
        waits = any(not c.ends_turn for _, c in calls)
        if waits and max((mapper.blocks(c) * k for _, c in calls), default=0) <= max_prompt:
            chosen.append(session)
    return chosen


def load_sessions(
    source: SessionSource, k: int, max_prompt: int, n: int, seed: int = 0
) -> list[Session]:
    """The first ``n`` sessions of ``source`` that have a tool call and fit
    ``max_prompt`` token ids at ``k`` (by path; generated ones drawn to fit)."""
    max_prompt_tokens = max_prompt // k * TRACE_BLOCK
    candidates = _candidates(source, seed, max_prompt_tokens)
    if source.kind == "generated":
        candidates = itertools.islice(candidates, _DRAWS_PER_SESSION * max(n, 1))
    return select_sessions(candidates, k, max_prompt, n)


def load_history(
    source: SessionSource, replayed: Sequence[Session], n: int, seed: int = 0
) -> list[Session]:
    """The first ``n`` sessions of ``source`` that are not among ``replayed``
    (by id): the earlier sessions of the agent whose tool times it has learned."""
    if n <= 0:
        return []
    ids = {s.session_id for s in replayed}
    # Any size: the history is only read, never sent (generated ones: another seed).
    every = _candidates(source, seed + 1, max_prompt_tokens=sys.maxsize)
    fresh = (s for s in every if s.session_id not in ids)
    return list(itertools.islice(fresh, n))
