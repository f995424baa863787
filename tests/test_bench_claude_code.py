"""The Claude Code transcript reader, on small hand-written transcripts: calls grouped by
message id, sizes, tool kinds and waits, parallel calls, sidechains, compaction, user
turns, malformed lines; and the token-id prompts' prefix structure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from claude_code_transcripts import (
    MODEL,
    Transcript,
    bash,
    coding_session,
    session_with_sub_agent,
)

from benchmarks._claude_code import (
    PromptMapper,
    Session,
    bash_kind,
    parse_session,
    read_session,
    read_sessions,
    replayed_calls,
    tool_kind,
)
from benchmarks._traces import ROOT, PrefixIndex


def parse(t: Transcript, name: str = "session") -> Session:
    return parse_session(t.lines, name)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_a_call_is_its_lines_sizes_from_usage_and_content_wait_from_the_result() -> None:
    t = Transcript()
    t.user(0.0, "Fix it.")
    use = bash("t1", "cd /testbed && python -m pytest tests -x 2>&1 | tail -5")
    t.call(1.0, 2.5, "m1", 5000, text="I will run the tests.", uses=[use], cache_read=4000)
    t.result(9.5, "t1", "3 passed")
    t.call(10.0, 10.4, "m2", 5100, text="Done.")
    session = parse(t)

    first, last = session.root.calls
    assert (first.message_id, first.prompt_tokens) == ("m1", 5000)
    assert (first.started, first.ended) == (1.0, 2.5)  # s since the first line
    written = len("I will run the tests.") + len("Bash") + len(json.dumps(use[2]))
    assert first.output_tokens == math.ceil(written / 4)  # not usage's streaming partial 1
    [tool] = first.tools
    assert (tool.name, tool.kind, tool.duration_s, tool.result_chars) == (
        "Bash",
        "Bash-test",
        7.0,
        len("3 passed"),
    )
    assert (first.wait_s, first.wait_kind, first.ends_turn) == (7.0, "Bash-test", False)
    assert (last.tools, last.ends_turn, last.wait_kind) == ((), True, None)
    assert (session.model, session.root.system_tokens) == (MODEL, 4000)
    assert (session.skipped_lines, session.num_calls, session.num_tool_calls) == (0, 2, 1)


def test_parallel_tool_calls_share_one_wait_the_slowest() -> None:
    t = Transcript()
    t.user(0.0, "Look around.")
    uses = [("r", "Read", {"file_path": "/a"}), bash("b", "pip install -e ."), bash("g", "git log")]
    t.call(1.0, 2.0, "m1", 3000, uses=uses)
    t.result(2.1, "r", "aaa")
    t.result(2.3, "g", "commits")
    t.result(9.0, "b", "installed")
    t.call(10.0, 10.5, "m2", 3200, text="ok")
    call = parse(t).root.calls[0]

    assert [(u.kind, u.duration_s) for u in call.tools] == [
        ("Read", 0.1),
        ("Bash-package", 7.0),
        ("Bash-git", 0.3),
    ]
    assert (call.wait_s, call.wait_kind) == (7.0, "Bash-package")


def test_malformed_lines_are_skipped_and_counted_never_fatal(tmp_path: Path) -> None:
    t = Transcript()
    t.raw("not json at all")
    t.raw("[1, 2, 3]")
    t.raw('{"type": "user", "message": {"role": "user", "content": "no timestamp"}}')
    t.raw('{"type": "assistant", "timestamp": "yesterday", "message": {"id": "x"}}')
    t.raw('{"type": "assistant", "timestamp": "2026-01-01T00:00:00Z", "message": "text"}')
    t.raw('{"type": "assistant", "timestamp": "2026-01-01T00:00:00Z", "message": {"id": 7}}')
    t.raw('{"type": "summary", "summary": "A title", "leafUuid": "u"}')  # known, not traffic
    t.raw("")
    t.user(0.0, "Fix it.")
    t.call(1.0, 1.5, "m1", 2000, uses=[bash("t1", "ls")])
    t.raw('{"type": "user", "timestamp": "2026-01-01T00:00:02Z", "message": {"content": '
          '[{"type": "tool_result"}]}}')  # fmt: skip
    t.result(2.0, "t1", "files")
    t.call(3.0, 3.5, "m2", 2100, text="Done.")
    path = t.write(tmp_path / "s.jsonl")
    with path.open("ab") as f:
        f.write(b'{"type": "user", "message": "\xff\xfe not utf-8"}\n')
    session = read_session(path)

    assert session.skipped_lines == 8
    assert [c.message_id for c in session.root.calls] == ["m1", "m2"]
    assert session.root.calls[0].wait_s == 0.5


def test_an_api_error_stand_in_is_not_a_model_call() -> None:
    t = Transcript()
    t.user(0.0, "Fix it.")
    t.call(1.0, 1.2, "err", 0, text="API Error: 500", model="<synthetic>")
    t.call(2.0, 2.5, "m1", 2000, text="Done.")
    session = parse(t)
    assert [c.message_id for c in session.root.calls] == ["m1"]
    assert session.dropped_calls == 1


def test_a_sidechain_is_its_task_calls_sub_agent() -> None:
    session = parse(session_with_sub_agent())
    root = session.root
    task, read = root.calls[1].tools
    assert (task.kind, read.kind) == ("Task", "Read")
    assert task.agent is not None and read.agent is None
    sub = task.agent
    assert [c.message_id for c in sub.calls] == ["s0", "s1"]  # not in the root's calls
    assert [c.message_id for c in root.calls] == ["m0", "m1", "m2", "m3", "m4"]
    assert sub.calls[0].wait_s == pytest.approx(0.2)  # the slower of Grep and Glob
    assert sub.calls[-1].ends_turn and task.duration_s == pytest.approx(2.1)
    # Its chain opens with the session's system prefix, at most its own opening (its
    # first prompt without its task): 900 - ceil(16 / 4).
    assert (root.system_tokens, sub.system_tokens) == (1100 - 3, 896)
    assert [b.name for b in session.branches()] == [ROOT, "task"]
    order = [(b.name, c.message_id) for b, c in replayed_calls(session)]
    assert order == [
        (ROOT, "m0"),
        (ROOT, "m1"),
        ("task", "s0"),
        ("task", "s1"),
        (ROOT, "m2"),
        (ROOT, "m3"),
        (ROOT, "m4"),
    ]


def test_user_turns_split_the_root_and_say_how_long_the_user_took() -> None:
    root = parse(session_with_sub_agent()).root
    assert [[c.message_id for c in turn] for turn in root.turns()] == [
        ["m0", "m1", "m2"],
        ["m3", "m4"],
    ]
    assert root.calls[3].user_wait_s == 2.5  # the user's message at 8.0, m2 ended at 5.5
    assert [c.user_wait_s for c in root.calls if c.message_id != "m3"] == [None] * 4


def test_parallel_sub_agents_are_matched_to_their_task_by_prompt() -> None:
    t = Transcript()
    t.user(0.0, "Explore.")
    tasks = [("ta", "Task", {"prompt": "Task A"}), ("tb", "Task", {"prompt": "Task B"})]
    t.call(1.0, 1.5, "m0", 2000, uses=tasks)
    t.user(1.6, "Task B", thread="b")
    t.user(1.7, "Task A", thread="a")
    t.call(2.0, 2.2, "b0", 800, text="B done", thread="b")
    t.call(2.1, 2.4, "a0", 700, text="A done", thread="a")
    t.call(2.5, 2.6, "a1", 750, text="A again", thread="a")  # after its answer: dropped
    t.user(2.7, "Unclaimed", thread="c")
    t.call(2.8, 2.9, "c0", 600, text="nobody asked", thread="c")
    t.result(3.0, "ta", "A")
    t.result(3.1, "tb", "B")
    t.call(4.0, 4.5, "m1", 2100, text="Done.")
    session = parse(t)

    a, b = session.root.calls[0].tools
    assert a.agent is not None and [c.message_id for c in a.agent.calls] == ["a0"]
    assert b.agent is not None and [c.message_id for c in b.agent.calls] == ["b0"]
    assert session.dropped_calls == 2  # a1, and c0 of no Task call


def test_a_shrinking_prompt_starts_a_new_chain_that_shares_only_the_system_prefix() -> None:
    t = Transcript()
    t.user(0.0, "Fix it.")
    prompts = [5000, 6000, 3000, 4000]  # compaction after the second call
    for i, prompt in enumerate(prompts):
        t.call(i + 1.0, i + 1.2, f"m{i}", prompt, uses=[bash(f"t{i}", "ls")], cache_read=1280)
        t.result(i + 1.3, f"t{i}", "ok")
    t.call(9.0, 9.5, "end", 4100, text="Done.")
    session = parse(t)
    calls = session.root.calls
    assert [c.chain for c in calls] == [0, 0, 1, 1, 1]

    mapper = PromptMapper(session, k=4)
    p = [mapper.prompt(session.root, c) for c in calls]
    assert [len(x) for x in p] == [4 * math.ceil(n / 64) for n in [*prompts, 4100]]
    assert p[1][: len(p[0])] == p[0]  # append-only within a chain
    assert p[3][: len(p[2])] == p[2]
    assert common_prefix(p[1], p[2]) == 4 * (1280 // 64)  # the system prefix only
    index = PrefixIndex(64)
    cached = [index.add(x) for x in p]
    assert cached[1] == 64 * (len(p[0]) // 64)
    assert cached[2] == 64 * (4 * 20 // 64)  # the system prefix's full blocks


def test_sessions_of_one_model_share_the_system_prefix_and_no_more() -> None:
    def one(model: str, name: str) -> list[int]:
        t = Transcript(model=model)
        t.user(0.0, f"Task {name}.")
        t.call(1.0, 1.5, "m0", 3000, text="Done.", cache_read=1920)
        session = parse(t, name)
        return PromptMapper(session, k=4).prompt(session.root, session.root.calls[0])

    a, b, c = one(MODEL, "a"), one(MODEL, "b"), one("another-model", "c")
    assert common_prefix(a, b) == 4 * (1920 // 64)
    assert common_prefix(a, c) < 4


def test_a_transcript_without_cache_fields_sizes_the_system_prefix_from_the_first_prompt() -> None:
    line = {
        "type": "assistant",
        "timestamp": "2026-01-01T00:00:01Z",
        "message": {
            "id": "m0",
            "model": "local-model",
            "content": [{"type": "text", "text": "Hello."}],
            "usage": {"input_tokens": 1000, "output_tokens": 3},
        },
    }
    user = {"type": "user", "timestamp": "2026-01-01T00:00:00Z", "message": {"content": "x" * 400}}
    session = parse_session([json.dumps(user), json.dumps(line)], "local")
    assert (session.root.calls[0].prompt_tokens, session.root.system_tokens) == (1000, 900)


def test_a_session_without_tool_calls_is_one_turn_per_call() -> None:
    t = Transcript()
    t.user(0.0, "What is 2 + 2?")
    t.call(1.0, 1.5, "m0", 1200, text="4.")
    t.user(30.0, "And 3 + 3?")
    t.call(31.0, 31.2, "m1", 1300, text="6.")
    session = parse(t)
    assert session.num_tool_calls == 0
    assert [c.ends_turn for c in session.root.calls] == [True, True]
    assert [len(turn) for turn in session.root.turns()] == [1, 1]
    assert session.root.calls[1].user_wait_s == 28.5
    assert [c.message_id for _, c in replayed_calls(session)] == ["m0", "m1"]


def test_the_last_call_ends_the_session_even_with_tool_calls_pending() -> None:
    t = coding_session(waits=(1.0,))
    t.call(20.0, 20.5, "cut", 3000, uses=[bash("z", "pytest")])  # the file ends here
    calls = parse(t).root.calls
    assert [c.ends_turn for c in calls] == [False, True, True]
    assert calls[-1].tools[0].duration_s is None


@pytest.mark.parametrize(
    ("command", "kind"),
    [
        ("pytest tests/test_a.py -x", "test"),
        ("cd /testbed && source venv/bin/activate && python -m pytest -q 2>&1 | tail", "test"),
        ("PYTHONPATH=/testbed/src:$PYTHONPATH pytest tests/ -v", "test"),
        ("timeout 300 tox -e py39", "test"),
        ("(cd docs && make test)", "test"),
        ("python manage.py test app", "test"),
        ("ls # then\npytest", "test"),
        ("pip install -e .", "package"),
        ("source /tmp/venv/bin/activate && python -m pip install requests", "package"),
        ("apt-get update && apt-get install -y gcc", "package"),
        ("python setup.py develop", "package"),
        ("python -c 'import x; print(x)'", "python"),
        ("python3 << 'EOF'\nimport subprocess\nsubprocess.run(['pytest'])\nEOF", "python"),
        ("/tmp/venv/bin/python reproduce.py", "python"),
        ("./check.py --fast", "python"),
        ("git diff HEAD~1 | head -50", "git"),
        ("cd /testbed && git status && ls", "git"),
        ('find /testbed -name "*.py" -exec grep -l "a\\|b" {} \\; 2>/dev/null | head', "inspect"),
        ("grep -rn 'def parse' src | wc -l", "inspect"),
        ("cat > /tmp/x.py << EOF\npip install evil\nEOF", "inspect"),
        ("cd /testbed", "inspect"),
        ("", "inspect"),
        ("echo 'unbalanced", "inspect"),
        ("curl -s http://localhost:8000", "other"),
        ("rm -rf build && cp a b", "other"),
        ("make -C docs html", "other"),
    ],
)
def test_bash_kinds(command: str, kind: str) -> None:
    assert bash_kind(command) == kind


def test_tool_kinds_are_valid_distinct_tool_names() -> None:
    assert tool_kind("Bash", {"command": "git log"}) == "Bash-git"
    assert tool_kind("Bash", {}) == "Bash-inspect"
    assert tool_kind("mcp__srv__do.thing", {}) == "mcp__srv__do_thing"
    assert tool_kind("user", {}) == "user_"  # the protocol's wait on the user
    assert tool_kind("all", {}) == "all_"  # the calibration's pooled row
    assert tool_kind("Read", {"file_path": "/x"}) == "Read"


def test_read_sessions_finds_transcripts_in_project_folders(tmp_path: Path) -> None:
    coding_session().write(tmp_path / "-home-me-proj-b" / "s2.jsonl")
    coding_session().write(tmp_path / "-home-me-proj-a" / "s1.jsonl")
    (tmp_path / "notes.txt").write_text("not a transcript")
    sessions = read_sessions(tmp_path)
    assert [s.session_id for s in sessions] == ["s1", "s2"]
    assert all(s.num_tool_calls == 5 for s in sessions)
