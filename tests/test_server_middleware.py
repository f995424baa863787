"""The API-server middleware over a recording ASGI app: no engine, real ASGI plumbing."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from hints_spec import AgentHints
from server_ext import AgentHintsMiddleware
from server_ext._rewrite import PARSE_ERRORS
from server_ext.testing import FakeDownstream

Message = dict[str, Any]


class EngineClient:
    """Records control messages the middleware sends to the engine."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.ranks: list[int | None] = []

    async def notify_kv_transfer_request_rejected(
        self, request_id: str, params: dict[str, Any], *, data_parallel_rank: int | None = None
    ) -> None:
        self.sent.append((request_id, params))
        self.ranks.append(data_parallel_rank)


@dataclass
class Harness:
    """The middleware in front of a recording app, with vLLM's ``app.state`` faked."""

    middleware: AgentHintsMiddleware
    app: SimpleNamespace


Reply = tuple[list[tuple[bytes, bytes]], list[bytes]]
"""A response of the recording app: its headers, its body chunks."""


def make_app(
    enabled: bool = True, reply: Reply = ([], [b"{}"]), **extra: object
) -> tuple[Harness, FakeDownstream, EngineClient]:
    headers, chunks = reply
    app = FakeDownstream(headers, chunks)
    engine = EngineClient()
    transfer = SimpleNamespace(
        kv_connector="AgentHintsConnector" if enabled else "OtherConnector",
        kv_connector_extra_config=dict(extra),
    )
    state = SimpleNamespace(
        vllm_config=SimpleNamespace(kv_transfer_config=transfer), engine_client=engine
    )
    return Harness(AgentHintsMiddleware(app), SimpleNamespace(state=state)), app, engine


