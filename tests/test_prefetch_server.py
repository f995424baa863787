"""Prefetch on a real vLLM CPU server: a warm-up brings an evicted session back.

48 blocks of 64 tokens and ``max_held_fraction`` 0.2 (9 blocks): retention alone
cannot keep a 1,024-token (16-block) session through a flood of unrelated
prompts. With the hints saying the session is back in 3 s, the prefetcher
re-prefills its prompt once the flood is over, before it returns; a session
whose return is not due yet (gap 600 s) gets no warm-up and stays evicted. A
warm-up also runs beside another request's decode, and sits out the steps of
another request's prefill (a step budget of 128 tokens: a prefill takes several
steps). The same through the SDK: an agent's tool announced with its ETA.

Warm-first admission stays off here (``max_defer_s`` 0, the default, pinned): in
its trial's gated epochs it would hold the cold prefills back for the session due
in 3 s, and a warm-up yields only to a prefill that is scheduled. The gate is tested in
test_policy_admission and test_prefetch_engine.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import httpx
import pytest

from agentsdk import Agent, InMemorySession, ModelSettings, tool
from server_ext import LocalServer, local_server

from sdk_calls import run_recording

pytestmark = pytest.mark.server

PROMPT = 1024  # tokens: 16 full blocks
YIELDS = "agent_hints_warmup_yields_total"


@pytest.fixture(scope="module")
def server(test_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    with local_server(
        test_model_dir,
        kv_blocks=48,
        max_model_len=2048,
        extra_config={
            "prefetch": True,
            "max_held_fraction": 0.2,
            "state_metrics": True,
            "max_defer_s": 0,
            "tier": "none",  # warm-ups recompute; a tier would load instead
        },
        args=["--max-num-batched-tokens", "128"],
        log_dir=tmp_path_factory.mktemp("prefetch-logs"),
    ) as server:
        yield server


def tokens(seed: int, n: int = PROMPT) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(8, 2000) for _ in range(n)]


def complete(server: LocalServer, prompt: list[int], hints: str | None = None) -> int:
    """Send a token-id completion; return its cached prompt tokens."""
    status, reply = server.post_json(
        "/v1/completions",
        {"model": server.model, "prompt": prompt, "max_tokens": 2},
        {"Agent-Hints": hints} if hints else {},
    )
    assert status == 200, reply
    assert isinstance(reply, dict)
    return int(reply["usage"]["prompt_tokens_details"]["cached_tokens"] or 0)


def prefetches(result: str) -> str:
    """The series of ``agent_hints_prefetch_total`` for ``result``."""
    return f'agent_hints_prefetch_total{{result="{result}"}}'


def scenario(server: LocalServer, sid: str, gap: float, seed: int) -> dict[str, float]:
    """Session prompt, a concurrent flood, idle past the gap (and past the warm-up,
    if any), the return. Reports the return's cached tokens, timings and deltas
    of the prefetch and engine counters."""
    before = server.metrics()
    session = tokens(seed)
    hints = f'v=1, sid="{sid}", gap={gap}'
    assert complete(server, session, hints) == 0
    departed = time.monotonic()
    with ThreadPoolExecutor(6) as pool:  # all in flight at once: the engine is busy
        list(pool.map(lambda i: complete(server, tokens(seed * 100 + i)), range(6)))
    flood_s = time.monotonic() - departed
    deadline, completed = departed + 20.0, prefetches("completed")
    while time.monotonic() < departed + 5.0 or (  # idle > the 3 s gap ...
        gap < 60  # ... and, when one is due, until the warm-up is done
        and server.metrics().get(completed, 0) == before.get(completed, 0)
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    cached = complete(server, session + tokens(seed + 1, 64), hints)
    returned_s = time.monotonic() - departed
    time.sleep(1.0)  # engine stats reach /metrics with the steps after the return
    after = server.metrics()
    status, _ = server.post_json(
        "/v1/agent-hints/events", {"v": 1, "sid": sid, "events": [{"type": "end"}]}
    )
    assert status == 200
    results = ("issued", "completed", "cancelled", "skipped", "failed")
    deltas = {r: after.get(prefetches(r), 0) - before.get(prefetches(r), 0) for r in results}
    for name in ("agent_hints_holds_total", "agent_hints_returns_total"):
        deltas[name] = after.get(name, 0) - before.get(name, 0)
    return {"cached": cached, "flood_s": flood_s, "returned_s": returned_s, **deltas}


def test_warmup_brings_an_evicted_session_back_before_it_returns(server: LocalServer) -> None:
    warm = scenario(server, "due", gap=3, seed=1)
    cold = scenario(server, "not-due", gap=600, seed=2)
    print(f"\nwith a warm-up: {warm}\nwithout: {cold}")
    assert (warm["issued"], warm["completed"]) == (1, 1), warm
    assert warm["cached"] >= PROMPT - 64, (warm, cold)
    # The warm-up retained the branch again and its real return released that
    # retention (the flood had released the first one).
    assert warm["agent_hints_returns_total"] == 1, warm
    assert cold["issued"] == 0 and cold["cached"] < PROMPT // 2, cold


def test_a_warmup_runs_beside_another_requests_decode(server: LocalServer) -> None:
    """Warm-ups give way to prefills, not to decodes: while an unrelated stream
    decodes from before the session's warm-up is due until after it returns,
    the warm-up still runs, and the return finds the session cached."""
    before = server.metrics()
    session, hints = tokens(4), 'v=1, sid="beside-decode", gap=3'
    assert complete(server, session, hints) == 0
    departed = time.monotonic()
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda i: complete(server, tokens(400 + i)), range(6)))
    completed = prefetches("completed")
    body = {"model": server.model, "prompt": tokens(5, 32), "max_tokens": 1500,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", server.base_url + "/completions", json=body, timeout=60) as stream:
        chunks = (line for line in stream.iter_lines() if line)  # SSE events
        next(chunks)  # its first token: it decodes from here on
        while server.metrics().get(completed, 0) == before.get(completed, 0):
            assert time.monotonic() < departed + 20.0, "no warm-up beside the decode"
            time.sleep(0.2)
        cached = complete(server, session + tokens(6, 64), hints)
        decoding = next(chunks, "")  # the stream still runs: the warm-up was beside it
    status, _ = server.post_json(
        "/v1/agent-hints/events", {"v": 1, "sid": "beside-decode", "events": [{"type": "end"}]}
    )
    assert status == 200
    assert decoding.startswith("data: {"), decoding
    assert cached >= PROMPT - 64


@pytest.mark.xfail(
    reason="timing: the cold requests must land inside a warm-up of about 0.2 s here, and "
    "few enough of them that the warmed prompt is not evicted; the yielding itself is tested "
    "deterministically on vLLM's scheduler in test_prefetch_preemption",
    strict=False,
)
def test_a_warmup_sits_out_the_steps_of_a_real_prefill(server: LocalServer) -> None:
    """vLLM schedules running requests before waiting ones, so a warm-up in the
    middle of its 15-step prefill would take every step's budget until done. It
    sits out the steps of a cold request that arrives while it runs instead,
    resumes and completes, and the session's return finds its prompt cached.

    The whole warm-up takes about 13 engine steps, 0.2 s on a 2-core machine:
    the cold requests must land inside that window. So the test watches for
    the warm-up's issue with nothing else in flight (one cold request between
    two looks at ``/metrics`` once took the window whole), then a thread sends
    2-step cold prefills back to back until the warm-up has yielded or
    completed. It stops then: unhinted requests may take a retention's room,
    and more of them could evict the warmed prompt."""
    before = server.metrics()
    long = 1920  # tokens: 15 steps of 128
    session, hints = tokens(7, long), 'v=1, sid="yields", gap=3'
    assert complete(server, session, hints) == 0
    departed = time.monotonic()
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda i: complete(server, tokens(800 + i)), range(6)))
    issued, completed = prefetches("issued"), prefetches("completed")
    while server.metrics().get(issued, 0) == before.get(issued, 0):
        assert time.monotonic() < departed + 20.0, "no warm-up issued"
        time.sleep(0.01)
    done = threading.Event()
    sent = itertools.count()

    def cold_stream() -> None:
        while not done.is_set():  # cold prefills of 2 steps (5 blocks, unretained)
            assert complete(server, tokens(900 + next(sent), 256)) == 0

    def waiting() -> bool:
        now = server.metrics()
        return all(now.get(k, 0) == before.get(k, 0) for k in (completed, YIELDS))

    with ThreadPoolExecutor(1) as pool:
        stream = pool.submit(cold_stream)
        try:
            while waiting():
                assert time.monotonic() < departed + 20.0, "no warm-up completed"
                time.sleep(0.01)
        finally:
            done.set()
        stream.result()
    cached = complete(server, session + tokens(10, 64), hints)
    time.sleep(1.0)  # engine stats reach /metrics with the steps after the return
    yields = server.metrics().get(YIELDS, 0)
    status, _ = server.post_json(
        "/v1/agent-hints/events", {"v": 1, "sid": "yields", "events": [{"type": "end"}]}
    )
    assert status == 200
    assert yields - before.get(YIELDS, 0) >= 2
    assert cached >= long - 64


@pytest.mark.anyio
async def test_an_sdk_tools_eta_brings_the_agents_kv_back_before_the_tool_returns(
    server: LocalServer,
) -> None:
    """The co-design end to end: the SDK announces a 5 s tool (``tool_start`` with
    its ETA); while it runs, a flood evicts the agent's context; the server warms
    it again just before the predicted return, so the agent's next call is served
    from the cache. (Retention alone may hold 9 of its ~25 blocks here; with an ETA
    past the return, 60 s, no warm-up ran and the call got 0 cached tokens.)"""
    rng = random.Random(3)
    words = ("build", "test", "module", "file", "function", "class", "import", "value")
    instructions = " ".join(rng.choice(words) for _ in range(640))  # ~1,200 tokens

    @tool(strict=True, expected_seconds=5.0)
    async def build() -> str:
        """Build the project (takes a while)."""
        started = time.monotonic()
        with ThreadPoolExecutor(6) as pool:  # other traffic, all at once
            await anyio.to_thread.run_sync(
                lambda: list(pool.map(lambda i: complete(server, tokens(700 + i)), range(6)))
            )
        await anyio.sleep(max(started + 7.0 - time.monotonic(), 0.0))  # over its ETA
        return "build ok"

    agent = Agent(
        name="builder",
        instructions=instructions,
        model=server.model,
        tools=[build],
        model_settings=ModelSettings(tool_choice=["build", "none"], max_tokens=128),
    )
    before = server.metrics()
    _, calls = await run_recording(agent, server, "Build it.", InMemorySession("sdk-build"))
    after = server.metrics()
    completed = after.get(prefetches("completed"), 0) - before.get(prefetches("completed"), 0)
    (_, first), (_, back) = calls
    assert first.input_tokens > 16 * 64 and first.cached_tokens == 0
    assert completed >= 1
    assert back.cached_tokens >= first.input_tokens - 64, (first, back)
