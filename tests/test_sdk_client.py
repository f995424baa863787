"""HintedOpenAI / HintedAsyncOpenAI and hint_scope, checked on real HTTP requests to a stub."""

from __future__ import annotations

import asyncio
import json
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import openai
import pytest

from agentsdk import NoSessionWarning
from agentsdk._client import HintedAsyncOpenAI, HintedOpenAI
from agentsdk._scope import HintArgumentError, current_hints, hint_scope
from hints_spec import (
    HEADER_NAME,
    SESSION_HEADER,
    AgentHints,
    HintErrorCode,
    parse_header,
    serialize_header,
)

_CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "hi"},
        }
    ],
}
_COMPLETION = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "text": "hi", "finish_reason": "stop", "logprobs": None}],
}
_RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "created_at": 0,
    "model": "m",
    "status": "completed",
    "output": [],
    "parallel_tool_calls": False,
    "tool_choice": "auto",
    "tools": [],
}
_CHUNK = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}],
}


@dataclass(frozen=True)
class Captured:
    path: str
    headers: list[tuple[str, str]]
    body: dict[str, Any]

    def all(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name.lower()]

    def one(self, name: str) -> str | None:
        values = self.all(name)
        assert len(values) <= 1, f"{name} sent {len(values)} times"
        return values[0] if values else None


@dataclass
class Stub:
    base_url: str
    requests: list[Captured] = field(default_factory=list)
    fail_next: list[int] = field(default_factory=list)  # statuses to answer before succeeding


@pytest.fixture
def stub() -> Iterator[Stub]:
    state = Stub(base_url="")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            body = json.loads(raw) if raw else {}
            state.requests.append(Captured(self.path, list(self.headers.items()), body))
            if state.fail_next:
                self._send(state.fail_next.pop(0), b'{"error": {"message": "boom"}}')
            elif body.get("stream"):
                events = [f"data: {json.dumps(_CHUNK)}\n\n", "data: [DONE]\n\n"]
                self._send(200, "".join(events).encode(), "text/event-stream")
            elif self.path.endswith("/chat/completions"):
                self._send(200, json.dumps(_CHAT).encode())
            elif self.path.endswith("/completions"):
                self._send(200, json.dumps(_COMPLETION).encode())
            else:
                self._send(200, json.dumps(_RESPONSE).encode())

        def _send(self, status: int, payload: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("retry-after-ms", "1")
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


_S1 = serialize_header(AgentHints(sid="s1"))


def _sync(stub: Stub) -> HintedOpenAI:
    return HintedOpenAI(api_key="sk-test", base_url=stub.base_url, max_retries=2)


def _async(stub: Stub) -> HintedAsyncOpenAI:
    return HintedAsyncOpenAI(api_key="sk-test", base_url=stub.base_url, max_retries=2)


def _chat(client: openai.OpenAI, **kwargs: object) -> None:
    client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hello"}],
        **kwargs,  # type: ignore[call-overload]
    )


def test_outside_scope_sends_what_the_plain_client_sends_and_warns_once(stub: Stub) -> None:
    plain = openai.OpenAI(api_key="sk-test", base_url=stub.base_url, max_retries=2)
    _chat(plain)
    hinted = _sync(stub)
    with pytest.warns(NoSessionWarning, match="HintedOpenAI sent a model request outside"):
        _chat(hinted)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _chat(hinted)  # once per client
    sent_plain, sent_hinted = stub.requests[:2]
    assert sent_hinted == sent_plain
    assert sent_hinted.one(HEADER_NAME) is None
    assert "prompt_cache_key" not in sent_hinted.body


def test_scope_adds_header_and_cache_key_to_chat(stub: Stub) -> None:
    with hint_scope(session="s1", branch="a", parent="root", gap=2.5, prio=1) as hints:
        _chat(_sync(stub))
    (sent,) = stub.requests
    assert sent.one(HEADER_NAME) == serialize_header(hints)
    assert parse_header(sent.one(HEADER_NAME) or "") == AgentHints(
        sid="s1", br="a", pbr="root", gap=2.5, prio=1
    )
    assert sent.body["prompt_cache_key"] == "s1"
    # Routers with session affinity hash on vLLM's session header: the session, not the branch.
    assert sent.one(SESSION_HEADER) == "s1"