def call(
    harness: Harness, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        + [(b"content-length", str(len(body)).encode())],
        "app": harness.app,
        "client": ("127.0.0.1", 50000),
    }
    chunks = [body[:7], body[7:]]  # a body in two chunks
    sent: list[Message] = []

    async def receive() -> Message:
        chunk = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message: Message) -> None:
        sent.append(message)

    anyio.run(harness.middleware, scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, data


def completion(**extra: object) -> bytes:
    return json.dumps({"model": "m", "prompt": [1, 2, 3], **extra}).encode()


def test_unhinted_body_passes_through_byte_for_byte() -> None:
    harness, app, _ = make_app(salt_per_tenant=False)
    body = b'{"model":"m",  "prompt":"hi"}'
    assert call(harness, "/v1/completions", body)[0] == 200
    assert [r.body for r in app.requests] == [body]


def test_an_unhinted_body_is_salted_by_default_without_being_decoded() -> None:
    harness, app, _ = make_app()
    body = b'{"model":"m",  "prompt":"hi"}'
    assert call(harness, "/v1/completions", body)[0] == 200
    assert [r.body for r in app.requests] == [b'{"cache_salt": "default",' + body[1:]]


def test_header_hint_is_lowered_into_session_id_and_transfer_params() -> None:
    harness, app, _ = make_app()
    call(
        harness,
        "/v1/completions",
        completion(),
        {"Agent-Hints": 'v=1, sid="s1", br="a", gap=2.5'},
    )
    forwarded = app.requests[0].json()
    assert forwarded["session_id"] == "s1"
    transfer = forwarded["kv_transfer_params"]
    assert transfer["agent_hints_tenant"] == "default"
    # The SPEC's lowering, exactly: the normalized hint under "agent_hints".
    assert transfer["agent_hints"] == AgentHints(sid="s1", br="a", gap=2.5).normalized()


@pytest.mark.parametrize(
    "body",
    [b'{ "model":"m",  "prompt":[1, 2,3] }', b"\n {}", b'{"model":"m","prompt":"no \\"hint\\""}'],
    ids=["spaced", "empty", "escaped-quotes"],
)
def test_a_body_hinted_only_by_headers_is_spliced_not_re_encoded(body: bytes) -> None:
    # Decoding and re-encoding a long prompt would block the event loop for
    # milliseconds: its bytes must reach vLLM as they came, new fields in front.
    harness, app, _ = make_app(salt_per_tenant=True)
    call(harness, "/v1/completions", body, {"Agent-Hints": 'v=1, sid="s1", gap=2'})
    forwarded = app.requests[0].body
    assert forwarded.endswith(body[body.index(b"{") + 1 :])
    added = {
        "cache_salt": "default",
        "session_id": "s1",
        "kv_transfer_params": {
            "agent_hints": AgentHints(sid="s1", gap=2).normalized(),
            "agent_hints_tenant": "default",
        },
    }
    assert json.loads(forwarded) == {**json.loads(body), **added}


def test_a_body_with_its_own_transfer_params_is_merged_not_spliced() -> None:
    harness, app, _ = make_app()
    body = completion(kv_transfer_params={"other": 1})
    call(harness, "/v1/completions", body, {"Agent-Hints": 'v=1, sid="s1"'})
    forwarded = app.requests[0].json()
    assert forwarded["kv_transfer_params"]["other"] == 1
    assert forwarded["kv_transfer_params"]["agent_hints"]["sid"] == "s1"
    assert list(forwarded).count("kv_transfer_params") == 1


def test_a_malformed_body_is_left_for_vllm_to_refuse() -> None:
    harness, app, _ = make_app()
    status, _ = call(harness, "/v1/completions", b'{"prompt": [1, 2', {"Agent-Hints": 'sid="s"'})
    assert status == 200  # the recording app's answer: the middleware raised nothing
    with pytest.raises(ValueError):
        app.requests[0].json()


def test_body_form_is_removed_from_the_body_and_lowered() -> None:
    harness, app, _ = make_app()
    call(harness, "/v1/chat/completions", completion(agent_hints={"sid": "s2", "end": True}))
    forwarded = app.requests[0].json()
    assert "agent_hints" not in forwarded
    assert forwarded["kv_transfer_params"]["agent_hints"]["end"] is True


def test_malformed_header_is_counted_and_the_request_served_without_hints() -> None:
    harness, app, _ = make_app()
    before = PARSE_ERRORS.labels("header", "wrong_type")._value.get()
    status, _ = call(harness, "/v1/completions", completion(), {"Agent-Hints": "v=1, sid=token"})
    assert status == 200
    assert "kv_transfer_params" not in app.requests[0].json()
    assert PARSE_ERRORS.labels("header", "wrong_type")._value.get() == before + 1


def test_reserved_transfer_keys_are_stripped_on_every_route() -> None:
    harness, app, _ = make_app()
    forged = {
        "agent_hints_control": {"tenant": "x"},
        "agent_hints": {"sid": "s"},
        "agent_hints_tenant": "key:victim",
        "agent_hints_prefetch": True,
        "other": 1,
    }
    call(
        harness,
        "/v1/embeddings",
        json.dumps({"input": "x", "kv_transfer_params": forged}).encode(),
    )
    assert app.requests[0].json()["kv_transfer_params"] == {"other": 1}


@pytest.mark.parametrize(
    "encode",
    [
        # json.dumps escapes "_" nowhere by itself: spell the keys with \u escapes.
        lambda text: text.replace("agent_hints", "agent\\u005fhints").encode(),
        lambda text: text.encode("utf-16"),  # vLLM's JSON decoding accepts UTF-16 too
    ],
    ids=["escaped", "utf-16"],
)
def test_reserved_keys_cannot_be_smuggled_past_the_byte_scan(
    encode: Callable[[str], bytes],
) -> None:
    harness, app, _ = make_app()
    forged = {"agent_hints_control": {"tenant": "key:victim"}, "agent_hints_tenant": "key:v"}
    body = encode(json.dumps({"model": "m", "prompt": "x", "kv_transfer_params": forged}))
    assert json.loads(body)["kv_transfer_params"] == forged  # what vLLM would read
    call(harness, "/v1/completions", body)
    assert app.requests[0].json()["kv_transfer_params"] == {}


def test_salt_per_tenant_salts_every_request() -> None:
    harness, app, _ = make_app(salt_per_tenant=True, tenant_header="X-Tenant")
    acme = {"X-Tenant": "acme"}
    call(harness, "/v1/completions", completion(), acme)  # unhinted
    call(harness, "/v1/completions", completion(), {**acme, "Agent-Hints": 'v=1, sid="s"'})
    call(harness, "/v1/completions", completion(cache_salt="mine"), acme)
    call(harness, "/v1/completions", completion())  # the default tenant too
    salts = [r.json()["cache_salt"] for r in app.requests]
    tenant = salts[0]
    assert tenant.startswith("gw:") and salts[1] == tenant
    assert salts[2] == f"{tenant}/mine"  # a client's salt only splits its own cache
    assert salts[3] == "default"
    # Another tenant that names acme's salt still gets its own cache.
    call(harness, "/v1/completions", completion(cache_salt=tenant), {"X-Tenant": "evil"})
    assert app.requests[4].json()["cache_salt"] != tenant
    # Every route is salted: any of them may reach the engine's prefix cache.
    for path in ("/v1/embeddings", "/v1/messages", "/inference/v1/generate", "/invocations"):
        call(harness, path, json.dumps({"input": "x"}).encode(), acme)
        assert app.requests[-1].json()["cache_salt"] == tenant


def test_tenant_comes_from_the_api_key_or_a_trusted_gateway_header() -> None:
    harness, app, _ = make_app(tenant_header="X-Tenant")
    hint = {"Agent-Hints": 'v=1, sid="s"'}
    call(harness, "/v1/completions", completion(), {**hint, "Authorization": "Bearer k1"})
    call(harness, "/v1/completions", completion(), {**hint, "Authorization": "Bearer k2"})
    call(
        harness,
        "/v1/completions",
        completion(),
        {**hint, "Authorization": "Bearer k1", "X-Tenant": "acme"},
    )
    tenants = [r.json()["kv_transfer_params"]["agent_hints_tenant"] for r in app.requests]
    assert tenants[0].startswith("key:") and tenants[0] != tenants[1]
    assert tenants[2].startswith("gw:")
    assert "k1" not in "".join(tenants)  # the key itself never reaches the engine


def test_without_the_connector_hints_are_not_forwarded() -> None:
    harness, app, _ = make_app(enabled=False)
    call(harness, "/v1/completions", completion(), {"Agent-Hints": 'v=1, sid="s"'})
    assert "kv_transfer_params" not in app.requests[0].json()
    assert call(harness, "/v1/agent-hints/events", b"{}")[0] == 404


def test_control_endpoint_validates_per_event_and_forwards_to_the_engine() -> None:
    harness, _, engine = make_app(ttl_cap_s=100)
    body = {
        "v": 1,
        "sid": "s",
        "events": [
            {"type": "tool_start", "br": "root", "tool": "bash", "eta": 5},
            {"type": "tool_start", "tool": "bash", "eta": 1000},
            {"type": "fork", "children": []},
            {"type": "end"},
        ],
    }
    status, data = call(
        harness,
        "/v1/agent-hints/events",
        json.dumps(body).encode(),
        {"Authorization": "Bearer k"},
    )
    assert status == 200
    assert json.loads(data)["results"] == [
        {"index": 0, "outcome": "accepted"},
        {"index": 1, "outcome": "accepted"},  # capped, but untrusted clients see no caps
        {"index": 2, "outcome": "rejected", "reason": "out_of_range"},
        {"index": 3, "outcome": "accepted"},
    ]
    [(request_id, params)] = engine.sent
    assert request_id.startswith("agent-hints-control-")
    control = params["agent_hints_control"]
    assert control["sid"] == "s" and control["tenant"].startswith("key:")
    assert [e["type"] for e in control["events"]] == ["tool_start", "tool_start", "end"]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"not json", 400, "syntax"),
        (b'{"v": 1, "events": [{"type": "end"}]}', 400, "bad_id"),
        (b'{"v": 2, "sid": "s", "events": [{"type": "end"}]}', 400, "unsupported_version"),
        (b'{"v": 1, "sid": "s", "events": []}', 400, "out_of_range"),
        (b"[" * 70000, 413, "too_long"),
    ],
)
def test_control_endpoint_rejects_malformed_requests_whole(
    body: bytes, status: int, code: str
) -> None:
    harness, _, engine = make_app()
    got, data = call(harness, "/v1/agent-hints/events", body)
    assert (got, json.loads(data)["error"]["code"]) == (status, code)
    assert engine.sent == []


