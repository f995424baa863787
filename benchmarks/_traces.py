"""Real agentic traces (../shared/traces, "Weka" format) mapped to small token prompts.

A trace gives no text, only one hash id per 64 input tokens; two requests share a
prefix exactly as far as their hash ids agree. Mapping each hash id to ``k``
deterministic token ids keeps that sharing exact at ``k/64`` scale, so the best
possible prefix-cache reuse of a replay is computable from the prompts alone
(``theoretical_cached``) and every run is measured against it.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hints_spec.core import ROOT_BRANCH as ROOT

__all__ = [
    "FIRST_ID",
    "ROOT",
    "TRACE_BLOCK",
    "Fork",
    "PrefixIndex",
    "RequestKey",
    "SubAgent",
    "TokenMapper",
    "Trace",
    "TraceRequest",
    "default_traces_dir",
    "fits",
    "load_trace",
    "parse_trace",
    "request_prompts",
    "run_requests",
    "select_traces",
    "theoretical_cached",
    "trace_info",
    "trace_requests",
    "truncate",
    "unlimited_blocks",
]

TRACE_BLOCK = 64
"""Input tokens behind one trace hash id."""

FIRST_ID = 8
"""Mapped token ids start here, so special tokens (ids 0..4 in the test model) never occur."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One LLM call of a branch.

    Args:
        hash_ids: One id per 64 input tokens; the prompt.
        out: Output tokens of the real call.
        think_time: Client-side delay before this call (tool run or human), s.
        t: Start time, s from the start of its branch (orders parallel branches).
        ends_turn: The response ended the agent's turn (``stop`` is
            ``end_turn``, not ``tool_use``): the next call waits on the user.
    """

    hash_ids: tuple[int, ...]
    out: int
    think_time: float
    t: float
    ends_turn: bool = False


@dataclass(frozen=True, slots=True)
class SubAgent:
    """A sub-agent: its own branch, forked from the root conversation."""

    agent_id: str
    duration_s: float
    requests: tuple[TraceRequest, ...]


@dataclass(frozen=True, slots=True)
class Fork:
    """Consecutive sub-agent entries: they start together (in the traces they
    all begin right after the parent's previous response) and the parent
    resumes when the last one finishes."""

    agents: tuple[SubAgent, ...]

    @property
    def duration_s(self) -> float:
        return max(a.duration_s for a in self.agents)


Step = TraceRequest | Fork


@dataclass(frozen=True, slots=True)
class Trace:
    """A session: the root conversation's steps, requests and forks in order."""

    trace_id: str
    steps: tuple[Step, ...]

    def branches(self) -> Iterator[tuple[str, tuple[TraceRequest, ...]]]:
        """(branch name, its requests) for the root and every sub-agent."""
        yield ROOT, tuple(s for s in self.steps if isinstance(s, TraceRequest))
        for step in self.steps:
            if isinstance(step, Fork):
                for agent in step.agents:
                    yield agent.agent_id, agent.requests

    def ordered(self) -> Iterator[tuple[str, TraceRequest]]:
        """Every request in a canonical issue order: root steps in order, a
        fork's sub-agent requests merged by their start times."""
        for step in self.steps:
            if isinstance(step, TraceRequest):
                yield ROOT, step
                continue
            merged = heapq.merge(
                *(
                    [(r.t, i, j, a.agent_id, r) for j, r in enumerate(a.requests)]
                    for i, a in enumerate(step.agents)
                )
            )
            for _, _, _, agent_id, request in merged:
                yield agent_id, request

    @property
    def num_requests(self) -> int:
        return sum(len(reqs) for _, reqs in self.branches())


def _request(raw: Mapping[str, Any]) -> TraceRequest:
    return TraceRequest(
        hash_ids=tuple(int(h) for h in raw["hash_ids"]),
        out=int(raw.get("out") or 0),
        think_time=float(raw.get("think_time") or 0.0),
        t=float(raw.get("t") or 0.0),
        ends_turn=raw.get("stop") == "end_turn",
    )


def parse_trace(data: Mapping[str, Any]) -> Trace:
    """A ``Trace`` from one trace file's JSON object."""
    steps: list[Step] = []
    group: list[SubAgent] = []
    for raw in data["requests"]:
        if raw.get("type") == "subagent":
            group.append(
                SubAgent(
                    agent_id=str(raw["agent_id"]),
                    duration_s=float(raw.get("duration_ms") or 0.0) / 1000.0,
                    requests=tuple(_request(r) for r in raw["requests"]),
                )
            )
            continue
        if group:
            steps.append(Fork(tuple(group)))
            group = []
        steps.append(_request(raw))
    if group:
        steps.append(Fork(tuple(group)))
    return Trace(trace_id=str(data["id"]), steps=tuple(steps))


def load_trace(path: Path) -> Trace:
    with path.open() as f:
        return parse_trace(json.load(f))


def default_traces_dir(repo_root: Path) -> Path:
    """``$AGENT_HINTS_TRACES``, else ``../shared/traces`` beside the repository."""
    env = os.environ.get("AGENT_HINTS_TRACES")
    return Path(env) if env else repo_root.parent / "shared" / "traces"


def fits(request: TraceRequest, k: int, max_prompt: int) -> bool:
    return len(request.hash_ids) * k <= max_prompt


def truncate(trace: Trace, k: int, max_prompt: int, max_requests: int | None = None) -> Trace:
    """The longest prefix of ``trace`` that replays at ``k`` tokens per hash id.

    The root keeps its steps up to the first request whose prompt exceeds
    ``max_prompt`` tokens (or past ``max_requests`` root requests); each
    sub-agent likewise. A trace never ends on a fork, so the root's last
    request (which ends the session) comes after all its sub-agents.
    """
    limit = max_requests if max_requests is not None else len(trace.steps)
    steps: list[Step] = []
    roots = 0
    for step in trace.steps:
        if isinstance(step, TraceRequest):
            if roots >= limit or not fits(step, k, max_prompt):
                break
            steps.append(step)
            roots += 1
            continue
        agents = []
        for agent in step.agents:
            kept: list[TraceRequest] = []
            for request in agent.requests[:limit]:
                if not fits(request, k, max_prompt):
                    break
                kept.append(request)
            if kept:
                agents.append(SubAgent(agent.agent_id, agent.duration_s, tuple(kept)))
        if agents:
            steps.append(Fork(tuple(agents)))
    while steps and isinstance(steps[-1], Fork):
        steps.pop()
    return Trace(trace.trace_id, tuple(steps))


def select_traces(
    directory: Path,
    k: int,
    max_prompt: int,
    *,
    trace_ids: Sequence[str] | None = None,
    n_traces: int = 8,
    max_requests: int | None = None,
) -> list[Trace]:
    """The traces of a run.

    Named ``trace_ids`` are truncated to their prefix that fits. Otherwise the
    first ``n_traces`` traces by id whose every prompt fits whole (the default
    "development traces": no truncation changes their shape) are taken.
    """
    if trace_ids:
        traces = [load_trace(directory / f"{tid}.json") for tid in trace_ids]
    else:
        traces = []
        for path in sorted(directory.glob("*.json")):
            trace = load_trace(path)
            if all(fits(r, k, max_prompt) for _, r in trace.ordered()):
                traces.append(trace)
            if len(traces) == n_traces:
                break
    selected = [truncate(t, k, max_prompt, max_requests) for t in traces]
    return [t for t in selected if t.steps]


RequestKey = tuple[str, str, int]
"""(trace id, branch, n-th request of the branch): how a run's records name requests."""


def run_requests(args: Mapping[str, Any], directory: Path) -> dict[RequestKey, TraceRequest]:
    """The trace requests a saved run replayed, from its header's ``args``."""
    trace_ids = args.get("trace_ids")
    traces = select_traces(
        directory,
        args["scale_k"],
        args["max_model_len"] - args["max_out"],
        trace_ids=trace_ids.split(",") if trace_ids else None,
        n_traces=args["n_traces"],
        max_requests=args.get("max_requests_per_trace"),
    )
    return trace_requests(traces)


def trace_requests(traces: Iterable[Trace]) -> dict[RequestKey, TraceRequest]:
    """Every request of ``traces``, by the key its record carries."""
    return {
        (trace.trace_id, branch, n): request
        for trace in traces
        for branch, requests in trace.branches()
        for n, request in enumerate(requests)
    }


def request_prompts(
    requests: Mapping[RequestKey, TraceRequest], k: int, vocab_size: int = 2048
) -> dict[RequestKey, list[int]]:
    """The token-id prompt of each request, as the replay sends it."""
    mappers: dict[str, TokenMapper] = {}
    prompts: dict[RequestKey, list[int]] = {}
    for key, request in requests.items():
        trace_id = key[0]
        if trace_id not in mappers:
            mappers[trace_id] = TokenMapper(trace_id, k, vocab_size)
        prompts[key] = mappers[trace_id].prompt(request.hash_ids)
    return prompts


class TokenMapper:
    """Hash ids of one trace -> token ids, ``k`` per hash id.

    Token ``i`` of hash id ``h`` is ``blake2b(trace_id, h, i) mod (vocab - 8) + 8``:
    deterministic across runs and machines, never a special token, and distinct
    traces never share a prefix by accident (their hash ids are trace-local).
    """

    def __init__(self, trace_id: str, k: int, vocab_size: int = 2048) -> None:
        if k < 1 or TRACE_BLOCK % k:
            raise ValueError("k must divide 64")
        self.trace_id = trace_id
        self.k = k
        self._span = vocab_size - FIRST_ID
        self._cache: dict[int, tuple[int, ...]] = {}

    def block(self, h: int) -> tuple[int, ...]:
        ids = self._cache.get(h)
        if ids is None:
            ids = tuple(self._token(h, i) for i in range(self.k))
            self._cache[h] = ids
        return ids

    def _token(self, h: int, i: int) -> int:
        digest = hashlib.blake2b(f"{self.trace_id}\0{h}\0{i}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % self._span + FIRST_ID

    def prompt(self, hash_ids: Iterable[int]) -> list[int]:
        return [t for h in hash_ids for t in self.block(h)]


class PrefixIndex:
    """The prompts issued so far, as a trie of full ``block_size`` blocks.

    ``add`` returns the most tokens of a new prompt that a prefix cache could
    serve: its longest prefix, in whole blocks, that some earlier prompt also
    had in full blocks, capped like vLLM's so that the last prompt token is
    always computed (at most ``(len - 1) // block_size`` blocks).
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._nodes: dict[tuple[int, tuple[int, ...]], int] = {}

    def add(self, prompt: Sequence[int]) -> int:
        _, known = self.chain(prompt)
        return min(known, (len(prompt) - 1) // self.block_size) * self.block_size

    def chain(self, prompt: Sequence[int]) -> tuple[list[int], int]:
        """Ids of the prompt's full blocks (equal ids = equal prefixes), adding
        new ones, and how many leading ones an earlier prompt already had."""
        size = self.block_size
        ids: list[int] = []
        known = 0
        parent = -1
        for j in range(len(prompt) // size):
            key = (parent, tuple(prompt[j * size : (j + 1) * size]))
            node = self._nodes.get(key)
            if node is None:
                node = self._nodes[key] = len(self._nodes)
            elif known == j:
                known += 1
            ids.append(node)
            parent = node
        return ids, known

    @property
    def blocks(self) -> int:
        """Distinct full blocks seen: the KV capacity that would keep them all."""
        return len(self._nodes)


def theoretical_cached(prompts: Iterable[Sequence[int]], block_size: int) -> list[int]:
    """``PrefixIndex.add`` of each prompt, in issue order."""
    index = PrefixIndex(block_size)
    return [index.add(p) for p in prompts]


def trace_info(
    traces: Sequence[Trace], k: int, block_size: int
) -> tuple[list[dict[str, Any]], int]:
    """Per-trace facts (id, requests, branches, prompt and theoretical cached
    tokens at ``k`` ids per hash id), and the distinct prompt blocks of them all."""
    index = PrefixIndex(block_size)
    info = []
    for trace in traces:
        mapper = TokenMapper(trace.trace_id, k)
        prompt = cached = 0
        for _, request in trace.ordered():
            tokens = mapper.prompt(request.hash_ids)
            prompt += len(tokens)
            cached += index.add(tokens)
        info.append(
            {
                "id": trace.trace_id,
                "requests": trace.num_requests,
                "branches": sum(1 for _ in trace.branches()),
                "prompt_tokens": prompt,
                "theoretical_cached_tokens": cached,
            }
        )
    return info, index.blocks


def unlimited_blocks(
    info: Sequence[Mapping[str, Any]],
    distinct_blocks: int,
    kv_blocks: int,
    max_model_len: int,
    block_size: int,
) -> int:
    """KV blocks with which nothing is ever evicted: every distinct prompt block,
    one decode block per request, and room for one full-length running request
    per session (at least ``kv_blocks``)."""
    per_request = math.ceil(max_model_len / block_size)
    requests = sum(int(i["requests"]) for i in info)
    return max(kv_blocks, distinct_blocks + requests + len(info) * per_request)