def test_no_session_header_without_a_session(stub: Stub) -> None:
    with hint_scope(gap=2.0), pytest.warns(NoSessionWarning):
        _chat(_sync(stub))
    (sent,) = stub.requests
    assert sent.one(HEADER_NAME) == serialize_header(AgentHints(gap=2.0))
    assert sent.one(SESSION_HEADER) is None


def test_caller_cache_key_and_headers_win(stub: Stub) -> None:
    client = _sync(stub)
    routed = HintedOpenAI(
        api_key="sk-test", base_url=stub.base_url, default_headers={"x-session-id": "user-7"}
    )
    with hint_scope(session="s1"):
        _chat(client, prompt_cache_key="mine")
        _chat(client, extra_body={"prompt_cache_key": "extra"})
        _chat(client, extra_headers={HEADER_NAME.lower(): "v=1", "X-SESSION-ID": "route-me"})
        _chat(routed)
    kwarg, extra, header, default = stub.requests
    assert kwarg.body["prompt_cache_key"] == "mine"
    assert extra.body["prompt_cache_key"] == "extra"
    assert header.all(HEADER_NAME) == ["v=1"]
    assert header.all(SESSION_HEADER) == ["route-me"]
    assert default.all(SESSION_HEADER) == ["user-7"]
    assert default.one(HEADER_NAME) == _S1


def test_legacy_completions_get_headers_but_no_cache_key(stub: Stub) -> None:
    with hint_scope(session="s1"):
        _sync(stub).completions.create(model="m", prompt="hello")
    (sent,) = stub.requests
    assert sent.path == "/v1/completions"
    assert sent.one(HEADER_NAME) == _S1
    assert sent.one(SESSION_HEADER) == "s1"
    assert "prompt_cache_key" not in sent.body


def test_responses_get_header_and_cache_key(stub: Stub) -> None:
    with hint_scope(session="s1", branch="b"):
        _sync(stub).responses.create(model="m", input="hello")
    (sent,) = stub.requests
    assert sent.path == "/v1/responses"
    assert parse_header(sent.one(HEADER_NAME) or "") == AgentHints(sid="s1", br="b")
    assert sent.body["prompt_cache_key"] == "s1"


def test_nested_scopes_override_only_their_keys() -> None:
    assert current_hints() is None
    with hint_scope(session="s1", branch="a", ttl=60):
        with hint_scope(branch="b", parent="a"):
            assert current_hints() == AgentHints(sid="s1", br="b", pbr="a", ttl=60)
            with hint_scope(branch=None, parent=None, end=True):
                assert current_hints() == AgentHints(sid="s1", ttl=60, end=True)
        assert current_hints() == AgentHints(sid="s1", br="a", ttl=60)
    assert current_hints() is None


def test_a_new_branch_drops_the_inherited_parent() -> None:
    # br and pbr move together: a parent belongs to the branch it was given with.
    with hint_scope(session="s1", branch="b", parent="a"):
        with hint_scope(branch=None):  # back to the root branch
            assert current_hints() == AgentHints(sid="s1")
        with hint_scope(branch="c"):
            assert current_hints() == AgentHints(sid="s1", br="c")
        with hint_scope(ttl=5):
            assert current_hints() == AgentHints(sid="s1", br="b", pbr="a", ttl=5)


def test_scope_resolves_against_where_it_is_entered() -> None:
    inner = hint_scope(branch="b", parent="a")
    with hint_scope(session="s1"), inner as hints:
        assert hints == current_hints() == AgentHints(sid="s1", br="b", pbr="a")


