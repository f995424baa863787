"""Test helper: small Claude Code transcripts written line by line, in the shape Claude
Code writes them (``~/.claude/projects/*/*.jsonl``): user lines, one assistant line per
content block sharing ``message.id``, tool results, sidechains linked by ``parentUuid``.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MODEL = "claude-test-model"
_T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

Use = tuple[str, str, Mapping[str, Any]]
"""A tool call: (id, tool name, input)."""


def stamp(seconds: float) -> str:
    """Claude Code's timestamp of ``seconds`` after the transcripts' epoch."""
    moment = _T0 + datetime.timedelta(seconds=seconds)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Transcript:
    """Lines of one session; ``thread`` names a sidechain (None: the main conversation)."""

    def __init__(self, model: str = MODEL) -> None:
        self.model = model
        self.lines: list[str] = []
        self._last: dict[str | None, str] = {}  # thread -> uuid of its latest line

    def _add(self, kind: str, t: float, message: Mapping[str, Any], thread: str | None) -> None:
        uuid = f"uuid-{len(self.lines)}"
        line = {
            "type": kind,
            "isSidechain": thread is not None,
            "parentUuid": self._last.get(thread),
            "uuid": uuid,
            "sessionId": "session",
            "timestamp": stamp(t),
            "message": message,
        }
        self._last[thread] = uuid
        self.lines.append(json.dumps(line))

    def user(self, t: float, text: str, thread: str | None = None) -> None:
        self._add("user", t, {"role": "user", "content": text}, thread)

    def call(
        self,
        start: float,
        end: float,
        message_id: str,
        prompt: int,
        *,
        text: str = "",
        uses: Sequence[Use] = (),
        cache_read: int = 0,
        thread: str | None = None,
        model: str | None = None,
    ) -> None:
        """A model call: its text at ``start``, then one line per tool call, the last at
        ``end``; its usage adds up to ``prompt`` tokens."""
        usage = {
            "input_tokens": 3,
            "cache_creation_input_tokens": prompt - 3 - cache_read,
            "cache_read_input_tokens": cache_read,
            "output_tokens": 1,  # a streaming partial, as Claude Code logs it
        }
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        blocks += [{"type": "tool_use", "id": i, "name": n, "input": dict(a)} for i, n, a in uses]
        for index, block in enumerate(blocks):
            t = end if index == len(blocks) - 1 else start
            message = {
                "id": message_id,
                "model": model or self.model,
                "role": "assistant",
                "content": [block],
                "usage": usage,
            }
            self._add("assistant", t, message, thread)

    def result(self, t: float, use_id: str, content: str, thread: str | None = None) -> None:
        block = {"type": "tool_result", "tool_use_id": use_id, "content": content}
        self._add("user", t, {"role": "user", "content": [block]}, thread)

    def raw(self, text: str) -> None:
        """A line as given (malformed on purpose)."""
        self.lines.append(text)

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(self.lines) + "\n")
        return path


def bash(use_id: str, command: str) -> Use:
    return (use_id, "Bash", {"command": command})


def coding_session(waits: Sequence[float] = (2.0, 0.02, 2.0, 0.02, 2.0)) -> Transcript:
    """A session that alternates a test run and a file read (``waits``, s), then answers."""
    t = Transcript()
    t.user(0.0, "Fix the bug.")
    now, prompt = 1.0, 1000
    for i, wait in enumerate(waits):
        use = bash(f"t{i}", "python -m pytest -q") if i % 2 == 0 else (f"t{i}", "Read", {})
        t.call(now, now + 0.5, f"m{i}", prompt, text="Let me look.", uses=[use], cache_read=640)
        t.result(now + 0.5 + wait, f"t{i}", "x" * 200)
        now, prompt = now + 2.0 + wait, prompt + 100
    t.call(now, now + 0.5, "final", prompt, text="Fixed.", cache_read=640)
    return t


def session_with_sub_agent() -> Transcript:
    """A session whose second call runs a ``Task`` sub-agent (two calls, one of them with
    two parallel tool calls) beside a parallel Read, then two more user turns."""
    t = Transcript()
    t.user(0.0, "Fix the bug.")
    t.call(1.0, 1.5, "m0", 1100, text="First the tests.", uses=[bash("a", "git status")])
    t.result(1.6, "a", "clean")
    task = ("task", "Task", {"description": "explore", "prompt": "Find the parser."})
    t.call(2.0, 2.5, "m1", 1200, uses=[task, ("r", "Read", {"file_path": "/x"})])
    t.result(2.6, "r", "y" * 100)
    t.user(2.6, "Find the parser.", thread="sub")
    uses = [("g", "Grep", {"pattern": "parse"}), ("h", "Glob", {"pattern": "*.py"})]
    t.call(3.0, 3.5, "s0", 900, uses=uses, thread="sub")
    t.result(3.6, "g", "found", thread="sub")
    t.result(3.7, "h", "a.py", thread="sub")
    t.call(4.0, 4.5, "s1", 1000, text="It is in a.py.", thread="sub")
    t.result(4.6, "task", "It is in a.py.")
    t.call(5.0, 5.5, "m2", 1300, text="Done.")
    t.user(8.0, "Also add a test.")
    t.call(9.0, 9.5, "m3", 1400, uses=[("w", "Write", {"file_path": "/t"})])
    t.result(9.6, "w", "ok")
    t.call(10.0, 10.5, "m4", 1500, text="Added.")
    return t
