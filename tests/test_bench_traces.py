"""The replay benchmark's pure parts: trace parsing, token mapping, theoretical
reuse, sub-agent branches and past-only gap hints (against a stub transport)."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx2
import pytest

from benchmarks._ceiling import bounds
from benchmarks._replay import TRACE_TOOL, PastGaps, ReplaySettings, RequestRecord, replay
from benchmarks._traces import (
    FIRST_ID,
    ROOT,
    Fork,
    PrefixIndex,
    TokenMapper,
    Trace,
    TraceRequest,
    fits,
    parse_trace,
    request_prompts,
    select_traces,
    theoretical_cached,
    trace_requests,
    truncate,
)
from benchmarks.bound import Sent, main, predicted
from hints_spec import CONTROL_PATH, HEADER_NAME, USER_TOOL, parse_header
from server_ext.policy import Action, BranchKey, Decision, RetentionPolicy
from server_ext.testing import ManualClock


def _req(hash_ids: list[int], think: float = 0.0, t: float = 0.0, out: int = 64) -> dict[str, Any]:
    return {"type": "n", "t": t, "in": 64 * len(hash_ids), "out": out, "hash_ids": hash_ids,
            "think_time": think}  # fmt: skip


def _sub(agent_id: str, duration_s: float, requests: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "subagent", "t": 0.0, "agent_id": agent_id,
            "duration_ms": duration_s * 1000, "requests": requests}  # fmt: skip


# -- token mapping


def test_mapping_is_deterministic_and_avoids_special_ids() -> None:
    a = TokenMapper("trace_x", 4).prompt(range(500))
    b = TokenMapper("trace_x", 4).prompt(range(500))
    assert a == b
    assert len(a) == 2000
    assert min(a) >= FIRST_ID and max(a) < 2048


def test_mapping_preserves_prefix_sharing_exactly() -> None:
    m = TokenMapper("t", 4)
    x, y = m.prompt([1, 2, 3, 4]), m.prompt([1, 2, 3, 9])
    assert x[:12] == y[:12] and x[12:] != y[12:]
    assert m.prompt([7]) == list(m.block(7))
    # Hash ids are trace-local: another trace's id 1 is other tokens.
    assert TokenMapper("u", 4).prompt([1, 2]) != m.prompt([1, 2])
    with pytest.raises(ValueError):
        TokenMapper("t", 5)


# -- theoretical reuse


def test_theoretical_reuse_counts_whole_blocks_of_earlier_prompts() -> None:
    m = TokenMapper("t", 4)  # block_size 8 = 2 hash ids per block
    prompts = [
        m.prompt([1, 2, 3, 4, 5]),  # 20 tokens: blocks [1,2] [3,4] full; nothing before it
        m.prompt([1, 2, 3, 4, 6, 7]),  # 24 tokens: shares 2 full blocks
        m.prompt([1, 2, 3, 4, 6, 7]),  # identical: last token always computed -> 2 blocks
        m.prompt([1, 2, 9, 9]),  # diverges in block 1
        m.prompt([1, 3, 3, 4]),  # diverges in block 0
        m.prompt([1, 2, 3, 4, 6, 7, 8, 8, 1]),  # 3 blocks of prompt 2 (prompt 3 added none)
    ]
    assert theoretical_cached(prompts, 8) == [0, 16, 16, 8, 0, 24]
    index = PrefixIndex(8)
    for p in prompts:
        index.add(p)
    assert index.blocks == 2 + 1 + 1 + 2 + 1  # distinct full blocks


# -- parsing, sub-agents, truncation

_TRACE = {
    "id": "trace_demo",
    "requests": [
        _req([1, 2]),
        _req([1, 2, 3], think=2.0),
        _sub("agent_001", 5.0, [_req([50, 51], t=0.0), _req([50, 51, 52], think=1.0, t=1.5)]),
        _sub("agent_002", 8.0, [_req([50, 60], t=0.0)]),
        _req([1, 2, 3, 4], think=9.0),
    ],
}


def test_consecutive_subagents_become_one_parallel_fork() -> None:
    trace = parse_trace(_TRACE)
    kinds = [type(s).__name__ for s in trace.steps]
    assert kinds == ["TraceRequest", "TraceRequest", "Fork", "TraceRequest"]
    fork = trace.steps[2]
    assert isinstance(fork, Fork)
    assert [a.agent_id for a in fork.agents] == ["agent_001", "agent_002"]
    assert fork.duration_s == 8.0
    assert [b for b, _ in trace.branches()] == [ROOT, "agent_001", "agent_002"]
    assert trace.num_requests == 6
    order = [(b, r.hash_ids) for b, r in trace.ordered()]
    assert order[2:5] == [
        ("agent_001", (50, 51)),
        ("agent_002", (50, 60)),
        ("agent_001", (50, 51, 52)),
    ]


def test_truncate_keeps_the_prefix_that_fits_and_never_ends_on_a_fork() -> None:
    trace = parse_trace(_TRACE)
    assert truncate(trace, 4, 12).steps == trace.steps[:2]  # 4-id prompt = 16 tokens > 12
    assert [type(s) for s in truncate(trace, 4, 1000, max_requests=1).steps] == [TraceRequest]
    short = truncate(trace, 4, 8)  # only 2-id prompts fit; agent_001 keeps its first
    assert len(short.steps) == 1
    assert not fits(TraceRequest((1, 2, 3), 1, 0.0, 0.0), 4, 11)


def _stub(
    seen: list[tuple[float, dict[str, Any], str | None]],
    clock: ManualClock,
    events: list[tuple[float, dict[str, Any]]] | None = None,
) -> httpx2.MockTransport:
    """A completions endpoint that streams one token and usage, logging each
    request, and a control endpoint logging each event body into ``events``."""

    def handle(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        if request.url.path == CONTROL_PATH:
            assert events is not None, "no control events expected"
            events.append((clock.now, body))
            return httpx2.Response(200, json={"v": 1, "results": []})
        seen.append((clock.now, body, request.headers.get(HEADER_NAME)))
        chunks = [
            {"choices": [{"index": 0, "text": "x"}]},
            {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 1,
                                      "prompt_tokens_details": {"cached_tokens": 0}}},
        ]  # fmt: skip
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx2.Response(
            200, content=text.encode(), headers={"content-type": "text/event-stream"}
        )

    return httpx2.MockTransport(handle)


def _run(
    traces: list[Trace],
    events: list[tuple[float, dict[str, Any]]] | None = None,
    **settings: Any,
) -> tuple[list[RequestRecord], list[tuple[float, dict[str, Any], str | None]]]:
    """Replay against the stub on a fake clock: sleeping advances it exactly."""
    clock = ManualClock()
    seen: list[tuple[float, dict[str, Any], str | None]] = []

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)
        await asyncio.sleep(0)

    async def go() -> list[RequestRecord]:
        async with httpx2.AsyncClient(transport=_stub(seen, clock, events)) as client:
            s = ReplaySettings(base_url="http://stub", **settings)
            return await replay(traces, s, client, clock=clock, sleep=sleep)

    return asyncio.run(go()), seen


def test_subagents_replay_as_branches_and_the_parent_resumes_after_them() -> None:
    records, seen = _run([parse_trace(_TRACE)], hints=True, time_scale=1.0)
    assert not [r for r in records if r.error]
    hints = [parse_header(h or "") for _, _, h in seen]
    branches = [(h.br, h.pbr, h.end) for h in hints]
    assert branches[:2] == [(ROOT, None, False), (ROOT, None, False)]
    assert sorted(branches[2:5], key=str) == sorted(
        [("agent_001", ROOT, False), ("agent_002", ROOT, True), ("agent_001", ROOT, True)], key=str
    )
    # A sub-agent's last request says end (the SDK ends its branch); the root's does
    # not: the session's end is not known before it.
    assert branches[5] == (ROOT, None, False)
    assert {h.sid for h in hints} == {"trace_demo"}
    # The root resumed after both sub-agents (the longer took 1 s of waits) plus
    # its residual think: 9 s minus the 8 s the trace's fork lasted.
    fork_end = max(t for t, _, h in seen[2:5])
    assert seen[5][0] == pytest.approx(fork_end + 1.0)
    # Prompts: k ids per hash id, max_tokens = out/16 in [1, 32].
    assert [len(b["prompt"]) for _, b, _ in seen][:2] == [8, 12]
    assert {b["max_tokens"] for _, b, _ in seen} == {4}
    assert all(b["stream"] and b["stream_options"]["include_usage"] for _, b, _ in seen)
    assert [r.theoretical_cached for r in records][:2] == [0, 0]  # 12-token prompt: < 1 block


def test_each_record_names_the_prompt_it_sent_for_the_runs_ceiling() -> None:
    trace = parse_trace(_TRACE)
    records, seen = _run([trace], time_scale=1.0)
    prompts = request_prompts(trace_requests([trace]), k=4)
    assert len(prompts) == trace.num_requests == len(records)
    sent = [prompts[(r.trace_id, r.branch, r.seq)] for r in records]
    assert [len(p) for p in sent] == [r.prompt_tokens for r in records]
    assert sorted(sent) == sorted(body["prompt"] for _, body, _ in seen)
    mapper = TokenMapper("trace_demo", 4)
    assert [p for p, r in zip(sent, records, strict=True) if r.branch == ROOT] == [
        mapper.prompt(ids) for ids in ([1, 2], [1, 2, 3], [1, 2, 3, 4])
    ]


def test_gap_hint_uses_only_past_think_times() -> None:
    huge = 100_000.0
    trace = parse_trace(
        {
            "id": "trace_gap",
            "requests": [
                _req([1]),
                _req([1, 2], think=40.0),
                _req([1, 2, 3], think=60.0),
                _req([1, 2, 3, 4], think=huge),
                _req([1, 2, 3, 4, 5], think=20.0),
            ],
        }
    )
    records, seen = _run([trace], hints=True, time_scale=20.0, max_think_s=10_000.0)
    gaps = [parse_header(h or "").gap for _, _, h in seen]
    # Prior (10 s / 20), then the median of the gaps observed before sending.
    assert gaps == [0.5, 2.0, 2.5, 3.0, 2.5]
    # Request 2 is followed by the huge think: its hint knows only 2 s and 3 s.
    assert seen[3][0] - seen[2][0] == pytest.approx(huge / 20)
    before_huge = records[2].hint or ""
    assert "gap=2.5" in before_huge and "5000" not in before_huge
    # Once past, the 5000 s gap is one observation among others.
    assert gaps[3] == 3.0


def test_oracle_gaps_hint_the_true_next_wait() -> None:
    trace = parse_trace(
        {
            "id": "trace_oracle",
            "requests": [
                _req([1]),
                {**_req([1, 2], think=40.0), "stop": "end_turn"},
                _req([1, 2, 3], think=600.0),  # the user's reply
                _req([1, 2, 3, 4], think=20.0),
            ],
        }
    )
    events: list[tuple[float, dict[str, Any]]] = []
    _, seen = _run(
        [trace], events, hints=True, oracle_gaps=True, time_scale=20.0, max_think_s=10_000.0
    )
    gaps = [parse_header(h or "").gap for _, _, h in seen]
    # Each hint is the wait that follows (the last, which ends, keeps the estimate).
    assert gaps[:3] == [2.0, 30.0, 1.0]
    assert [body["events"][0]["eta"] for _, body in events] == [30.0]


def test_an_ended_turn_is_a_wait_on_the_user_learned_apart_from_tool_gaps() -> None:
    def turn_end(request: dict[str, Any]) -> dict[str, Any]:
        return {**request, "stop": "end_turn"}

    trace = parse_trace(
        {
            "id": "trace_user",
            "requests": [
                _req([1]),
                turn_end(_req([1, 2], think=20.0)),
                _req([1, 2, 3], think=400.0),  # the user took 400 s
                turn_end(_req([1, 2, 3, 4], think=40.0)),
                _req([1, 2, 3, 4, 5], think=200.0),
                turn_end(_req([1, 2, 3, 4, 5, 6], think=20.0)),  # the last: not an end
            ],
        }
    )
    assert [r.ends_turn for r in trace.steps if isinstance(r, TraceRequest)] == [
        False, True, False, True, False, True
    ]  # fmt: skip
    events: list[tuple[float, dict[str, Any]]] = []
    _, seen = _run([trace], events, hints=True, time_scale=20.0, max_think_s=10_000.0)
    # After each ended turn, the last too (the session's end is not known): tool_start
    # for the user, its eta the median of the session's earlier waits on its user (a
    # scaled minute at first).
    assert [body for _, body in events] == [
        {"sid": "trace_user", "events": [{"type": "tool_start", "br": ROOT, "tool": USER_TOOL,
                                          "eta": eta}]}
        for eta in (3.0, 20.0, 15.0)
    ]  # fmt: skip
    assert [t for t, _ in events] == [seen[1][0], seen[3][0], seen[5][0]]
    # The header's gap stays the median of tool gaps only (1, 2 and 1 s; never 20 or 10).
    gaps = [parse_header(h or "").gap for _, _, h in seen]
    assert gaps == [0.5, 1.0, 1.0, 1.5, 1.5, 1.0]
    # Plain configurations send no events.
    _run([trace], hints=False, time_scale=20.0)


def _tool_and_user_trace(trace_id: str) -> Trace:
    return parse_trace(
        {
            "id": trace_id,
            "requests": [
                _req([1]),
                {**_req([1, 2], think=20.0), "stop": "end_turn"},
                _req([1, 2, 3], think=400.0),
            ],
        }
    )


def _event_types(events: list[tuple[float, dict[str, Any]]]) -> list[tuple[str, str | None]]:
    return [(e["type"], e.get("tool")) for _, body in events for e in body["events"]]


def test_client_styles_header_only_user_waits_or_every_tool_wait() -> None:
    trace = _tool_and_user_trace("trace_styles")
    kinds = {}
    for control in ("none", "turns", "tools"):
        events: list[tuple[float, dict[str, Any]]] = []
        _, seen = _run([trace], events, hints=True, control=control, time_scale=20.0)
        assert all(h is not None for _, _, h in seen)  # every style sends the header
        kinds[control] = _event_types(events)
    assert kinds["none"] == []
    assert kinds["turns"] == [("tool_start", USER_TOOL)]
    # The SDK's way: tool_start with the tool's eta after a tool-use response, tool_end
    # when the tool returns (just before the next request); the user wait as before.
    # The last response ends in a tool call too: nothing follows it, as in a session
    # that stops while its tool runs.
    assert kinds["tools"] == [
        ("tool_start", TRACE_TOOL), ("tool_end", None), ("tool_start", USER_TOOL),
        ("tool_start", TRACE_TOOL),
    ]  # fmt: skip


def test_unhinted_sessions_send_nothing_beside_hinted_ones() -> None:
    traces = [_tool_and_user_trace("trace_a"), _tool_and_user_trace("trace_b")]
    events: list[tuple[float, dict[str, Any]]] = []
    records, seen = _run(
        traces, events, hints=True, control="tools", unhinted=frozenset({"trace_b"})
    )
    assert {r.trace_id for r in records if r.hint is not None} == {"trace_a"}
    assert {r.trace_id for r in records if r.hint is None} == {"trace_b"}
    assert {body["sid"] for _, body in events} == {"trace_a"}
    assert sum(h is None for _, _, h in seen) == 3


def test_plain_configs_send_no_hints_and_waits_are_capped() -> None:
    trace = parse_trace({"id": "t", "requests": [_req([1]), _req([1, 2], think=1e6)]})
    records, seen = _run([trace], hints=False, time_scale=10.0, max_think_s=3.0)
    assert [h for _, _, h in seen] == [None, None]
    assert seen[1][0] == pytest.approx(3.0)
    assert [r.hint for r in records] == [None, None]


def test_past_gaps_median() -> None:
    gaps = PastGaps(prior_s=0.5)
    assert gaps.estimate() == 0.5
    for g in (1.0, 9.0, 2.0):
        gaps.observe(g)
    assert gaps.estimate() == 2.0


# -- the real development traces


def test_default_selection_fits_and_is_deterministic(traces_dir: Path) -> None:
    first = select_traces(traces_dir, 4, 8192 - 32)
    again = select_traces(traces_dir, 4, 8192 - 32)
    assert [t.trace_id for t in first] == [t.trace_id for t in again]
    assert len(first) == 8
    assert all(fits(r, 4, 8192 - 32) for t in first for _, r in t.ordered())
    assert any(isinstance(s, Fork) for t in first for s in t.steps)  # sub-agents included


def test_tenant_per_trace_sends_one_api_key_per_session() -> None:
    keys: list[str | None] = []
    inner = _stub([], ManualClock())

    def handle(request: httpx2.Request) -> httpx2.Response:
        keys.append(request.headers.get("authorization"))
        return inner.handle_request(request)

    async def go() -> None:
        async with httpx2.AsyncClient(transport=httpx2.MockTransport(handle)) as client:
            traces = [parse_trace({"id": i, "requests": [_req([1])]}) for i in ("a", "b")]
            s = ReplaySettings(base_url="http://stub", tenant_per_trace=True)
            await replay(traces, s, client)

    asyncio.run(go())
    assert sorted(k or "" for k in keys) == ["Bearer a", "Bearer b"]


def test_on_done_reports_every_request_once_failed_or_not() -> None:
    done: list[RequestRecord] = []
    inner = _stub([], ManualClock())

    def handle(request: httpx2.Request) -> httpx2.Response:
        if json.loads(request.content)["prompt"][0] % 2:  # some requests fail
            return httpx2.Response(500, content=b"boom")
        return inner.handle_request(request)

    async def go() -> list[RequestRecord]:
        async with httpx2.AsyncClient(transport=httpx2.MockTransport(handle)) as client:
            traces = [parse_trace({"id": i, "requests": [_req([1]), _req([1, 2])]}) for i in "abc"]
            s = ReplaySettings(base_url="http://stub")
            return await replay(traces, s, client, on_done=done.append)

    records = asyncio.run(go())
    assert len(done) == len(records) == 6
    assert {id(r) for r in done} == {id(r) for r in records}
    assert all(r.latency_s is not None or r.error is not None for r in done)
    assert any(r.error for r in done) and any(r.error is None for r in done)


def test_offline_bounds_belady_beats_lru_on_a_cyclic_order() -> None:
    # Three one-block prefixes (plus a computed tail token) in a cycle, room for two:
    # LRU always evicts the one needed next; Belady keeps two of them resident.
    a, b, c = ([i] * 4 + [99] for i in (1, 2, 3))
    lru, belady = bounds([a, b, c, a, b, c, a, b, c], block_size=4, capacity=2)
    assert lru == 0
    assert belady == 4 * 4  # a and b stay; c is never kept
    assert bounds([a, a, a], block_size=4, capacity=1) == (8, 8)


def test_offline_bounds_evict_a_chain_from_its_end() -> None:
    # One prompt of three blocks in a cache of two: vLLM frees a request's blocks
    # tail first, and Belady keeps a parent over a child used as soon: either way
    # the prefix stays, and the prompt's return hits its first two blocks.
    prompt = [1] * 4 + [2] * 4 + [3] * 4 + [99]
    assert bounds([prompt, prompt], block_size=4, capacity=2) == (8, 8)


def test_offline_predicted_eviction_sees_events_in_time_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[float] = []

    class Recording(RetentionPolicy):
        def on_request_started(self, key: BranchKey, now: float | None = None) -> list[Action]:
            seen.append(now or 0.0)
            return super().on_request_started(key, now)

        def on_request_finished(self, *args: Any, **kwargs: Any) -> Decision:
            seen.append(kwargs["now"])
            return super().on_request_finished(*args, **kwargs)

    monkeypatch.setattr("benchmarks.bound.RetentionPolicy", Recording)
    long, short = [1] * 4 + [99], [2] * 4 + [99]
    # The first request's response ends after the second was sent and done.
    predicted([Sent(long, "a", "root", 0.0, 5.0), Sent(short, "b", "root", 1.0, 2.0)], 4, 2)
    assert seen == [0.0, 1.0, 2.0, 5.0]


def test_offline_predicted_eviction_keeps_the_branches_due_back_first() -> None:
    # The same cycle, one second apart, each branch hinting its true gap (it
    # leaves 0.5 s after it is sent and is back 2.5 s later): the retention
    # policy releases the branch that just left, due back last, as Belady would.
    cycle = [([i] * 4 + [99], f"s{i}") for i in (1, 2, 3)] * 3
    sent = [
        Sent(prompt, sid, "root", float(t), t + 0.5, gap=2.5)
        for t, (prompt, sid) in enumerate(cycle)
    ]
    assert predicted(sent, block_size=4, capacity=2) == 4 * 4
    assert bounds([x.prompt for x in sent], block_size=4, capacity=2) == (0, 4 * 4)


def test_bound_cli_reads_a_saved_run(
    traces_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = {"traces": str(traces_dir), "trace_ids": None, "n_traces": 2, "scale_k": 4,
            "max_model_len": 8192, "max_out": 32, "kv_blocks": 64, "block_size": 64}  # fmt: skip
    prompts, keys = [], []
    for trace in select_traces(traces_dir, 4, 8192 - 32, n_traces=2):
        mapper, seq = TokenMapper(trace.trace_id, 4), defaultdict[str, int](int)
        for branch, request in trace.ordered():
            prompts.append(mapper.prompt(request.hash_ids))
            keys.append((trace.trace_id, branch, seq[branch]))
            seq[branch] += 1
    cached = theoretical_cached(prompts, 64)
    records = [
        {"trace_id": t, "branch": br, "seq": n, "sent_at": float(i), "latency_s": 0.5,
         "cached_tokens": c, "theoretical_cached": c, "hint": f'v=1, sid="{t}", gap=0.5'}
        for i, ((t, br, n), c) in enumerate(zip(keys, cached, strict=True))
    ]  # fmt: skip
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"args": args, "configs": {"retention": {"records": records}}}))

    def row(*extra: str) -> list[float]:
        assert main([str(run), *extra]) == 0
        line = capsys.readouterr().out.splitlines()[1].split()
        assert line[0] == "retention"
        return [float(x.rstrip("%")) for x in line[1:]]

    # Room for everything: every policy reuses all that an earlier prompt held.
    assert row("--blocks", "100000") == [100.0] * 4
    # 64 blocks (the run's own): no policy beats perfect knowledge.
    reuse, lru, hinted, belady = row()
    assert reuse == 100.0 and 0 < lru <= belady < 100 and 0 < hinted <= belady