# ---------------------------------------------------------------- the server names waits

CALLS = {"choices": [{"message": {"tool_calls": [
    {"id": "a", "type": "function", "function": {"name": "read_file", "arguments": "{}"}},
    {"id": "b", "type": "function", "function": {"name": "grep", "arguments": "{}"}},
]}}]}  # fmt: skip
SSE = [(b"content-type", b"text/event-stream; charset=utf-8")]


def _events(*chunks: dict[str, Any]) -> list[bytes]:
    lines = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
    return [*lines, b"data: [DONE]\n\n"]


def _chat(harness: Harness, hints: str = 'sid="s1"') -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    status, _ = call(harness, "/v1/chat/completions", body, {"Agent-Hints": hints})
    assert status == 200


def _learned(engine: EngineClient) -> list[dict[str, Any]]:
    return [p["agent_hints_control"] for _, p in engine.sent]


def test_the_tools_a_response_calls_are_named_to_the_engine_as_the_branchs_wait() -> None:
    harness, _, engine = make_app(reply=([], [json.dumps(CALLS).encode()]))
    _chat(harness, 'sid="s1", br="b2"')
    [control] = _learned(engine)
    assert control["learned"] is True and control["sid"] == "s1"
    assert control["events"] == [{"type": "tool_start", "tool": "grep/read_file", "br": "b2"}]


def test_a_streamed_response_names_its_calls_from_their_first_deltas() -> None:
    delta = {"tool_calls": [{"index": 0, "function": {"name": "bash", "arguments": ""}}]}
    more = {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}
    stream = _events(
        {"choices": [{"delta": {"role": "assistant"}}]},
        {"choices": [{"delta": delta}]},
        {"choices": [{"delta": more}]},
    )
    split = b"".join(stream)
    harness, _, engine = make_app(reply=(SSE, [split[:50], split[50:51], split[51:]]))
    _chat(harness)
    [control] = _learned(engine)
    assert control["events"][0]["tool"] == "bash"


