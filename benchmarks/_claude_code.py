"""Claude Code session transcripts (``~/.claude/projects/*/*.jsonl``) as replayable sessions.

A transcript is one JSON object per line, as Claude Code writes it: the user's
messages, every assistant content block (one model call spans several lines
sharing ``message.id``), tool results with their times, and sub-agent (``Task``)
lines marked ``isSidechain``. It carries no prompt text the replay could send,
only sizes, so a call's prompt is rebuilt from its size and the session's prefix
structure:

- within a branch the context only grows: a call's prompt is the previous prompt
  plus what came after it; a prompt smaller than the previous one starts a new
  chain (compaction rewrote the history);
- every chain opens with the session's system prefix (system prompt and tool
  schemas), shared across sessions of the same model as the API's prompt cache
  shares it; a sub-agent's chain shares it up to the sub-agent's own opening.

Each 64 prompt tokens become ``k`` token ids (``_traces.TokenMapper``), so prefix
sharing is exact at ``k/64`` scale and the theoretical reuse is computable
(``_traces.PrefixIndex``).

Sizes: a call's prompt is ``input_tokens + cache_creation_input_tokens +
cache_read_input_tokens`` of its usage; its output is counted from its content,
characters / 4 (text, thinking, and each tool call's name and JSON input): the
logged ``output_tokens`` is a streaming partial.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import re
import shlex
import string
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hints_spec import USER_TOOL

from ._traces import ROOT, TRACE_BLOCK, TokenMapper

__all__ = [
    "BASH_KINDS",
    "CHARS_PER_TOKEN",
    "RESERVED_KINDS",
    "TASK",
    "Branch",
    "ModelCall",
    "PromptMapper",
    "Session",
    "ToolUse",
    "bash_kind",
    "default_claude_code_dir",
    "parse_session",
    "read_session",
    "read_sessions",
    "replayed_calls",
    "tool_kind",
]

CHARS_PER_TOKEN = 4
"""Output tokens are counted as characters / 4 of a call's content (as ``ScriptedModel`` does)."""

BASH_KINDS = ("test", "package", "python", "other", "git", "inspect")
"""Kinds of Bash commands, in the order that decides a compound command's kind: a
command with a test run in it waits like a test run, whatever else it does."""

TASK = "Task"
"""Claude Code's sub-agent tool."""

RESERVED_KINDS = frozenset({USER_TOOL, "all"})
"""Names no tool kind takes: the wait on the user, and the calibration of all waits."""

_MAX_ID = 128  # the protocol's bound on a session id
_UNSAFE_ID = re.compile(r"[^A-Za-z0-9._:~/-]+")
_UNSAFE_TOOL = re.compile(r"[^A-Za-z0-9_-]+")  # what OpenAI-compatible tool names allow


