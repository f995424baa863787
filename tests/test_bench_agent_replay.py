"""The agent replay: recorded sessions through the SDK's own loop.

Against an OpenAI-compatible fake in a MockTransport (every request and control event
recorded) for the exact shape of the traffic; then ``python -m benchmarks.agent_replay``
end to end on two hand-written sessions against real CPU servers, plain and hinted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
from claude_code_transcripts import coding_session, session_with_sub_agent
from openai.types import Completion

from agentsdk import LatencyStats
from benchmarks._agent_replay import AgentRun, agent_replay, learned_latencies, predicted_gap
from benchmarks._claude_code import Session, parse_session
from benchmarks._replay import ReplaySettings, RequestRecord
from benchmarks._report import format_calibration, wait_calibration
from benchmarks.agent_replay import AGENT_CONFIGS, DEFAULT_CONFIGS, main
from hints_spec import CONTROL_PATH, HEADER_NAME, parse_header

TIME_SCALE = 20.0


@dataclass
class FakeCompletions:
    """``/v1/completions`` (streamed: one text chunk, then usage and the server's
    predicted gap) and the control endpoint, recording both."""

    predicted_gap_s: float | None = None
    fail_request: int | None = None  # this one (0-based) answers 500
    requests: list[tuple[httpx2.Headers, dict[str, Any]]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        if request.url.path == CONTROL_PATH:
            self.events.extend(body["events"])
            results = [{"index": i, "outcome": "accepted"} for i in range(len(body["events"]))]
            return httpx2.Response(200, json={"v": 1, "results": results})
        self.requests.append((request.headers, body))
        if len(self.requests) - 1 == self.fail_request:
            return httpx2.Response(500, json={"error": "boom"})
        prompt = len(body["prompt"])
        chunk = {"id": "c", "object": "text_completion", "created": 0, "model": body["model"]}
        text = {**chunk, "choices": [{"index": 0, "text": "w" * body["max_tokens"]}]}
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": body["max_tokens"],
            "total_tokens": prompt + body["max_tokens"],
            "prompt_tokens_details": {"cached_tokens": 64 * ((prompt - 1) // 64)},
        }
        last: dict[str, Any] = {**chunk, "choices": [], "usage": usage}
        if self.predicted_gap_s is not None:
            last["kv_transfer_params"] = {"agent_hints": {"predicted_gap_s": self.predicted_gap_s}}
        stream = "".join(f"data: {json.dumps(c)}\n\n" for c in (text, last)) + "data: [DONE]\n\n"
        return httpx2.Response(
            200, content=stream.encode(), headers={"content-type": "text/event-stream"}
        )

    def hints(self) -> list[dict[str, object]]:
        return [parse_header(headers[HEADER_NAME]).normalized() for headers, _ in self.requests]


SETTINGS = ReplaySettings(base_url="http://model.test", time_scale=TIME_SCALE)


def replay(
    sessions: list[Session],
    fake: FakeCompletions,
    hints: bool = True,
    history: LatencyStats | None = None,
) -> tuple[AgentRun, list[RequestRecord]]:
    settings = dataclasses.replace(SETTINGS, hints=hints)
    client = httpx2.AsyncClient(transport=httpx2.MockTransport(fake))
    run = asyncio.run(agent_replay(sessions, settings, history=history, http_client=client))
    return run, run.records


def test_each_recorded_call_is_one_token_id_request_and_each_tool_waits_as_recorded() -> None:
    session = parse_session(coding_session().lines, "coder")
    fake = FakeCompletions(predicted_gap_s=0.1)
    run, records = replay([session], fake)

    assert run.errors == {}
    bodies = [body for _, body in fake.requests]
    calls = session.root.calls
    sizes = [4 * math.ceil(c.prompt_tokens / 64) for c in calls]
    assert [len(b["prompt"]) for b in bodies] == sizes
    for before, after in itertools.pairwise(bodies):
        assert after["prompt"][: len(before["prompt"])] == before["prompt"]  # append-only
    assert all(b["ignore_eos"] and b["stream"] and b["temperature"] == 0.0 for b in bodies)
    assert [b["max_tokens"] for b in bodies] == [max(1, c.output_tokens * 4 // 64) for c in calls]
    # What the SDK sent: the session on every request, gap from its estimator, each tool
    # call announced under its kind's name, and the session's end.
    assert {h["sid"] for h in fake.hints()} == {"coder"}
    assert all(isinstance(h["gap"], float) for h in fake.hints())
    starts = [e for e in fake.events if e["type"] == "tool_start"]
    assert [e["tool"] for e in starts] == ["Bash-test", "Read", "Bash-test", "Read", "Bash-test"]
    assert not any(e["type"] == "tool_end" for e in fake.events)  # the next request says it
    assert fake.events[-1] == {"type": "end"}
    # The recorded waits, scaled: 2 s -> 0.1 s, 0.02 s -> 1 ms.
    waits = [b.sent_at - a.sent_at - (a.latency_s or 0.0) for a, b in itertools.pairwise(records)]
    assert all(w >= 0.1 for w in waits[0::2]) and all(w < 0.05 for w in waits[1::2])
    # Each record keeps the recording's wait after it, as scaled; none after the last.
    recorded = [r.recorded_wait_s for r in records]
    assert recorded == pytest.approx([0.1, 0.001, 0.1, 0.001, 0.1, None])
    # The SDK learns per kind: by the third test run its ETA is the tests' wait, while
    # a Read's is a millisecond plus the loop's own time (a few ms on a busy machine),
    # far below the tests' 100 ms.
    assert [r.wait_kind for r in records] == [*(e["tool"] for e in starts), None]
    assert records[4].eta_s == pytest.approx(0.1, rel=0.5)
    assert records[3].eta_s is not None and records[3].eta_s < 0.02
    assert all(r.server_gap_s == 0.1 for r in records)
    assert records[-1].ends_turn and records[-1].eta_s is None


def test_an_agent_with_history_starts_from_the_waits_of_its_earlier_sessions() -> None:
    session = parse_session(coding_session().lines, "coder")
    learned = learned_latencies([parse_session(coding_session().lines, "earlier")], SETTINGS)
    before = learned.model_dump()
    _, fresh = replay([session], FakeCompletions())
    _, seasoned = replay([session], FakeCompletions(), history=learned)
    # The first test run: the prior (1 s recorded, 0.05 s scaled) for an agent that
    # never ran one, the earlier session's test runs (2 s, 0.1 s scaled) for one that did.
    assert fresh[0].wait_kind == seasoned[0].wait_kind == "Bash-test"
    assert fresh[0].eta_s == pytest.approx(0.05, rel=0.01)
    assert seasoned[0].eta_s == pytest.approx(0.1, rel=0.13)
    assert learned.model_dump() == before  # each configuration starts from the same


def test_a_sub_agent_runs_on_a_child_branch_and_a_kept_session_waits_on_its_user() -> None:
    session = parse_session(session_with_sub_agent().lines, "sub")
    fake = FakeCompletions()
    run, records = replay([session], fake)

    assert run.errors == {}
    assert [(r.branch, r.seq) for r in records] == [
        ("root", 0),
        ("root", 1),
        ("root/task-1", 0),
        ("root/task-1", 1),
        ("root", 2),
        ("root", 3),
        ("root", 4),
    ]
    child = [h for h in fake.hints() if h.get("br") == "root/task-1"]
    assert len(child) == 2 and all(h["pbr"] == "root" for h in child)
    kinds = [(e["type"], e.get("br"), e.get("tool")) for e in fake.events]
    assert ("fork", None, None) in kinds
    fork = next(e for e in fake.events if e["type"] == "fork")
    assert fork["children"] == ["root/task-1"]
    assert ("tool_start", "root/task-1", "Grep") in kinds
    assert ("end", "root/task-1", None) in kinds
    # The first turn ends with the session kept: the SDK says the branch waits on its
    # user; the last ends the session.
    assert ("tool_start", None, "user") in kinds and fake.events[-1] == {"type": "end"}
    by_seq = {(r.branch, r.seq): r for r in records}
    assert by_seq["root", 2].ends_turn and by_seq["root", 2].eta_s is not None
    assert by_seq["root", 1].wait_kind == "Task" and by_seq["root", 1].eta_s is not None
    # After a turn: the user's recorded 2.5 s, scaled.
    assert by_seq["root", 2].recorded_wait_s == pytest.approx(2.5 / SETTINGS.time_scale)
    table = wait_calibration(records)
    assert table["user"]["waits"] == 1
    assert table["all"]["waits"] == 5
    assert table["all"]["server_within_2x"] is None  # this server predicts nothing


def test_the_plain_configuration_sends_no_hints_and_no_control_events() -> None:
    session = parse_session(session_with_sub_agent().lines, "sub")
    fake = FakeCompletions()
    _, records = replay([session], fake, hints=False)
    assert len(records) == 7 and all(r.error is None for r in records)
    assert all(HEADER_NAME not in headers for headers, _ in fake.requests)
    assert fake.events == []
    assert all(r.hint is None and r.eta_s is None for r in records)


def test_each_prompt_is_kept_in_send_order_for_the_runs_ceiling() -> None:
    fake = FakeCompletions()
    run, records = replay([parse_session(coding_session().lines, "coder")], fake)
    assert run.prompts == [body["prompt"] for _, body in fake.requests]
    both = [
        parse_session(coding_session().lines, "a"),
        parse_session(session_with_sub_agent().lines, "b"),
    ]
    fake = FakeCompletions()
    run, records = replay(both, fake, hints=False)
    assert [len(p) for p in run.prompts] == [r.prompt_tokens for r in records]
    assert sorted(run.prompts) == sorted(body["prompt"] for _, body in fake.requests)


def test_hint_free_runs_beside_plain_and_hinted_by_default() -> None:
    assert DEFAULT_CONFIGS == "plain,hint-free,hinted,unlimited"
    assert list(AGENT_CONFIGS)[:3] == ["plain", "hint-free", "hinted"]
    hint_free = AGENT_CONFIGS["hint-free"]
    assert hint_free.hint_free and not hint_free.hints  # the plain openai client


def test_a_failed_request_is_recorded_and_the_session_goes_on() -> None:
    session = parse_session(coding_session().lines, "coder")
    run, records = replay([session], FakeCompletions(fail_request=1))
    assert run.errors == {}
    assert [r.error is not None for r in records] == [False, True, False, False, False, False]
    assert "500" in (records[1].error or "")


def test_the_servers_predicted_gap_is_read_where_present() -> None:
    def chunk(extra: dict[str, Any]) -> Completion:
        base = {"id": "c", "object": "text_completion", "created": 0, "model": "m", "choices": []}
        return Completion.model_validate({**base, **extra})

    def gap(value: object) -> dict[str, Any]:
        return {"kv_transfer_params": {"agent_hints": {"predicted_gap_s": value}}}

    assert predicted_gap(chunk(gap(2))) == 2.0
    assert predicted_gap(chunk(gap(0.25))) == 0.25
    for absent in ({}, gap(-1), gap("2"), gap(True), {"kv_transfer_params": {"agent_hints": 2}}):
        assert predicted_gap(chunk(absent)) is None


def record(seq: int, sent_at: float, **kw: Any) -> RequestRecord:
    base = {"trace_id": "s", "branch": "root", "prompt_tokens": 10, "max_tokens": 1}
    return RequestRecord(
        **base, seq=seq, sent_at=sent_at, theoretical_cached=0, latency_s=0.0, **kw
    )


def test_wait_calibration_scores_each_kind_of_wait() -> None:
    records = [
        # 1.5 s: 2x; the recording's 1.2 s too
        record(0, 0.0, wait_kind="Bash-test", eta_s=1.0, server_gap_s=4.0, recorded_wait_s=1.2),
        # 3.5 s: the ETA was far off, from the recording's 3 s too
        record(1, 1.5, wait_kind="Bash-test", eta_s=1.0, recorded_wait_s=3.0),
        record(2, 5.0, wait_kind="Read", eta_s=0.001),  # 5 ms, both floored: "at once"
        record(3, 5.005, ends_turn=True, eta_s=60.0),  # the user took 60 s
        record(4, 65.0),
    ]
    table = wait_calibration(records)
    assert list(table) == ["Bash-test", "Read", "user", "all"]
    test = table["Bash-test"]
    assert (test["waits"], test["share_of_waits"]) == (2, 0.5)
    assert test["median_wait_s"] == pytest.approx((1.5 + 3.5) / 2)
    assert (test["client_within_2x"], test["server_within_2x"]) == (0.5, 0.0)
    assert test["client_within_2x_recorded"] == 0.5
    # Where no recorded wait is known, that column scores nothing.
    assert table["Read"]["client_within_2x_recorded"] is None
    assert table["all"]["client_within_2x_recorded"] == 0.5
    assert table["Read"]["client_within_2x"] == 1.0  # 5 ms and 1 ms are both "at once"
    assert table["user"]["client_within_2x"] == 1.0
    assert table["all"]["waits"] == 4 and table["all"]["client_within_2x"] == 0.75
    assert table["Read"]["server_within_2x"] is None
    printed = format_calibration(table)
    assert "Bash-test" in printed and "50.0%" in printed and printed.count("\n") == 5


@pytest.mark.server
def test_the_command_replays_two_sessions_plain_and_hinted(
    test_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    transcripts = tmp_path / "projects"
    coding_session(waits=(2.0, 0.02, 2.0)).write(transcripts / "-home-proj" / "a-coder.jsonl")
    session_with_sub_agent().write(transcripts / "-home-proj" / "b-sub.jsonl")
    out = tmp_path / "run.json"
    argv = [
        "--claude-code", str(transcripts), "--sessions", "2", "--time-scale", "20",
        "--kv-blocks", "40", "--max-model-len", "2048", "--configs", "plain,hint-free,hinted",
        "--model", str(test_model_dir), "--out", str(out), "--startup-timeout", "240",
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "hinted / plain" in printed and "hinted / hint-free" in printed
    assert "exact future knowledge" in printed and "+tier LRU" in printed
    run = json.loads(out.read_text())
    assert list(run["summary"]) == ["plain", "hint-free", "hinted"]
    for summary in run["summary"].values():
        assert (summary["requests"], summary["failed"], summary["preemptions"]) == (11, 0, 0)
        assert summary["reuse_of_theoretical"] > 0.5
        for key in ("ttft_p50_s", "ttft_p90_s", "ttft_mean_s", "prefill_tokens"):
            assert summary[key] is not None
    assert run["calibration_config"] == "hinted"
    calibration = run["calibration"]
    assert {"Bash-test", "Read", "Task", "user", "all"} <= set(calibration)
    assert set(calibration["Bash-test"]) == {
        "waits",
        "share_of_waits",
        "median_wait_s",
        "p90_wait_s",
        "client_within_2x",
        "server_within_2x",
        "client_within_2x_recorded",
    }
    assert calibration["all"]["client_within_2x"] is not None
    # Each run's ceiling in its send order: 40 device blocks, and 8,192 more of the
    # tier (the extension's default 1 GiB, hint-free's too, over 128 KiB blocks).
    assert run["tier_bytes"] == 1 << 30
    for name, summary in run["summary"].items():
        ceiling = summary["ceiling"]
        assert (ceiling["device"]["blocks"], ceiling["tiered"]["blocks"]) == (40, 40 + 8192)
        assert ceiling["served"] == ("device" if name == "plain" else "tiered")
        assert 0 < ceiling["device"]["belady"] <= ceiling["tiered"]["belady"] <= 1
        assert 0 <= ceiling["device"]["lru"] <= ceiling["tiered"]["lru"] <= 1
    assert all(r["hint"] is None for r in run["configs"]["hint-free"]["records"])
    hinted = run["configs"]["hinted"]
    assert {parse_header(r["hint"]).sid for r in hinted["records"]} == {"a-coder", "b-sub"}
    # The server heard every tool call (3 + 6), the wait on the user after b-sub's first
    # turn, the fork, and the ends of the sub-agent and of both sessions.
    events = {k: v for k, v in hinted["metrics_delta"].items() if "control_events" in k}
    assert sum(v for k, v in events.items() if 'type="tool_start"' in k) == 3 + 6 + 1
    assert sum(v for k, v in events.items() if 'type="fork"' in k) == 1
    assert sum(v for k, v in events.items() if 'type="end"' in k) == 3
    assert all(r["hint"] is None for r in run["configs"]["plain"]["records"])
    for plot in ("ttft-cdf", "reuse-over-time", "calibration"):
        assert (tmp_path / f"run-{plot}.png").stat().st_size > 0
