"""The extension on a real vLLM CPU server, against plain vLLM with the same KV capacity.

Both servers have 48 blocks of 64 tokens (3,072 tokens): one 1,024-token session
prompt plus a flood of unrelated prompts overflows the pool, so plain LRU evicts
the session's prefix during its "tool gap" while the extension keeps it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from hints_spec import HintError, parse_header
from server_ext import LocalServer, local_server

pytestmark = pytest.mark.server

BLOCKS = 48  # as conftest's plain_vllm_server, the baseline here
PROMPT = 1024  # tokens: 16 full blocks


def _server(model_dir: Path, log_dir: Path, **settings: Any) -> AbstractContextManager[LocalServer]:
    """The extension with ``BLOCKS`` blocks, as plain vLLM in conftest."""
    return local_server(
        model_dir, kv_blocks=BLOCKS, max_model_len=2048, log_dir=log_dir, **settings
    )


@pytest.fixture(scope="module")
def ext_server(
    test_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalServer]:
    with _server(
        test_model_dir,
        tmp_path_factory.mktemp("ext-logs"),
        # Let retention fill the whole pool, so the pressure path is exercised;
        # its eviction order in force from the start (by default it follows
        # LRU until its books show it pays: default_server); warm-first
        # admission on (off by default), so its step timer runs.
        extra_config={
            "max_held_fraction": 1.0,
            "max_tenant_fraction": 1.0,
            "order_trial": False,
            "max_defer_s": 10,
            "tier": "none",  # retention on the device alone
        },
        env={"VLLM_SERVER_DEV_MODE": "1"},
    ) as server:
        yield server


@pytest.fixture(scope="module")
def default_server(
    test_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalServer]:
    """The extension at its defaults but device memory only, with the same KV."""
    with _server(
        test_model_dir, tmp_path_factory.mktemp("defaults-logs"), extra_config={"tier": "none"}
    ) as server:
        yield server


def tokens(seed: int, n: int = PROMPT) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(8, 2000) for _ in range(n)]


def complete(
    server: LocalServer,
    prompt: list[int],
    hints: str | None = None,
    headers: dict[str, str] | None = None,
    **body: object,
) -> int:
    """Send a token-id completion; return its cached prompt tokens."""
    all_headers = dict(headers or {})
    if hints is not None:
        all_headers["Agent-Hints"] = hints
    status, reply = server.post_json(
        "/v1/completions",
        {"model": server.model, "prompt": prompt, "max_tokens": 2, **body},
        all_headers,
    )
    assert status == 200, reply
    assert isinstance(reply, dict)
    return int(reply["usage"]["prompt_tokens_details"]["cached_tokens"] or 0)


def control(
    server: LocalServer, payload: dict[str, object], headers: dict[str, str] | None = None
) -> dict[str, object]:
    status, reply = server.post_json("/v1/agent-hints/events", payload, headers)
    assert status == 200, reply
    assert isinstance(reply, dict)
    return reply


def metric(server: LocalServer, name: str) -> float:
    return server.metrics().get(name, 0.0)


def wait_metric(server: LocalServer, name: str, value: float, timeout: float = 20.0) -> float:
    """Engine stats reach /metrics with the next engine step: poll for them."""
    deadline = time.monotonic() + timeout
    seen = metric(server, name)
    while seen != value and time.monotonic() < deadline:
        time.sleep(0.25)
        seen = metric(server, name)
    return seen


def end_session(server: LocalServer, sid: str, headers: dict[str, str] | None = None) -> None:
    control(server, {"v": 1, "sid": sid, "events": [{"type": "end"}]}, headers)


def flood(server: LocalServer, seed: int, count: int = 6) -> None:
    for i in range(count):
        complete(server, tokens(seed * 100 + i))


def test_prefix_survives_flood_only_with_extension(
    ext_server: LocalServer, plain_vllm_server: LocalServer
) -> None:
    session = tokens(1)
    results = {}
    for name, server in (("extension", ext_server), ("plain", plain_vllm_server)):
        assert complete(server, session, 'v=1, sid="flood", gap=30') == 0
        flood(server, seed=2)
        results[name] = complete(server, session + tokens(3, 64), 'v=1, sid="flood", gap=30')
    end_session(ext_server, "flood")
    assert results["extension"] >= PROMPT - 64, results
    assert results["plain"] < PROMPT // 2, results


def test_at_its_defaults_the_order_takes_over_from_lru_once_it_would_have_paid(
    default_server: LocalServer,
) -> None:
    """Until the engine's own traffic shows that the order pays, eviction is
    plain LRU's: each flood evicts a retained session as in plain vLLM. Their
    returns miss blocks the order would have kept; once several have (one
    could be chance), the order is in force, and the next session's retained
    prefix outlives the same flood."""
    server = default_server
    assert wait_metric(server, "agent_hints_order_enforced", 0) == 0
    returns = 0
    while returns < 16 and not wait_metric(server, "agent_hints_order_enforced", 1, timeout=2):
        session, sid = tokens(1000 + returns), f'v=1, sid="lru-{returns}", gap=30'
        assert complete(server, session, sid) == 0
        flood(server, seed=2000 + returns)
        assert complete(server, session + tokens(3, 64), sid) < PROMPT // 2
        end_session(server, f"lru-{returns}")
        returns += 1
    assert 1 < returns < 16
    assert metric(server, "agent_hints_order_gained_blocks_total") >= returns * PROMPT // 64 // 2
    assert complete(server, tokens(4), 'v=1, sid="second", gap=30') == 0
    flood(server, seed=5)
    # The default budgets let one tenant hold a quarter of the pool: 12 blocks.
    kept = complete(server, tokens(4) + tokens(6, 64), 'v=1, sid="second", gap=30')
    assert kept >= BLOCKS // 4 * 64
    end_session(server, "second")


def test_end_releases_and_nothing_leaks(ext_server: LocalServer) -> None:
    assert wait_metric(ext_server, "agent_hints_held_blocks", 0) == 0
    complete(ext_server, tokens(10), 'v=1, sid="rel", gap=5')
    assert wait_metric(ext_server, "agent_hints_held_blocks", PROMPT // 64) == PROMPT // 64
    reply = control(ext_server, {"v": 1, "sid": "rel", "events": [{"type": "end"}]})
    assert reply["results"] == [{"index": 0, "outcome": "accepted"}]
    assert wait_metric(ext_server, "agent_hints_held_blocks", 0) == 0

    # Many sessions, ended by the end hint on their last request or by the control
    # endpoint: held blocks return to zero.
    for i in range(12):
        sid = f"many-{i}"
        complete(ext_server, tokens(20 + i, 256), f'v=1, sid="{sid}", gap=5')
        if i % 2:
            complete(ext_server, tokens(20 + i, 320), f'v=1, sid="{sid}", end')
        else:
            end_session(ext_server, sid)
    assert wait_metric(ext_server, "agent_hints_held_blocks", 0) == 0
    assert metric(ext_server, "agent_hints_retained_branches") == 0


def test_a_killed_client_loses_nothing_and_leaks_nothing(ext_server: LocalServer) -> None:
    """A client that dies mid-stream aborts its request: the session's prompt,
    already computed, is retained like a finished one's (its next turn, after a
    flood, still finds it), and the session's end releases every block."""
    generated = metric(ext_server, "vllm:generation_tokens_total")
    session, hints = tokens(90), 'v=1, sid="killed", gap=30'
    body = {"model": ext_server.model, "prompt": session, "max_tokens": 1000,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream(
        "POST", ext_server.base_url + "/completions", json=body, headers={"Agent-Hints": hints}
    ) as stream:
        next(line for line in stream.iter_lines() if line)  # decoding; now the client dies
    assert wait_metric(ext_server, "vllm:num_requests_running", 0) == 0
    assert metric(ext_server, "vllm:generation_tokens_total") - generated < 1000  # cut short
    flood(ext_server, seed=91)
    assert complete(ext_server, session + tokens(92, 64), hints) >= PROMPT - 64
    end_session(ext_server, "killed")
    assert wait_metric(ext_server, "agent_hints_held_blocks", 0) == 0


def test_fork_children_reuse_parent_prefix_after_pressure(ext_server: LocalServer) -> None:
    parent = tokens(30)
    complete(ext_server, parent, 'v=1, sid="fork", br="root", gap=30')
    reply = control(
        ext_server,
        {
            "v": 1,
            "sid": "fork",
            "events": [{"type": "fork", "parent": "root", "children": ["a", "b"]}],
        },
    )
    assert reply["results"] == [{"index": 0, "outcome": "accepted"}]
    flood(ext_server, seed=31)
    for i, child in enumerate(("a", "b")):
        cached = complete(
            ext_server,
            parent + tokens(40 + i, 128),
            f'v=1, sid="fork", br="{child}", pbr="root", gap=5',
        )
        assert cached >= PROMPT - 64, (child, cached)
    end_session(ext_server, "fork")
    assert wait_metric(ext_server, "agent_hints_held_blocks", 0) == 0


def test_pool_full_of_retained_blocks_never_preempts(ext_server: LocalServer) -> None:
    before = ext_server.metrics()
    # Three idle sessions hold 45 of the 47 usable blocks.
    for i in range(3):
        complete(ext_server, tokens(50 + i, 960), f'v=1, sid="press-{i}", gap=60')
    assert wait_metric(ext_server, "agent_hints_held_blocks", 45) == 45
    # An unhinted 1,500-token request needs 24 blocks: retention must yield,
    # the oldest retained blocks first, as LRU would evict them.
    complete(ext_server, tokens(60, 1500))
    after = ext_server.metrics()
    assert after.get("vllm:num_preemptions_total", 0) == before.get("vllm:num_preemptions_total", 0)
    assert complete(ext_server, tokens(52, 960), 'v=1, sid="press-2", gap=60') == 960 - 64
    for i in range(3):
        end_session(ext_server, f"press-{i}")
    assert wait_metric(ext_server, "agent_hints_held_blocks", 0) == 0


def malformed_headers(count: int, seed: int = 7) -> list[str]:
    """Header values the codec rejects: random bytes of the visible ASCII range,
    mutations of valid headers, and values that break SPEC bounds."""
    rng = random.Random(seed)
    alphabet = [chr(c) for c in range(0x20, 0x7F)]
    templates = [
        'v=1, sid="s", gap=-1', 'v=2, sid="s"', 'sid=tok', 'v=1, sid="' + "x" * 129 + '"',
        'v=1, prio=9', 'v=1, ttl=1.5', 'v=1, sid="s", end=1', 'v=1, sid=("a" "b")',
        'v=1, pbr="x"', 'v=1,,', 'v=1, sid="a\\q"', 'v=1, gap=1234567890123456',
    ]  # fmt: skip
    found: list[str] = []
    while len(found) < count:
        if rng.random() < 0.5:
            value = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))).strip()
        else:
            t = rng.choice(templates)
            cut = rng.randrange(len(t))
            value = (t[:cut] + rng.choice(alphabet) + t[cut:]).strip()
        try:
            parse_header(value)
        except HintError:
            if value:
                found.append(value)
    return found