@dataclass(frozen=True, slots=True)
class ToolUse:
    """One tool call of a model call.

    Args:
        call_id: Claude Code's ``tool_use`` id.
        name: The tool as Claude Code named it (``Bash``, ``Read``, ...).
        kind: What the replay names the tool: the name, and for Bash the kind of
            command (``Bash-test``, ``Bash-git``, ...; ``tool_kind``).
        duration_s: Its result's time minus the model call's last line; None when
            no result came back.
        result_chars: Size of the result the tool returned.
        agent: A ``Task`` call's sub-agent, when its lines are in the file.
    """

    call_id: str
    name: str
    kind: str
    duration_s: float | None
    result_chars: int = 0
    agent: Branch | None = None


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model call: the lines sharing one ``message.id``.

    Args:
        message_id: The API's message id.
        started: Time of its first line, s since the session's first line.
        ended: Time of its last line (the response was complete).
        prompt_tokens: Prompt size from its usage.
        output_tokens: Output size counted from its content (``CHARS_PER_TOKEN``).
        tools: Its tool calls, in order; parallel calls share one wait.
        chain: Which chain of its branch the prompt extends (0, then 1 after the
            first shrink, ...).
        ends_turn: The agent's turn ends here: no tool call of it is followed by
            another call (the next call, if any, follows a user message).
        user_wait_s: For a call that opens a turn after the first: how long the
            user took, from the previous call's last line to their message.
    """

    message_id: str
    started: float
    ended: float
    prompt_tokens: int
    output_tokens: int
    tools: tuple[ToolUse, ...] = ()
    chain: int = 0
    ends_turn: bool = False
    user_wait_s: float | None = None

    @property
    def wait_s(self) -> float | None:
        """The wait before the next call of the branch when the turn goes on:
        the slowest of its tools (parallel calls share one wait)."""
        durations = [t.duration_s for t in self.tools if t.duration_s is not None]
        return max(durations) if durations else None

    @property
    def wait_kind(self) -> str | None:
        """The kind of the tool the wait is on (its slowest), None without tools."""
        if not self.tools:
            return None
        return max(self.tools, key=lambda t: t.duration_s or 0.0).kind


@dataclass(frozen=True, slots=True)
class Branch:
    """A conversation: the session's main one (``ROOT``) or a sub-agent's.

    ``system_tokens`` is how much of the session's system prefix its chains open
    with. A sub-agent gets one prompt, so its branch ends with its first answer.
    """

    name: str
    calls: tuple[ModelCall, ...]
    system_tokens: int = 0

    def turns(self) -> list[tuple[ModelCall, ...]]:
        """The calls split into the agent's turns (each ends with ``ends_turn``)."""
        turns: list[tuple[ModelCall, ...]] = []
        start = 0
        for i, call in enumerate(self.calls):
            if call.ends_turn:
                turns.append(self.calls[start : i + 1])
                start = i + 1
        if start < len(self.calls):
            turns.append(self.calls[start:])
        return turns


@dataclass(frozen=True, slots=True)
class Session:
    """One transcript.

    Args:
        session_id: A protocol-safe id from the file name.
        model: The main conversation's model (sessions of one model share a
            system prefix).
        root: The main conversation.
        skipped_lines: Lines that were not JSON objects of a known shape.
        dropped_calls: Model calls of the file not in the model: a sub-agent's
            calls after its answer, sidechain calls of no ``Task`` call, API error
            stand-ins (``<synthetic>``).
    """

    session_id: str
    model: str
    root: Branch
    skipped_lines: int = 0
    dropped_calls: int = 0
    path: Path | None = field(default=None, compare=False)

    def branches(self) -> Iterator[Branch]:
        """The root, then every sub-agent, in call order."""
        yield self.root
        for call in self.root.calls:
            for use in call.tools:
                if use.agent is not None:
                    yield use.agent

    @property
    def num_calls(self) -> int:
        return sum(len(b.calls) for b in self.branches())

    @property
    def num_tool_calls(self) -> int:
        return sum(len(c.tools) for b in self.branches() for c in b.calls)


def default_claude_code_dir(repo_root: Path) -> Path:
    """``$AGENT_HINTS_CLAUDE_CODE``, else ``../shared/traces-claude-code`` beside the repository."""
    env = os.environ.get("AGENT_HINTS_CLAUDE_CODE")
    return Path(env) if env else repo_root.parent / "shared" / "traces-claude-code"


# --- tool kinds ---------------------------------------------------------------