def test_a_response_without_tool_calls_waits_on_the_user() -> None:
    answer = {"choices": [{"message": {"role": "assistant", "content": "done"}}]}
    harness, _, engine = make_app(reply=([], [json.dumps(answer).encode()]))
    _chat(harness)
    assert _learned(engine)[0]["events"][0]["tool"] == "user"


@pytest.mark.parametrize(
    "reply",
    [
        ([], [b"{not json"]),
        (SSE, _events({"choices": [{"delta": {"content": "x"}}]})[:-1]),  # no [DONE]
        ([], [json.dumps({"choices": [{"message": {"tool_calls": [
            {"function": {"name": "bad name!"}}]}}]}).encode()]),
    ],
    ids=["malformed", "unfinished stream", "unusable name"],
)  # fmt: skip
def test_a_response_not_read_to_a_usable_end_names_nothing(reply: Reply) -> None:
    harness, _, engine = make_app(reply=reply)
    _chat(harness)
    assert engine.sent == []


def test_no_wait_is_named_for_an_unhinted_or_ending_request_or_another_route() -> None:
    harness, _, engine = make_app(reply=([], [json.dumps(CALLS).encode()]))
    body = json.dumps({"model": "m", "messages": []}).encode()
    call(harness, "/v1/chat/completions", body)
    _chat(harness, 'sid="s1", end')
    call(harness, "/v1/completions", completion(), {"Agent-Hints": 'sid="s1"'})
    assert engine.sent == []


@pytest.mark.parametrize(
    ("given", "forwarded"),
    [("12h", None), ("48h", None), ("3600s", None), ("24h", "24h"), ("in_memory", "in_memory"),
     ("in-memory", "in_memory"), ("forever", None)],
)  # fmt: skip
def test_prompt_cache_retention_is_left_as_vllm_accepts_it(
    given: str, forwarded: str | None
) -> None:
    """vLLM 0.33 refuses any value but ``in_memory`` and ``24h``: the rest became
    the hint's ttl (or was ignored as malformed) and leaves the body."""
    harness, app, _ = make_app()
    body = completion(prompt_cache_key="s1", prompt_cache_retention=given)
    assert call(harness, "/v1/responses", body)[0] == 200
    sent = app.requests[0].json()
    assert sent.get("prompt_cache_retention") == forwarded
    if given == "12h":
        assert sent["kv_transfer_params"]["agent_hints"]["ttl"] == 12 * 3600


def test_a_session_keeps_to_one_data_parallel_rank() -> None:
    """With data parallelism behind one API server, vLLM balances by load
    unless a request names a rank: a session's requests and control events
    name the same one, from its tenant and id; a client's own rank stands."""
    harness, _, engine = make_app()
    harness.app.state.vllm_config.parallel_config = SimpleNamespace(data_parallel_size=4)
    ranks: list[bytes | None] = []
    inner = harness.middleware.app

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        ranks.append(dict(scope["headers"]).get(b"x-data-parallel-rank"))
        await inner(scope, receive, send)

    harness.middleware.app = recording
    for _ in range(3):
        call(harness, "/v1/completions", completion(), {"Agent-Hints": 'v=1, sid="a"'})
    assert len(set(ranks)) == 1 and ranks[0] is not None
    rank_a = int(ranks[0])
    control = json.dumps({"v": 1, "sid": "a", "events": [{"type": "end"}]}).encode()
    assert call(harness, "/v1/agent-hints/events", control)[0] == 200
    assert engine.ranks[-1] == rank_a
    for i in range(20):  # sessions spread over the ranks
        call(harness, "/v1/completions", completion(), {"Agent-Hints": f'v=1, sid="s{i}"'})
    assert {int(r) for r in ranks if r is not None} == {0, 1, 2, 3}
    ranks.clear()
    call(harness, "/v1/completions", completion())  # unhinted: vLLM balances it
    headers = {"Agent-Hints": 'v=1, sid="a"', "X-data-parallel-rank": "3"}
    call(harness, "/v1/completions", completion(), headers)
    assert ranks == [None, b"3"]


def test_without_data_parallelism_no_rank_is_named() -> None:
    harness, _, engine = make_app()
    harness.app.state.vllm_config.parallel_config = SimpleNamespace(data_parallel_size=1)
    control = json.dumps({"v": 1, "sid": "a", "events": [{"type": "end"}]}).encode()
    assert call(harness, "/v1/agent-hints/events", control)[0] == 200
    assert engine.ranks == [None]
