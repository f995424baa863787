"""The tool calls of the server's own chat completions, as they are sent (API side).

vLLM parses the tool calls out of what the model generated (``--tool-call-parser``)
and answers them by name. A branch whose response calls tools waits on them; one
whose response calls none waits on its user. Named to the engine, that wait
lets the server learn gaps per tool for clients that send only a session id (a
client's own ``tool_start`` comes first, whenever it arrives).
"""

from __future__ import annotations

import json
import re
from typing import Any

from hints_spec import ID_PATTERN, USER_TOOL

__all__ = ["MAX_BODY_BYTES", "ToolCallNames"]

MAX_BODY_BYTES = 1 << 20
"""A response (or one streamed event) longer than this is not read for names."""
_ID = re.compile(ID_PATTERN)


class ToolCallNames:
    """Reads a chat completion response as it passes (``start``, then ``feed``
    each body chunk) and names what the branch waits on (``wait``).

    Streamed (server-sent events): only the lines that mention ``tool_calls``
    are decoded, and the first delta of each call names it; the stream must
    reach ``[DONE]``. Not streamed: the JSON body, kept up to
    ``MAX_BODY_BYTES``. Anything unexpected names nothing.
    """

    def __init__(self) -> None:
        self._ok = False
        self._streamed = False
        self._buffer = bytearray()
        self._names: list[str] = []
        self._calls = 0
        self._done = False
        self._broken = False

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """The response's status and headers."""
        self._ok = status == 200
        content_type = next((v for k, v in headers if k.lower() == b"content-type"), b"")
        self._streamed = content_type.startswith(b"text/event-stream")

    def feed(self, chunk: bytes) -> None:
        """One body chunk."""
        if not self._ok or self._broken or not chunk:
            return
        self._buffer += chunk
        if not self._streamed:
            self._broken = len(self._buffer) > MAX_BODY_BYTES
            return
        *lines, rest = bytes(self._buffer).split(b"\n")
        self._buffer = bytearray(rest)
        self._broken = len(rest) > MAX_BODY_BYTES
        for line in lines:
            data = line.strip().removeprefix(b"data:").strip()
            if data == b"[DONE]":
                self._done = True
            elif b'"tool_calls"' in data:
                self._read_chunk(data)

    def wait(self) -> str | None:
        """What the branch waits on once the response is complete: its tools'
        names (several: sorted, joined by ``/``), ``user`` when it called none,
        or None when the response was not read to its end."""
        if not self._ok or self._broken:
            return None
        if not self._streamed:
            if not self._read_body(bytes(self._buffer)):
                return None
        elif not self._done:
            return None
        if not self._calls:
            return USER_TOOL
        name = "/".join(sorted(set(self._names)))
        usable = len(self._names) == self._calls and _ID.fullmatch(name)
        return name if usable else None

    def _read_chunk(self, data: bytes) -> None:
        try:
            chunk = json.loads(data)
            calls = chunk["choices"][0]["delta"]["tool_calls"]
        except (ValueError, LookupError, TypeError, RecursionError):
            return
        self._add(calls)

    def _read_body(self, body: bytes) -> bool:
        try:
            message = json.loads(body)["choices"][0]["message"]
        except (ValueError, LookupError, TypeError, RecursionError):
            return False
        if not isinstance(message, dict):
            return False
        self._add(message.get("tool_calls"))
        return True

    def _add(self, calls: Any) -> None:
        """Count the calls that ``calls`` starts (the ones naming a function;
        a streamed call's later deltas name none) and keep their names (a
        protocol id, checked in ``wait``)."""
        for call in calls if isinstance(calls, list) else ():
            function = call.get("function") if isinstance(call, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if name is None:
                continue
            self._calls += 1
            if isinstance(name, str):
                self._names.append(name)