_PUNCTUATION = ";<>|&\n"  # parentheses stay in words: "$(pwd)", "(cd x"
_SEPARATORS = ";|&\n"
_ESCAPED = re.compile(r"\\[;<>|&]")  # find's "\;" is an argument, not a separator
_WORD_CHARS = "".join(
    ch for ch in string.printable if ch not in _PUNCTUATION + " \t\r\x0b\x0c'\"\\"
)
_ROUGH_TOKENS = re.compile(r"&&|\|\||[;|&\n]|[<>]+|[^\s;|&<>]+")
_HEREDOC = re.compile(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)['\"]?")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"^(i?python[0-9.]*|pypy[0-9.]*)$")
_WRAPPERS = frozenset({"sudo", "time", "timeout", "nohup", "env", "exec", "command", "nice"})
_WRAPPERS |= frozenset({"stdbuf", "xargs", "then", "do", "else", "elif", "if", "while", "!"})
_WRAPPERS |= frozenset({"until", "{", "eval"})
_SETUP = frozenset({"cd", "source", ".", "export", "set", "unset", "pushd", "popd", "alias"})
_SETUP |= frozenset({"ulimit", "trap", "shopt", "fi", "done", "esac", "}", "for", "case"})
_SETUP |= frozenset({"local", "declare", "read", "wait", "exit", "return", "mkdir", "sleep"})
_TEST_RUNNERS = frozenset({"pytest", "py.test", "tox", "nox", "nosetests", "nose2", "trial"})
_TEST_RUNNERS |= frozenset({"ctest", "unittest", "runtests", "runtests.py", "jest", "mocha"})
_TEST_WORDS = frozenset({"test", "tests", "check", "pytest", "unittest", "tox", "nose"})
_BUILD_TOOLS = frozenset({"make", "npm", "yarn", "pnpm", "go", "cargo", "mvn", "gradle"})
_BUILD_TOOLS |= frozenset({"manage.py", "setup.py", "hatch"})
_PACKAGERS = frozenset({"pip", "pip3", "uv", "conda", "mamba", "micromamba", "poetry"})
_PACKAGERS |= frozenset({"pipenv", "apt", "apt-get", "apt-cache", "dpkg", "yum", "dnf", "apk"})
_PACKAGERS |= frozenset({"gem", "brew", "easy_install", "pip-compile", "pipx", "pdm"})
_INSTALL_WORDS = frozenset({"install", "uninstall", "add", "remove", "develop", "sync", "ci"})
_INSPECTORS = frozenset({"ls", "cat", "head", "tail", "grep", "egrep", "fgrep", "rg", "ag"})
_INSPECTORS |= frozenset({"find", "fd", "wc", "pwd", "tree", "sed", "awk", "echo", "printf"})
_INSPECTORS |= frozenset({"which", "whereis", "type", "file", "stat", "du", "df", "diff"})
_INSPECTORS |= frozenset({"printenv", "sort", "uniq", "cut", "tr", "less", "more", "jq"})
_INSPECTORS |= frozenset({"realpath", "readlink", "basename", "dirname", "whoami", "id"})
_INSPECTORS |= frozenset({"uname", "date", "true", "false", "test", "[", "[[", "hostname"})
_INSPECTORS |= frozenset({"nl", "od", "xxd", "hexdump", "md5sum", "sha256sum", "column"})
_INSPECTORS |= frozenset({"tee", "cmp", "strings", "lsof", "ps", "env", "locale", "history"})


def _without_heredocs(command: str) -> str:
    """``command`` with every here-document's body removed (it is input, not commands)."""
    lines = command.split("\n")
    kept: list[str] = []
    end: str | None = None
    for line in lines:
        if end is not None:
            if line.strip() == end:
                end = None
            continue
        kept.append(line)
        if match := _HEREDOC.search(line):
            end = match[1]
    return "\n".join(kept)


def _tokens(command: str) -> list[str]:
    """Shell tokens of ``command``: words, and operators (``&&``, ``|``, ``;``,
    newlines, parentheses, redirections) as tokens of their own."""
    command = _ESCAPED.sub(" ", command)
    lexer = shlex.shlex(command, posix=True, punctuation_chars=_PUNCTUATION)
    lexer.wordchars = _WORD_CHARS
    lexer.whitespace = " \t\r"  # a newline separates commands: a token of its own
    lexer.commenters = ""  # comments end at a newline token, handled by the caller
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: good enough for naming the programs
        return _ROUGH_TOKENS.findall(command)


def _simple_commands(command: str) -> Iterator[list[str]]:
    """The words of each simple command in ``command`` (redirection targets and
    comments left out)."""
    words: list[str] = []
    comment = redirect = False
    for token in _tokens(_without_heredocs(command)):
        if comment and token != "\n":
            continue
        comment = False
        if token.startswith("#"):
            comment = True
        elif all(ch in _SEPARATORS for ch in token):
            if words:
                yield words
            words = []
        elif all(ch in _PUNCTUATION for ch in token):
            redirect = True  # ">", "2>&" ...: the next word is where it goes
        elif redirect:
            redirect = False
        else:
            words.append(token)
    if words:
        yield words


def _segment_kind(words: Sequence[str]) -> str | None:
    """The kind of one simple command, None for shell set-up (``cd``, ``export``, ...)."""
    i = 0
    while i < len(words):
        word = words[i].strip("()")
        if _ASSIGNMENT.match(word) or not word:
            i += 1
        elif word in _WRAPPERS:
            i += 1
            while i < len(words) and (words[i].startswith("-") or words[i][:1].isdigit()):
                i += 1  # the wrapper's options (timeout 60, nice -n 5)
        else:
            break
    if i >= len(words):
        return None
    program = os.path.basename(words[i].strip("()"))
    args = words[i + 1 :]
    lowered = {a.strip("()").lower() for a in args}
    if program in _SETUP:
        return None
    if program in _TEST_RUNNERS or any("runtests" in a or a == "pytest" for a in args[:1]):
        return "test"
    if _PYTHON.match(program):
        if len(args) >= 2 and args[0] == "-m":
            module = args[1]
            if module in ("pytest", "unittest", "tox", "nose", "nose2", "py.test"):
                return "test"
            if module in ("pip", "ensurepip", "venv", "uv"):
                return "package"
        script = os.path.basename(args[0]) if args else ""
        if script in ("manage.py", "runtests.py") and lowered & _TEST_WORDS:
            return "test"
        if script == "setup.py":
            return "test" if "test" in lowered else "package"
        return "python"
    if program in _BUILD_TOOLS:
        if lowered & _TEST_WORDS:
            return "test"
        if lowered & _INSTALL_WORDS or program == "setup.py":
            return "package"
        return "other"
    if program in _PACKAGERS:
        return "package"
    if program.endswith(".py"):
        return "python"
    if program == "git":
        return "git"
    if program in _INSPECTORS:
        return "inspect"
    return "other"


def bash_kind(command: str) -> str:
    """What a Bash command waits like, one of ``BASH_KINDS``.

    A compound command (``&&``, ``;``, pipes, lines) takes the first of
    ``BASH_KINDS`` among its simple commands; shell set-up (``cd``, ``source``,
    ``export``) and here-document bodies count for nothing; a command of nothing
    else is ``inspect``.
    """
    kinds = {
        kind for words in _simple_commands(command) if (kind := _segment_kind(words)) is not None
    }
    return next((k for k in BASH_KINDS if k in kinds), "inspect")


def _tool_name(name: str) -> str:
    """``name`` as a valid replay tool name (``A-Za-z0-9_-``, 1..63), never one of
    ``RESERVED_KINDS``."""
    safe = _UNSAFE_TOOL.sub("_", name).strip("_")[:63] or "tool"
    return f"{safe}_" if safe in RESERVED_KINDS else safe


def tool_kind(name: str, arguments: Mapping[str, Any]) -> str:
    """The replay's name for a tool call: the tool's name, for Bash with the
    command's kind (``Bash-test``): the kind decides the wait far more than the
    tool does (a test run takes seconds, ``ls`` milliseconds)."""
    if name == "Bash":
        command = arguments.get("command")
        return f"Bash-{bash_kind(command if isinstance(command, str) else '')}"
    return _tool_name(name)


# --- parsing ------------------------------------------------------------------


def _time(line: Mapping[str, Any]) -> float:
    """A line's timestamp as Unix time; raises ``ValueError``/``TypeError`` when absent or bad."""
    stamp = line["timestamp"]
    if not isinstance(stamp, str):
        raise TypeError("timestamp is not a string")
    parsed = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.timestamp()


def _size(content: object) -> int:
    """Characters of a message's or a result's content (strings, or lists of blocks)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(_size(block) for block in content)
    if isinstance(content, dict):
        for key in ("text", "thinking", "content"):
            if key in content:
                return _size(content[key])
        return len(json.dumps(content))
    return 0


def _usage_tokens(usage: object) -> int:
    if not isinstance(usage, dict):
        return 0
    keys = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    return sum(int(usage.get(k) or 0) for k in keys)


@dataclass(slots=True)
class _Call:
    """A model call while its lines are being read."""

    message_id: str
    started: float
    ended: float
    prompt_tokens: int
    cache_read: int
    chars: int = 0
    uses: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    use_ids: set[str] = field(default_factory=set)
    user_before: float | None = None  # time of a user message just before it


@dataclass(slots=True)
class _Thread:
    """The lines of one conversation (the main one, or one sidechain)."""

    calls: list[_Call] = field(default_factory=list)
    by_id: dict[str, _Call] = field(default_factory=dict)
    prompt: str | None = None  # its first user message (a sidechain's task)
    first_user_chars: int = 0
    started: float = 0.0
    pending_user: float | None = None


def _session_id(stem: str) -> str:
    safe = _UNSAFE_ID.sub("-", stem).strip("-") or "session"
    if len(safe) <= _MAX_ID:
        return safe
    return f"{safe[: _MAX_ID - 17]}~{hashlib.sha256(stem.encode()).hexdigest()[:16]}"


class _Reader:
    def __init__(self) -> None:
        self.main = _Thread()
        self.side: dict[str, _Thread] = {}  # sidechain root uuid -> thread
        self.thread_of: dict[str, str] = {}  # sidechain line uuid -> root uuid
        self.results: dict[str, tuple[float, int]] = {}  # tool_use id -> (time, size)
        self.skipped = 0
        self.synthetic = 0
        self.first_time: float | None = None
        self.model = ""

    def line(self, text: str) -> None:
        if not text.strip():
            return
        try:
            line = json.loads(text)
            if not isinstance(line, dict):
                raise TypeError("not an object")
            kind = line.get("type")
            if kind not in ("user", "assistant"):
                return  # summaries, queue operations: no traffic
            t = _time(line)
            message = line["message"]
            if not isinstance(message, dict):
                raise TypeError("message is not an object")
            if self.first_time is None:
                self.first_time = t
            thread = self._thread(line)
            if kind == "assistant":
                self._assistant(thread, message, t)
            else:
                self._user(thread, message, t)
        except (ValueError, TypeError, KeyError, AttributeError):
            self.skipped += 1

    def _thread(self, line: Mapping[str, Any]) -> _Thread:
        if not line.get("isSidechain"):
            return self.main
        uuid, parent = str(line.get("uuid") or ""), line.get("parentUuid")
        root = self.thread_of.get(str(parent)) if parent else None
        if root is None:  # a sidechain's first line (its task)
            root = uuid or f"sidechain-{len(self.side)}"
            self.side[root] = _Thread()
        if uuid:
            self.thread_of[uuid] = root
        return self.side[root]

    def _assistant(self, thread: _Thread, message: Mapping[str, Any], t: float) -> None:
        message_id = message["id"]
        content = message.get("content")
        if not isinstance(message_id, str) or not isinstance(content, list):
            raise TypeError("assistant line without id or content")
        call = thread.by_id.get(message_id)
        if call is None:
            if message.get("model") == "<synthetic>":  # a client-side API error message
                self.synthetic += 1
                return
            prompt = _usage_tokens(message.get("usage"))
            usage = message.get("usage") or {}
            call = _Call(message_id, t, t, prompt, int(usage.get("cache_read_input_tokens") or 0))
            call.user_before, thread.pending_user = thread.pending_user, None
            thread.by_id[message_id] = call
            thread.calls.append(call)
            if thread is self.main and not self.model:
                self.model = str(message.get("model") or "")
        call.ended = max(call.ended, t)
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                use_id, name, arguments = block["id"], block["name"], block.get("input") or {}
                if not isinstance(arguments, dict):
                    arguments = {}
                if use_id not in call.use_ids:
                    call.use_ids.add(use_id)
                    call.uses.append((str(use_id), str(name), arguments))
                    call.chars += len(str(name)) + len(json.dumps(arguments))
            else:
                call.chars += _size(block)

    def _user(self, thread: _Thread, message: Mapping[str, Any], t: float) -> None:
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        for result in results:
            use_id = str(result["tool_use_id"])
            size = _size(result.get("content"))
            if use_id not in self.results or self.results[use_id][0] <= t:
                self.results[use_id] = (t, size)
        if results:
            return
        if thread.prompt is None:
            thread.prompt = content if isinstance(content, str) else json.dumps(content)
            thread.first_user_chars = _size(content)
            thread.started = t
        elif thread.calls:
            thread.pending_user = t  # the user's reply: the next call opens a turn

    def session(self, session_id: str, path: Path | None) -> Session:
        origin = self.first_time or 0.0
        tasks = {
            use_id: arguments
            for call in self.main.calls
            for use_id, name, arguments in call.uses
            if name == TASK
        }
        agents = self._match_sidechains(tasks)
        dropped = self.synthetic + sum(
            len(s.calls) for root, s in self.side.items() if root not in agents.values()
        )
        root_calls = self._calls(self.main, origin)
        system = self._system_tokens(self.main)
        sub_agents: dict[str, Branch] = {}
        for use_id, root in agents.items():
            calls = self._calls(self.side[root], origin)
            first_turn = next(
                (i + 1 for i, c in enumerate(calls) if c.ends_turn), len(calls)
            )  # a sub-agent answers once
            dropped += len(calls) - first_turn
            side = self.side[root]
            opening = self._system_tokens(side)
            sub_agents[use_id] = Branch(use_id, tuple(calls[:first_turn]), min(system, opening))
        root_calls = [_with_agents(c, sub_agents) for c in root_calls]
        return Session(
            session_id=session_id,
            model=self.model or "unknown",
            root=Branch(ROOT, tuple(root_calls), system),
            skipped_lines=self.skipped,
            dropped_calls=dropped,
            path=path,
        )

    def _match_sidechains(self, tasks: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
        """Task call id -> its sidechain: the one whose task is the call's prompt,
        else the next unclaimed sidechain that started after the call."""
        free = [root for root, s in self.side.items() if s.calls]
        matched: dict[str, str] = {}
        for use_id, arguments in tasks.items():
            same = [r for r in free if self.side[r].prompt == arguments.get("prompt")]
            if same:
                matched[use_id] = same[0]
                free.remove(same[0])
        starts = {c.message_id: c.ended for c in self.main.calls}
        for call in self.main.calls:
            for use_id, name, _ in call.uses:
                if name != TASK or use_id in matched:
                    continue
                after = [r for r in free if self.side[r].started >= starts[call.message_id]]
                if after:
                    matched[use_id] = after[0]
                    free.remove(after[0])
        return matched

    def _system_tokens(self, thread: _Thread) -> int:
        """The system prefix its first prompt opens with: what the API served from
        its cache (proven identical to an earlier request), else the first prompt
        without the first user message."""
        if not thread.calls:
            return 0
        first = thread.calls[0]
        if first.cache_read > 0:
            return min(first.cache_read, first.prompt_tokens)
        user = math.ceil(thread.first_user_chars / CHARS_PER_TOKEN)
        return max(first.prompt_tokens - user, 0)

    def _calls(self, thread: _Thread, origin: float) -> list[ModelCall]:
        calls: list[ModelCall] = []
        chain = 0
        previous: _Call | None = None
        for i, raw in enumerate(thread.calls):
            nxt = thread.calls[i + 1] if i + 1 < len(thread.calls) else None
            if previous is not None and raw.prompt_tokens < previous.prompt_tokens:
                chain += 1
            uses = tuple(
                ToolUse(
                    call_id=use_id,
                    name=name,
                    kind=tool_kind(name, arguments),
                    duration_s=self._duration(use_id, raw.ended),
                    result_chars=self.results.get(use_id, (0.0, 0))[1],
                )
                for use_id, name, arguments in raw.uses
            )
            ends_turn = nxt is None or not uses or nxt.user_before is not None
            user_wait = None
            if previous is not None and raw.user_before is not None:
                user_wait = max(raw.user_before - previous.ended, 0.0)
            elif previous is not None and not previous.uses:
                user_wait = max(raw.started - previous.ended, 0.0)
            calls.append(
                ModelCall(
                    message_id=raw.message_id,
                    started=round(raw.started - origin, 3),
                    ended=round(raw.ended - origin, 3),
                    prompt_tokens=raw.prompt_tokens,
                    output_tokens=max(1, math.ceil(raw.chars / CHARS_PER_TOKEN)),
                    tools=uses,
                    chain=chain,
                    ends_turn=ends_turn,
                    user_wait_s=None if user_wait is None else round(user_wait, 3),
                )
            )
            previous = raw
        return calls

    def _duration(self, use_id: str, ended: float) -> float | None:
        result = self.results.get(use_id)
        return None if result is None else round(max(result[0] - ended, 0.0), 3)


def _with_agents(call: ModelCall, agents: Mapping[str, Branch]) -> ModelCall:
    """``call`` with each of its ``Task`` calls' sub-agent attached."""
    if not any(u.call_id in agents for u in call.tools):
        return call
    tools = tuple(dataclasses.replace(u, agent=agents.get(u.call_id)) for u in call.tools)
    return dataclasses.replace(call, tools=tools)


def parse_session(lines: Iterable[str], session_id: str, path: Path | None = None) -> Session:
    """A ``Session`` from a transcript's lines; lines that are not JSON objects of
    the expected shape are skipped and counted (``skipped_lines``), never fatal."""
    reader = _Reader()
    for text in lines:
        reader.line(text)
    return reader.session(_session_id(session_id), path)


def read_session(path: Path) -> Session:
    """The transcript at ``path`` (undecodable bytes are replaced, not fatal)."""
    with path.open(encoding="utf-8", errors="replace") as f:
        return parse_session(f, path.stem, path)


def read_sessions(directory: Path) -> list[Session]:
    """Every ``*.jsonl`` transcript under ``directory`` (recursively, as in
    ``~/.claude/projects``), by path."""
    return [read_session(p) for p in sorted(directory.rglob("*.jsonl"))]


def replayed_calls(session: Session) -> Iterator[tuple[Branch, ModelCall]]:
    """The calls a replay of ``session`` sends, in canonical order: each root call,
    then the calls of the sub-agents it starts (a call that ends its turn starts
    none: its tool calls are not run)."""
    for call in session.root.calls:
        yield session.root, call
        if not call.ends_turn:
            for use in call.tools:
                if use.agent is not None:
                    for sub in use.agent.calls:
                        yield use.agent, sub


class PromptMapper:
    """Token-id prompts of one session's calls, ``k`` ids per 64 prompt tokens.

    A call's prompt is its branch's share of the system prefix (ids keyed by the
    session's model, so sessions of one model share it) followed by its chain's
    own ids (keyed by the session, the branch and the chain): a chain's prompts
    extend each other exactly, and nothing else is shared.
    """

    def __init__(self, session: Session, k: int, vocab_size: int = 2048) -> None:
        self.k = k
        self._system = TokenMapper(f"system\0{session.model}", k, vocab_size)
        self._own = TokenMapper(session.session_id, k, vocab_size)
        chains = {(b.name, c.chain) for b in session.branches() for c in b.calls}
        self._chain = {key: i for i, key in enumerate(sorted(chains))}

    def blocks(self, call: ModelCall) -> int:
        """Prompt size in 64-token blocks (hash ids), rounded up."""
        return math.ceil(call.prompt_tokens / TRACE_BLOCK)

    def prompt(self, branch: Branch, call: ModelCall) -> list[int]:
        n = self.blocks(call)
        shared = min(branch.system_tokens // TRACE_BLOCK, n)
        base = self._chain[branch.name, call.chain] << 32
        return self._system.prompt(range(shared)) + self._own.prompt(range(base + shared, base + n))
