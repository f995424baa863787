"""The agent replay's sessions: where they come from, the anonymized traces in the
session model, and the generated sessions drawn from the committed figures (their
statistics, determinism, limits, and the measurement that writes the figures)."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path
from typing import Any

import pytest
from claude_code_transcripts import coding_session, session_with_sub_agent

from benchmarks import workload_figures
from benchmarks._claude_code import TASK, Session, replayed_calls
from benchmarks._sessions import find_source, load_history, load_sessions, session_from_trace
from benchmarks._synthetic import (
    FIGURES_PATH,
    QUANTILE_POINTS,
    Counts,
    Figures,
    Quantiles,
    generated_sessions,
    measure,
)
from benchmarks._traces import ROOT, parse_trace

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def _req(hash_ids: list[int], think: float = 0.0, out: int = 64, stop: str = "tool_use") -> Any:
    return {"type": "n", "t": 0.0, "in": 64 * len(hash_ids), "out": out, "hash_ids": hash_ids,
            "think_time": think, "stop": stop}  # fmt: skip


_TRACE = {
    "id": "trace_demo",
    "requests": [
        _req([1, 2]),
        _req([1, 2, 3], think=2.0),
        {"type": "subagent", "t": 0.0, "agent_id": "agent_001", "duration_ms": 5000.0,
         "requests": [_req([50, 51]), _req([50, 51, 52], think=1.0, stop="end_turn"),
                      _req([50, 51, 52, 53], think=1.0)]},
        {"type": "subagent", "t": 0.0, "agent_id": "agent_002", "duration_ms": 8000.0,
         "requests": [_req([60], stop="end_turn")]},
        _req([1, 2, 3, 4], think=9.0, stop="end_turn"),
        _req([1, 2, 3, 4, 5], think=120.0),
        _req([7, 8], think=3.0, out=0, stop="end_turn"),
    ],
}  # fmt: skip


def test_a_trace_becomes_a_session_with_one_tool_per_wait_tasks_and_user_turns() -> None:
    session = session_from_trace(parse_trace(_TRACE))
    calls = session.root.calls
    assert session.session_id == session.model == "trace_demo"  # no prefix shared across traces
    assert [c.prompt_tokens for c in calls] == [128, 192, 256, 320, 128]
    assert [(u.kind, u.duration_s) for u in calls[0].tools] == [("tool", 2.0)]
    # Before the fork: one Task per sub-agent, each its own branch ending with its answer.
    assert [u.kind for u in calls[1].tools] == [TASK, TASK]
    agents = [u.agent for u in calls[1].tools]
    assert [len(a.calls) for a in agents if a is not None] == [2, 1]
    assert all(a is not None and a.system_tokens == 0 for a in agents)
    assert calls[2].ends_turn and not calls[2].tools
    assert calls[3].user_wait_s == 120.0 and calls[2].user_wait_s is None
    assert [u.duration_s for u in calls[3].tools] == [3.0]
    # A shorter prompt starts a new chain (compaction); an empty output counts 1 token.
    assert [c.chain for c in calls] == [0, 0, 0, 0, 1] and calls[4].output_tokens == 1
    assert calls[4].ends_turn and [len(t) for t in session.root.turns()] == [3, 2]
    assert [b.name for b in session.branches()] == [ROOT, "agent_001", "agent_002"]


def test_the_source_is_the_argument_then_transcripts_then_traces_then_generated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENT_HINTS_CLAUDE_CODE", raising=False)
    monkeypatch.delenv("AGENT_HINTS_TRACES", raising=False)
    repo = tmp_path / "clone"
    repo.mkdir()
    with pytest.raises(FileNotFoundError, match="--claude-code DIR"):
        find_source(repo)
    assert find_source(repo, fallback=True).kind == "generated"
    assert find_source(repo, fallback=True).path == FIGURES_PATH
    shared_traces = tmp_path / "shared" / "traces"
    shared_traces.mkdir(parents=True)
    assert find_source(repo, fallback=True).kind == "traces"
    shared_cc = tmp_path / "shared" / "traces-claude-code"
    shared_cc.mkdir()
    assert find_source(repo).path == shared_cc  # transcripts name the tools: they go first
    mine = tmp_path / "mine"
    mine.mkdir()
    monkeypatch.setenv("AGENT_HINTS_TRACES", str(mine))
    assert find_source(repo).path == shared_cc
    monkeypatch.setenv("AGENT_HINTS_CLAUDE_CODE", str(mine))
    assert find_source(repo).path == mine
    assert find_source(repo, traces=shared_traces).kind == "traces"
    assert find_source(repo, generated=True).kind == "generated"
    with pytest.raises(FileNotFoundError, match="--traces: directory"):
        find_source(repo, traces=tmp_path / "nowhere")
    monkeypatch.setenv("AGENT_HINTS_CLAUDE_CODE", str(tmp_path / "gone"))
    with pytest.raises(FileNotFoundError, match="AGENT_HINTS_CLAUDE_CODE"):
        find_source(repo, fallback=True)  # a variable set wrong is an error, not a fallback


def test_quantiles_draw_within_what_was_measured_and_reproduce_its_spread() -> None:
    rng = random.Random(7)
    samples = [rng.lognormvariate(0.0, 1.5) for _ in range(5000)]
    q = Quantiles.of(samples, ["test"], 6)
    assert len(q.values) == QUANTILE_POINTS and q.n == 5000
    assert q.values[0] == round(min(samples), 6) and q.values[-1] == round(max(samples), 6)
    draws = [q.draw(rng) for _ in range(20000)]
    assert min(draws) >= q.values[0] and max(draws) <= q.values[-1]
    assert statistics.median(draws) == pytest.approx(statistics.median(samples), rel=0.1)
    p90 = statistics.quantiles(draws, n=10)[-1]
    assert p90 == pytest.approx(statistics.quantiles(samples, n=10)[-1], rel=0.1)
    assert Quantiles.from_json(q.to_json()) == q
    with pytest.raises(ValueError, match="ascending"):
        Quantiles.from_json({**q.to_json(), "quantiles": list(reversed(q.values))})
    with pytest.raises(ValueError, match="no samples"):
        Quantiles.of([], ["test"], 0)
    counts = Counts.of(["a", "b", "a", 1], ["test"])
    assert counts.counts == {"a": 2, "1": 1, "b": 1} and counts.n == 4
    picks = [counts.draw(rng) for _ in range(4000)]
    assert picks.count("a") / len(picks) == pytest.approx(0.5, abs=0.05)


def test_the_committed_figures_load_and_say_where_they_come_from() -> None:
    figures = Figures.load()
    sets = figures.provenance["sets"]
    assert set(sets) == {"claude-code", "traces"}
    assert all(s["sessions"] > 0 for s in sets.values())
    assert figures.provenance["created"] and figures.provenance["written_by"]
    assert figures.turns.measured_on == ("traces",)  # the transcripts are headless: 1 turn
    assert figures.tool_kinds.measured_on == ("claude-code",)  # the traces name no tools
    assert set(figures.tool_kinds.counts) <= set(figures.tool_wait_s)
    assert TASK not in figures.tool_kinds.counts  # sub-agents are drawn apart


def test_a_file_of_another_shape_is_refused_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "figures.json"
    bad.write_text(json.dumps({"figures": {}}))
    with pytest.raises(ValueError, match=r"figures\.json: not a workload figures file"):
        Figures.load(bad)
    data = Figures.load().to_json()
    data["figures"]["tool_kinds"]["counts"]["Nowhere"] = 3
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="tool kinds without waits: Nowhere"):
        Figures.load(bad)


def _first(n: int, seed: int = 0, **kw: Any) -> list[Session]:
    sessions = generated_sessions(Figures.load(), seed, **kw)
    return [next(sessions) for _ in range(n)]


def test_generated_sessions_are_seeded_and_well_formed() -> None:
    sessions = _first(60)
    assert sessions == _first(60)  # the same on any machine
    assert sessions[:5] != _first(5, seed=1)
    forked = 0
    for s in sessions:
        assert s.model == "generated" and s.root.calls[-1].ends_turn
        ids = [u.call_id for b in s.branches() for c in b.calls for u in c.tools]
        assert len(ids) == len(set(ids))
        assert len({b.name for b in s.branches()}) == sum(1 for _ in s.branches())
        for i, turn in enumerate(s.root.turns()):
            assert (turn[0].user_wait_s is not None) == (i > 0)
            assert all(c.user_wait_s is None for c in turn[1:])
        for branch in s.branches():
            prompts = [c.prompt_tokens for c in branch.calls]
            assert prompts == sorted(prompts) and branch.system_tokens <= prompts[0]
            assert all(c.tools or c.ends_turn for c in branch.calls)
            if branch.name != ROOT:
                forked += 1
                assert branch.calls[-1].ends_turn and len(branch.turns()) == 1
                assert all(u.name != TASK for c in branch.calls for u in c.tools)
        for call in s.root.calls:
            tasks = [u for u in call.tools if u.name == TASK]
            assert all(u.agent is not None for u in tasks)
            assert not tasks or len(tasks) == len(call.tools)
    assert forked > 0  # 60 sessions draw some sub-agents (about 1 in 90 tool-calling calls)


def test_generated_sessions_reproduce_the_measured_figures() -> None:
    figures = Figures.load()
    sessions = _first(400)
    again = measure(sessions, sessions, figures.provenance)
    for name in ("calls_per_turn", "growth_tokens", "output_tokens", "user_wait_s"):
        measured, drawn = getattr(figures, name).values, getattr(again, name).values
        assert drawn[10] == pytest.approx(measured[10], rel=0.15), name  # the median
        assert drawn[18] == pytest.approx(measured[18], rel=0.3), name  # the 90th percentile
    share = {k: v / figures.tool_kinds.n for k, v in figures.tool_kinds.counts.items()}
    drawn_share = {k: v / again.tool_kinds.n for k, v in again.tool_kinds.counts.items()}
    assert drawn_share["Read"] == pytest.approx(share["Read"], abs=0.03)
    assert drawn_share["Bash-test"] == pytest.approx(share["Bash-test"], abs=0.03)
    test_waits = again.tool_wait_s["Bash-test"].values[10]
    assert test_waits == pytest.approx(figures.tool_wait_s["Bash-test"].values[10], rel=0.15)
    turns = statistics.mean(len(s.root.turns()) for s in sessions)
    expected = sum(int(k) * v for k, v in figures.turns.counts.items()) / figures.turns.n
    assert turns == pytest.approx(expected, rel=0.15)


def test_a_prompt_limit_ends_the_branch_as_its_turns_answer() -> None:
    sessions = _first(40, max_prompt_tokens=24_000)
    assert max(c.prompt_tokens for s in sessions for b in s.branches() for c in b.calls) <= 24_000
    unbounded = _first(40)
    assert max(c.prompt_tokens for s in unbounded for c in s.root.calls) > 24_000
    assert all(s.root.calls[-1].ends_turn for s in sessions)


def test_load_sessions_takes_the_first_that_call_a_tool_and_fit() -> None:
    source = find_source(REPO, generated=True)
    sessions = load_sessions(source, k=4, max_prompt=2000, n=6, seed=3)
    assert len(sessions) == 6
    for s in sessions:
        calls = list(replayed_calls(s))
        assert any(not c.ends_turn for _, c in calls)
        assert all(-(-c.prompt_tokens // 64) * 4 <= 2000 for _, c in calls)


def test_the_history_is_the_sources_other_sessions(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        coding_session().write(tmp_path / f"{name}.jsonl")
    source = find_source(REPO, claude_code=tmp_path)
    replayed = load_sessions(source, k=4, max_prompt=2000, n=1)
    history = load_history(source, replayed, 5)
    assert [s.session_id for s in replayed + history] == ["a", "b", "c"]
    assert load_history(source, replayed, 1) == history[:1]
    assert load_history(source, replayed, 0) == []


def test_the_measurement_writes_figures_the_generator_reads(tmp_path: Path) -> None:
    transcripts = tmp_path / "cc"
    coding_session().write(transcripts / "a.jsonl")
    session_with_sub_agent().write(transcripts / "b.jsonl")
    coding_session().write(transcripts / "skip__c.jsonl")
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "trace_demo.json").write_text(json.dumps(_TRACE))
    out = tmp_path / "figures.json"
    argv = ["--claude-code", str(transcripts), "--traces", str(traces), "--out", str(out)]
    assert workload_figures.main([*argv, "--exclude", "skip__*"]) == 0
    figures = Figures.load(out)
    sets = figures.provenance["sets"]
    assert sets["claude-code"]["sessions"] == 2 and sets["claude-code"]["left_out"]["sessions"] == 1
    assert sets["traces"]["sessions"] == 1
    kinds = {"Bash-test": 3, "Read": 3, "Bash-git": 1, "Glob": 1, "Grep": 1, "Write": 1}
    assert figures.tool_kinds.counts == kinds  # the sub-agent's tools count too
    assert figures.sub_agents_per_call.counts == {"0": 9, "1": 1, "2": 1}
    assert figures.turns.counts == {"2": 1}
    assert figures.user_wait_s.values[0] == 120.0
    session = next(generated_sessions(figures, max_prompt_tokens=5000))
    assert session.root.calls[-1].ends_turn


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"the measured sets are not at {SHARED}")
def test_the_committed_figures_are_those_of_the_sets_beside_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENT_HINTS_CLAUDE_CODE", raising=False)
    monkeypatch.delenv("AGENT_HINTS_TRACES", raising=False)
    out = tmp_path / "figures.json"
    assert workload_figures.main(["--out", str(out)]) == 0
    fresh, committed = json.loads(out.read_text()), json.loads(FIGURES_PATH.read_text())
    assert fresh["figures"] == committed["figures"], "re-run python -m benchmarks.workload_figures"