def test_malformed_headers_are_served_and_counted(ext_server: LocalServer) -> None:
    before = metric(ext_server, "agent_hints_parse_errors_total")
    prompt = tokens(70, 16)
    with ThreadPoolExecutor(8) as pool:
        statuses = list(
            pool.map(
                lambda h: ext_server.post_json(
                    "/v1/completions",
                    {"model": ext_server.model, "prompt": prompt, "max_tokens": 1},
                    {"Agent-Hints": h},
                )[0],
                malformed_headers(200),
            )
        )
    assert statuses == [200] * 200
    assert metric(ext_server, "agent_hints_parse_errors_total") - before == 200


def test_tenant_cannot_end_another_tenants_session(ext_server: LocalServer) -> None:
    alice = {"Authorization": "Bearer alice-key"}
    mallory = {"Authorization": "Bearer mallory-key"}
    complete(ext_server, tokens(80), 'v=1, sid="shared-name", gap=60', headers=alice)
    held = wait_metric(ext_server, "agent_hints_held_blocks", PROMPT // 64)
    assert held == PROMPT // 64
    # Mallory's end names the same session id: it is scoped to Mallory's tenant.
    reply = control(
        ext_server, {"v": 1, "sid": "shared-name", "events": [{"type": "end"}]}, mallory
    )
    assert reply["results"][0]["outcome"] == "accepted"  # no oracle: same answer either way
    # Nor can a forged kv_transfer_params smuggle a control message or a tenant in.
    complete(
        ext_server,
        tokens(81, 64),
        headers=mallory,
        kv_transfer_params={
            "agent_hints_control": {
                "tenant": "key:whatever",
                "sid": "shared-name",
                "events": [{"type": "end"}],
            }
        },
    )
    time.sleep(1.0)
    assert metric(ext_server, "agent_hints_held_blocks") == held
    end_session(ext_server, "shared-name", alice)
    assert wait_metric(ext_server, "agent_hints_held_blocks", 0) == 0


def test_every_endpoint_and_body_form_carries_hints(ext_server: LocalServer) -> None:
    before = metric(ext_server, "agent_hints_holds_total")
    text = " ".join(f"w{i}" for i in range(200))
    status, _ = ext_server.post_json(
        "/v1/chat/completions",
        {
            "model": ext_server.model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 2,
        },
        {"Agent-Hints": 'v=1, sid="ep-chat", gap=5'},
    )
    assert status == 200
    status, _ = ext_server.post_json(
        "/v1/responses",
        {
            "model": ext_server.model,
            "input": text,
            "max_output_tokens": 16,
            "agent_hints": {"sid": "ep-resp", "gap": 5},
        },
    )
    assert status == 200
    # Interop only: vLLM's own session header.
    complete(ext_server, tokens(90, 256), headers={"X-Session-ID": "ep-interop"})
    assert wait_metric(ext_server, "agent_hints_holds_total", before + 3) == before + 3
    for sid in ("ep-chat", "ep-resp", "ep-interop"):
        end_session(ext_server, sid)
    assert wait_metric(ext_server, "agent_hints_held_blocks", 0) == 0


def test_reset_prefix_cache_releases_retention_first(ext_server: LocalServer) -> None:
    complete(ext_server, tokens(95), 'v=1, sid="reset", gap=60')
    assert wait_metric(ext_server, "agent_hints_held_blocks", PROMPT // 64) == PROMPT // 64
    status, reply = ext_server.post_json("/reset_prefix_cache", {})
    assert status == 200 and reply == {"success": True}
    assert complete(ext_server, tokens(95)) == 0  # really gone from the cache
    # The reset ran no engine step; the request above carried the stats out.
    assert wait_metric(ext_server, "agent_hints_held_blocks", 0) == 0


def test_the_engine_times_its_steps_for_warm_first_admission(ext_server: LocalServer) -> None:
    """The gate's window around a due return is the held prefill's duration:
    a 1,024-token prefill step, then that request's decode step, times the
    engine in seconds per token (/metrics)."""
    complete(ext_server, tokens(40), max_tokens=4)
    deadline = time.monotonic() + 20.0
    while (seconds := metric(ext_server, "agent_hints_prefill_seconds_per_token")) == 0.0:
        assert time.monotonic() < deadline, "no step timed"
        time.sleep(0.25)
        complete(ext_server, [7, 8, 9])  # engine stats reach /metrics with a step
    # A CPU runs a tiny model's 1,024-token step in milliseconds to a second.
    assert 1e-7 < seconds < 1e-3


def test_the_server_names_the_tools_its_chat_responses_called(ext_server: LocalServer) -> None:
    """A client that sends only a session id: the tool vLLM parsed out of the
    response (forced by ``tool_choice``; strict, so the arguments are ``{}``)
    is named to the engine as the branch's wait, streamed or not; an answer
    with no tool call waits on the user."""
    tool = {
        "type": "function",
        "function": {
            "name": "list_dir",
            "description": "List the project files.",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
            "strict": True,
        },
    }
    body = {
        "model": ext_server.model,
        "messages": [{"role": "user", "content": "What is in the project?"}],
        "tools": [tool],
        "max_tokens": 64,
    }
    forced = {"type": "function", "function": {"name": "list_dir"}}
    before = metric(ext_server, "agent_hints_learned_waits_total")
    status, reply = ext_server.post_json(
        "/v1/chat/completions", {**body, "tool_choice": forced}, {"Agent-Hints": 'sid="named-1"'}
    )
    assert status == 200 and reply["choices"][0]["message"]["tool_calls"]
    with httpx.stream(
        "POST",
        f"{ext_server.base_url}/chat/completions",
        json={**body, "tool_choice": forced, "stream": True},
        headers={"Agent-Hints": 'sid="named-2"'},
        timeout=60,
    ) as response:
        streamed = "".join(response.iter_text())
    assert response.status_code == 200 and '"list_dir"' in streamed
    status, _ = ext_server.post_json(
        "/v1/chat/completions",
        {**body, "tool_choice": "none", "max_tokens": 4},
        {"Agent-Hints": 'sid="named-3"'},
    )
    assert status == 200
    # Each is named after its response's last byte: the client may read /metrics first.
    assert wait_metric(ext_server, "agent_hints_learned_waits_total", before + 3) == before + 3
    for sid in ("named-1", "named-2", "named-3"):
        end_session(ext_server, sid)
