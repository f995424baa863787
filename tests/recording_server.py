"""An OpenAI-compatible HTTP server on 127.0.0.1 that records every request in arrival order.

Real sockets and a thread per connection, so concurrent control POSTs can overtake each
other as they would on the wire (``control_delay`` widens the window). Chat replies come
from ``reply(body)``, streamed as server-sent events when the request asks for a stream.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hints_spec import CONTROL_PATH, HEADER_NAME, parse_header

from sdk_calls import _sse, chat_reply


@dataclass
class Recorded:
    """One request: ``kind`` is ``chat`` or ``control``."""

    kind: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def hints(self) -> dict[str, object]:
        return parse_header(self.headers[HEADER_NAME.lower()]).normalized()


@dataclass
class RecordingServer:
    reply: Callable[[dict[str, Any]], dict[str, Any]] = lambda body: chat_reply("done")
    control_delay: float = 0.0  # a random pause up to this long before answering a POST
    log: list[Recorded] = field(default_factory=list)
    base_url: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def chats(self) -> list[Recorded]:
        return [r for r in self.log if r.kind == "chat"]

    @property
    def control(self) -> list[Recorded]:
        return [r for r in self.log if r.kind == "control"]

    def hints(self) -> list[dict[str, object]]:
        return [r.hints for r in self.chats]

    def events(self, sid: str | None = None) -> list[dict[str, Any]]:
        return [
            event
            for r in self.control
            if sid is None or r.body["sid"] == sid
            for event in r.body["events"]
        ]

    def clear(self) -> None:
        with self._lock:
            self.log.clear()

    def _record(self, kind: str, headers: dict[str, str], body: dict[str, Any]) -> None:
        with self._lock:
            self.log.append(Recorded(kind, headers, body))


@contextmanager
def recording_server(
    reply: Callable[[dict[str, Any]], dict[str, Any]] | None = None, control_delay: float = 0.0
) -> Iterator[RecordingServer]:
    server = RecordingServer(control_delay=control_delay)
    if reply is not None:
        server.reply = reply

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            headers = {k.lower(): v for k, v in self.headers.items()}
            if self.path == CONTROL_PATH:
                server._record("control", headers, body)
                time.sleep(random.uniform(0, server.control_delay))
                results = [{"index": i, "outcome": "accepted"} for i in range(len(body["events"]))]
                self._send(json.dumps({"v": 1, "results": results}).encode(), "application/json")
            elif self.path == "/v1/chat/completions":
                server._record("chat", headers, body)
                answer = server.reply(body)
                if body.get("stream"):
                    self._send(_sse(answer), "text/event-stream")
                else:
                    self._send(json.dumps(answer).encode(), "application/json")
            else:
                self.send_error(404)

        def _send(self, content: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    server.base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