def test_memoized_scopes_keep_type_checks() -> None:
    with hint_scope(prio=1, end=False):
        pass
    with pytest.raises(HintArgumentError) as caught:
        hint_scope(prio=True)
    assert caught.value.code is HintErrorCode.WRONG_TYPE
    with pytest.raises(HintArgumentError):
        hint_scope(end=0)  # type: ignore[arg-type]
    with pytest.raises(HintArgumentError):
        hint_scope(session=["s1"])  # type: ignore[arg-type]


def test_streaming_request_carries_header(stub: Stub) -> None:
    with hint_scope(session="s1"):
        stream = _sync(stub).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hello"}], stream=True
        )
        assert [chunk.choices[0].delta.content for chunk in stream] == ["hi"]
    (sent,) = stub.requests
    assert sent.one(HEADER_NAME) == _S1
    assert sent.body["stream"] is True


def test_retry_sends_one_header_and_the_same_body(stub: Stub) -> None:
    stub.fail_next.append(500)
    with hint_scope(session="s1", branch="a"):
        _chat(_sync(stub))
    first, retry = stub.requests
    expected = serialize_header(AgentHints(sid="s1", br="a"))
    assert first.all(HEADER_NAME) == retry.all(HEADER_NAME) == [expected]
    assert first.body == retry.body
    assert retry.body["prompt_cache_key"] == "s1"


def test_copies_stay_hinted_and_share_the_pool(stub: Stub) -> None:
    client = _sync(stub)
    copies = [client.with_options(timeout=5), client.copy(max_retries=0)]
    with hint_scope(session="s1"):
        for copy in copies:
            assert isinstance(copy, HintedOpenAI)
            assert isinstance(copy, openai.OpenAI)
            assert copy._client is client._client
            _chat(copy)
    assert [sent.one(HEADER_NAME) for sent in stub.requests] == [_S1] * 2


def test_async_scope_flows_into_tasks(stub: Stub) -> None:
    client = _async(stub)

    async def call(branch: str) -> None:
        async with hint_scope(branch=branch, parent="root"):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": branch}]
            )

    async def main() -> None:
        async with hint_scope(session="s1", branch="root"):
            await asyncio.gather(call("a"), call("b"))
            async with anyio.create_task_group() as group:
                group.start_soon(call, "c")
            await client.chat.completions.create(model="m", messages=[])
        with pytest.warns(NoSessionWarning):
            await client.chat.completions.create(model="m", messages=[])
        await client.close()  # before its event loop closes

    asyncio.run(main())
    sent = {
        str(request.body["messages"][0]["content"]) if request.body["messages"] else "": request
        for request in stub.requests[:4]
    }
    for branch in "abc":
        hints = parse_header(sent[branch].one(HEADER_NAME) or "")
        assert (hints.sid, hints.br, hints.pbr) == ("s1", branch, "root")
    assert parse_header(sent[""].one(HEADER_NAME) or "") == AgentHints(sid="s1", br="root")
    assert stub.requests[4].one(HEADER_NAME) is None
    assert isinstance(client.with_options(timeout=1), HintedAsyncOpenAI)


@pytest.mark.parametrize(
    ("kwargs", "code", "advice"),
    [
        ({"session": "has space"}, HintErrorCode.BAD_ID, "1..128 characters"),
        ({"branch": "x" * 129}, HintErrorCode.BAD_ID, "1..128 characters"),
        ({"gap": -1.0}, HintErrorCode.OUT_OF_RANGE, "gap and ttl"),
        ({"prio": 8}, HintErrorCode.OUT_OF_RANGE, "prio 0..7"),
        ({"parent": "root"}, HintErrorCode.INVALID_COMBINATION, "parent needs a branch"),
    ],
)
def test_invalid_arguments_say_what_to_change(
    kwargs: dict[str, object], code: HintErrorCode, advice: str
) -> None:
    with pytest.raises(HintArgumentError) as caught:
        hint_scope(**kwargs)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    assert caught.value.code is code
    assert advice in str(caught.value)
    assert next(iter(kwargs)) in str(caught.value)
