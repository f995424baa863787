"""Attacks on the extension, each asserted to have no effect (docs/security.md).

Most run in-process against vLLM's own middleware stack: a FastAPI app whose
middleware vLLM's ``init_entrypoints_middleware`` installs exactly as a server
started with ``--api-key ... --middleware server_ext.AgentHintsMiddleware``
does, in front of recording routes that stand in for the engine. The last
section repeats the API-server attacks against a real CPU server.

Sections follow docs/security.md; each is self-contained, so more can be added.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import pytest
import torch
from fastapi import FastAPI, Request
from tier_fakes import MemoryTier
from vllm.entrypoints.serve.middleware.register import init_entrypoints_middleware

from agentsdk import (
    Agent,
    InMemorySession,
    Message,
    RunConfig,
    Runner,
    ScriptedCall,
    ScriptedModel,
    SQLiteSession,
    tool,
)
from agentsdk._tool import MAX_ABANDONED_CALLS
from hints_spec import CONTROL_PATH, AgentHints
from server_ext import LocalServer, local_server
from server_ext._prefetch import Branch, Prefetcher
from server_ext.policy import (
    MAX_DROPS,
    BranchHints,
    BranchKey,
    PolicyConfig,
    Release,
    RetentionPolicy,
)
from server_ext.testing import FakeDownstream
from server_ext.tier import (
    TIER_SECRET_ENV,
    BlockCodec,
    BlockProgress,
    GuardedTier,
    KeyIndex,
    TierConfig,
    TierConfigError,
    TierOps,
    TierPlanner,
    TierWorker,
    block_key,
    mac,
)

KEYS = ("sk-alice", "sk-bob")
ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}
# Routes of vLLM that reach the engine (a stand-in records what each one got).
ENGINE_ROUTES = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/inference/v1/generate",
    "/invocations",
)


@dataclass
class Engine:
    """What reached the stand-in routes and the engine client."""

    bodies: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    control: list[dict[str, Any]] = field(default_factory=list)

    async def notify_kv_transfer_request_rejected(
        self, request_id: str, params: dict[str, Any], *, data_parallel_rank: int | None = None
    ) -> None:
        self.control.append(params["agent_hints_control"])

    def transfer(self, index: int = -1) -> dict[str, Any]:
        params: dict[str, Any] = self.bodies[index][1].get("kv_transfer_params", {})
        return params


def vllm_app(
    api_keys: tuple[str, ...] | None = KEYS, root_path: str = "", **extra: object
) -> tuple[FastAPI, Engine]:
    """vLLM's middleware stack with the extension, over recording routes."""
    engine = Engine()
    app = FastAPI()
    args = argparse.Namespace(
        api_key=list(api_keys) if api_keys else None,
        allowed_origins=["*"],
        allow_credentials=False,
        allowed_methods=["*"],
        allowed_headers=["*"],
        enable_request_id_headers=False,
        middleware=["server_ext.AgentHintsMiddleware"],
        root_path=root_path,
    )
    app.state.args = args
    app.root_path = root_path
    transfer = SimpleNamespace(
        kv_connector="AgentHintsConnector", kv_connector_extra_config=dict(extra)
    )
    app.state.vllm_config = SimpleNamespace(kv_transfer_config=transfer)
    app.state.engine_client = engine

    async def record(request: Request) -> dict[str, Any]:
        engine.bodies.append((request.url.path, await request.json()))
        return {}

    for path in ENGINE_ROUTES:
        app.add_api_route(path, record, methods=["POST"])
    init_entrypoints_middleware(args, app, ())
    return app, engine


def client(app: FastAPI, peer: str = "127.0.0.1") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(peer, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://vllm")


def post(
    app: FastAPI,
    path: str,
    body: object,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    peer: str = "127.0.0.1",
) -> httpx.Response:
    async def go() -> httpx.Response:
        async with client(app, peer) as c:
            return await c.post(path, json=body, headers=headers)

    return asyncio.run(go())


def events(sid: str, *items: dict[str, object]) -> dict[str, object]:
    return {"v": 1, "sid": sid, "events": list(items) or [{"type": "end"}]}


HINT = {"Agent-Hints": 'v=1, sid="s1", gap=5'}
PROMPT = {"model": "m", "prompt": [1, 2, 3]}


# ---------------------------------------------------------------- 1. authentication


def test_a_control_post_without_a_key_is_refused_by_vllm_and_reaches_no_engine() -> None:
    app, engine = vllm_app()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sk-alice"}):
        response = post(app, CONTROL_PATH, events("s1"), headers)
        assert response.status_code == 401 and response.json() == {"error": "Unauthorized"}
    assert engine.control == []
    assert post(app, CONTROL_PATH, events("s1"), ALICE).status_code == 200
    assert len(engine.control) == 1


def test_an_unauthenticated_body_is_not_read_at_all() -> None:
    app, engine = vllm_app()
    pulled = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal pulled
        for _ in range(44):  # 44 MB, a megabyte at a time
            pulled += 1
            yield b"[" * (1 << 20)

    async def go() -> httpx.Response:
        async with client(app) as c:
            return await c.post("/v1/completions", content=body(), headers=HINT)

    assert asyncio.run(go()).status_code == 401
    assert pulled <= 1 and engine.bodies == []  # httpx may start the first chunk


def test_an_unauthenticated_hinted_request_on_a_guarded_route_is_refused() -> None:
    app, engine = vllm_app()
    response = post(app, "/v1/completions", PROMPT, {**HINT, "Authorization": "Bearer guess"})
    assert response.status_code == 401 and engine.bodies == []


def test_the_tenant_is_the_first_authorization_line_the_one_vllm_checked() -> None:
    app, engine = vllm_app()
    lines = [("Authorization", "Bearer sk-alice"), ("Authorization", "Bearer made-up-42")]
    assert post(app, "/v1/completions", PROMPT, [*HINT.items(), *lines]).status_code == 200
    post(app, "/v1/completions", PROMPT, {**HINT, **ALICE})
    forged, alice = engine.transfer(0), engine.transfer(1)
    assert forged["agent_hints_tenant"] == alice["agent_hints_tenant"]


def test_an_unchecked_key_names_no_tenant_on_a_route_vllm_leaves_open() -> None:
    # vLLM guards /v1, /v2, /inference only: /invocations is served without a key.
    app, engine = vllm_app()
    post(app, "/invocations", PROMPT, {"Authorization": "Bearer invented"})
    post(app, "/invocations", PROMPT, ALICE)
    assert engine.bodies[0][1]["cache_salt"] == "default"
    assert engine.bodies[1][1]["cache_salt"].startswith("key:")


def test_a_gateway_tenant_header_is_refused_from_anyone_but_the_gateway() -> None:
    app, engine = vllm_app(tenant_header="X-Tenant", tenant_header_peers="10.0.0.7")
    bob_org = {**BOB, "X-Tenant": "bob-org"}
    for peer in ("127.0.0.1", "10.0.0.8"):
        for path in (CONTROL_PATH, "/v1/completions"):
            response = post(app, path, events("s1") if path == CONTROL_PATH else PROMPT,
                            {**HINT, **bob_org}, peer)  # fmt: skip
            assert response.status_code == 403
            assert response.json()["error"]["code"] == "untrusted_tenant"
    assert engine.control == [] and engine.bodies == []
    post(app, "/v1/completions", PROMPT, {**HINT, **bob_org}, peer="10.0.0.7")
    assert engine.transfer()["agent_hints_tenant"].startswith("gw:")
    # Without the header a direct client is its key's tenant, as before.
    post(app, "/v1/completions", PROMPT, {**HINT, **BOB}, peer="10.0.0.8")
    assert engine.transfer()["agent_hints_tenant"].startswith("key:")


def test_a_gateway_secret_is_needed_besides_the_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_HINTS_GATEWAY_SECRET", "s3cret")
    app, engine = vllm_app(tenant_header="X-Tenant", gateway_secret_header="X-Gateway-Secret")
    org = {**BOB, "X-Tenant": "bob-org"}
    for secret in (None, "guess", "s3cret, s3cret"):
        headers = org if secret is None else {**org, "X-Gateway-Secret": secret}
        assert post(app, "/v1/completions", PROMPT, {**HINT, **headers}).status_code == 403
    ok = post(app, "/v1/completions", PROMPT, {**HINT, **org, "X-Gateway-Secret": "s3cret"})
    assert ok.status_code == 200 and engine.transfer()["agent_hints_tenant"].startswith("gw:")
    # Nothing after the middleware sees the secret.
    assert "s3cret" not in json.dumps(engine.bodies)


def test_the_tenant_header_given_twice_is_refused() -> None:
    app, _ = vllm_app(tenant_header="X-Tenant")
    lines = [*ALICE.items(), ("X-Tenant", "acme"), ("X-Tenant", "bob-org")]
    assert post(app, "/v1/completions", PROMPT, lines).status_code == 403


def test_the_control_endpoint_is_rate_limited_per_tenant() -> None:
    app, engine = vllm_app(control_rate=2)  # bursts of 4

    async def burst(headers: dict[str, str], n: int) -> list[int]:
        async with client(app) as c:
            return [
                (await c.post(CONTROL_PATH, json=events("s1"), headers=headers)).status_code
                for _ in range(n)
            ]

    alice = asyncio.run(burst(ALICE, 8))
    assert alice[:4] == [200] * 4 and 429 in alice[4:]
    assert asyncio.run(burst(BOB, 1)) == [200]  # another tenant is not slowed
    assert len(engine.control) == alice.count(200) + 1


def test_a_warning_at_start_up_when_every_client_names_its_own_tenant(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def startup(app: FastAPI) -> str:
        caplog.clear()

        async def lifespan() -> None:
            messages = iter([{"type": "lifespan.startup"}])

            async def receive() -> dict[str, str]:
                try:
                    return next(messages)
                except StopIteration:
                    await asyncio.Event().wait()
                    raise

            async def send(message: dict[str, object]) -> None:
                if message["type"] == "lifespan.startup.complete":
                    raise asyncio.CancelledError

            with caplog.at_level(logging.WARNING), pytest.raises(asyncio.CancelledError):
                await app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)

        asyncio.run(lifespan())
        return caplog.text

    assert "no --api-key and no tenant_header" in startup(vllm_app(api_keys=None)[0])
    assert "no --api-key" not in startup(vllm_app()[0])
    assert "no --api-key" not in startup(vllm_app(api_keys=None, tenant_header="X-T")[0])


# ---------------------------------------------------------------- 2. cache isolation


@pytest.mark.parametrize("path", ENGINE_ROUTES)
def test_every_route_to_the_engine_is_salted_per_tenant_by_default(path: str) -> None:
    app, engine = vllm_app()
    post(app, path, {**PROMPT, "cache_salt": "victim-salt"}, BOB)
    salt = engine.bodies[-1][1]["cache_salt"]
    assert salt.startswith("key:") and salt.endswith("/victim-salt")


def test_the_root_path_keeps_hints_salt_and_the_control_endpoint() -> None:
    app, engine = vllm_app(root_path="/api")
    for prefix in ("/api", ""):  # through a proxy that keeps or strips the prefix
        assert post(app, prefix + "/v1/completions", PROMPT, {**HINT, **ALICE}).is_success
        transfer = engine.transfer()
        assert transfer["agent_hints"] == AgentHints(sid="s1", gap=5).normalized()
        assert engine.bodies[-1][1]["cache_salt"] == transfer["agent_hints_tenant"]
        response = post(app, prefix + CONTROL_PATH, events("s1"), ALICE)
        assert response.status_code == 200 and response.json()["results"][0]["outcome"]
    assert len(engine.control) == 2
    assert post(app, "/api" + CONTROL_PATH, events("s1")).status_code == 401


# ---------------------------------------------------------------- 3. no oracle


def test_control_outcomes_reveal_no_cap() -> None:
    app, _ = vllm_app(ttl_cap_s=100)
    start = {"type": "tool_start", "tool": "bash", "eta": 5000}
    response = post(app, CONTROL_PATH, events("s1", start), ALICE)
    assert response.json()["results"] == [{"index": 0, "outcome": "accepted"}]


def _exported(**extra: object) -> set[str]:
    """The series the connector exports after observing every kind of stat."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    from server_ext.connector.metrics import _COUNTERS, _GAUGES, AgentHintsPromMetrics

    registry = CollectorRegistry()
    types = {
        kind: functools.partial(kind, registry=registry) for kind in (Counter, Gauge, Histogram)
    }
    config = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra))
    metrics = AgentHintsPromMetrics(config, types, ["engine"], {0: ["0"]})  # type: ignore[arg-type]
    metrics.observe(dict.fromkeys([*_COUNTERS, *_GAUGES], 1))
    return {sample.name for family in registry.collect() for sample in family.samples}


def test_metrics_that_answer_a_guessed_session_id_are_opt_in() -> None:
    # A tool_end for a guessed sid moves "rejected" only when nothing is
    # retained, an end moves "ends" only when something was: /metrics is open.
    oracle = {f"agent_hints_{name}_total" for name in ("rejected", "ends", "returns")}
    default = _exported()
    assert not oracle & default
    assert {"agent_hints_held_blocks", "agent_hints_holds_total"} <= default
    assert oracle <= _exported(state_metrics=True)


# ---------------------------------------------------------------- 4. KV tier

BS = 4  # tokens per block in the tier tests
HASHES = [bytes([i]) * 8 for i in range(16)]


def _kv(blocks: int = 16) -> dict[str, torch.Tensor]:
    return {"layer.0": torch.randn(2, blocks, 2, BS, 8)}


def _stored_planner(**index: Any) -> TierPlanner:
    """A planner whose tier holds blocks 0-2 of ``HASHES`` for tenant t."""
    plan = TierPlanner(KeyIndex(None, **index), "ns", BS, 10)
    plan.track("first", "t", pin_s=0)
    plan.step([BlockProgress("first", HASHES[:4], [0, 1, 2, 3], 3 * BS)])
    plan.finished("first")
    plan.track("r", "t", pin_s=0)
    assert plan.lookup("r", HASHES[:4], num_tokens=4 * BS, num_computed=0) == 3 * BS
    return plan


def _reported(ops: TierOps) -> set[int]:
    """What the worker-side connector tells vLLM failed to load, given ``ops``."""
    from server_ext.connector import AgentHintsConnector, AgentHintsMetadata
    from server_ext.connector.worker import ConnectorWorker

    worker = object.__new__(ConnectorWorker)
    worker.tier_worker = TierWorker(MemoryTier(), BlockCodec(_kv(), 16))
    worker._load_errors = set()
    connector = object.__new__(AgentHintsConnector)
    connector._worker = worker
    connector.bind_connector_metadata(AgentHintsMetadata(ops))
    connector.start_load_kv(None)
    return connector.get_block_ids_with_load_errors()


def test_a_fault_after_tier_tokens_were_promised_is_a_load_error_not_wrong_kv() -> None:
    blocks = [20, 21, 22, 23]
    # The hook that plans the loads fails inside ...
    plan = _stored_planner()

    def broken(keys: object) -> None:
        raise RuntimeError("injected")

    plan.index.touch = broken  # type: ignore[method-assign]
    plan.allocated("r", blocks, 3 * BS)
    assert _reported(plan.step([BlockProgress("r", HASHES[:4], blocks, 4 * BS)])) == {20, 21, 22}
    # ... or before it is called (vLLM allocated, the connector's hook raised).
    plan = _stored_planner()
    assert _reported(plan.step([BlockProgress("r", HASHES[:4], blocks, 4 * BS)])) == {20, 21, 22}
    # ... or the step's metadata cannot be built: every planned load fails.
    plan = _stored_planner()
    plan.allocated("r", blocks, 3 * BS)
    assert _reported(plan.abandon()) == {20, 21, 22}


class SlowTier(MemoryTier):
    """Alive, but every call takes ``delay_s``."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    def put(self, key: str, value: torch.Tensor, pin_s: float = 0.0) -> bool:
        time.sleep(self.delay_s)
        return super().put(key, value, pin_s)

    def get(self, key: str) -> torch.Tensor | None:
        time.sleep(self.delay_s)
        return super().get(key)


def test_a_slow_store_costs_a_step_its_budget_not_a_timeout_per_block() -> None:
    slow = SlowTier(0.15)
    tier = GuardedTier(lambda: slow, timeout_s=1.0)
    worker = TierWorker(tier, BlockCodec(_kv(20), 20), budget_s=0.3)
    # The worker connects in the background (the engine's start-up covers it);
    # a call before the connection is up is an error at once, one after is not.
    deadline = time.monotonic() + 5
    while True:
        errors = tier.stats.errors
        tier.contains([])
        if tier.stats.errors == errors:
            break
        assert time.monotonic() < deadline, "the tier never connected"
        time.sleep(0.01)
    start = time.monotonic()
    worker.save([(f"k{i}", i, 0.0) for i in range(20)], drops=[])
    assert time.monotonic() - start < 0.6  # 20 puts at 0.15 s took 3 s
    report = worker.take_report()
    assert report is not None and 10 <= len(report.failed_saves) < 20
    assert tier.available  # slow is not dead: the breaker stays closed
    time.sleep(0.2)  # the put cut short finishes on the helper
    start = time.monotonic()
    failed = worker.load([(f"k{i}", i) for i in range(20)])
    assert time.monotonic() - start < 0.6 and len(failed) >= 10


def test_one_tenant_cannot_push_another_out_of_the_tier() -> None:
    plan = TierPlanner(KeyIndex(100, owner_budget_bytes=50), "ns", BS, 10)
    plan.track("b", "bob", pin_s=0)
    plan.step([BlockProgress("b", HASHES[:3], [0, 1, 2], 3 * BS)])
    for n in range(4):  # alice saves 16 blocks: 10 would fit in the whole tier
        plan.track(f"a{n}", "alice", pin_s=0)
        progress = [BlockProgress(f"a{n}", HASHES[n * 4 : n * 4 + 4], [1, 2, 3, 4], 4 * BS)]
        plan.step(progress)  # (hashes repeat, tenants keep them apart)
    assert plan.index.owner_bytes("alice") == 50 and plan.index.owner_bytes("bob") == 30
    plan.track("b2", "bob", pin_s=0)
    assert plan.lookup("b2", HASHES[:4], num_tokens=4 * BS, num_computed=0) == 3 * BS


def test_tier_keys_and_values_cannot_be_forged_without_the_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = HASHES[1]
    # Anyone can compute an unkeyed key from vLLM's (predictable) block hash.
    assert block_key("ns", "t", h, b"secret") != block_key("ns", "t", h)
    assert block_key("ns", "t", h, b"secret") != block_key("ns", "t", h, b"guess")
    value = b"kv" * 64
    assert mac(b"secret", "k", value) != mac(b"guess", "k", value)
    assert mac(b"secret", "k", value) != mac(b"secret", "other", value)  # bound to its key
    config = TierConfig.from_mapping({"tier": "mooncake"})
    assert config is not None
    monkeypatch.delenv(TIER_SECRET_ENV, raising=False)
    with pytest.raises(TierConfigError, match=TIER_SECRET_ENV):
        config.secret()
    keys = set()
    for secret in ("s3cret", "x" * 200):  # any length: BLAKE2b itself takes at most 64 bytes
        monkeypatch.setenv(TIER_SECRET_ENV, secret)
        key = config.secret()
        assert key is not None
        keys.add(block_key("ns", "t", h, key))
        assert mac(key, "k", value) != mac(None, "k", value)
    assert len(keys) == 2


@pytest.mark.mooncake
def test_a_value_planted_in_mooncake_without_the_secret_is_a_miss() -> None:
    from server_ext.tier import MooncakeTier, MooncakeUnavailable, local_mooncake_master

    try:
        with local_mooncake_master() as master:
            clients = [
                MooncakeTier(master.address, segment_bytes=32 << 20, secret=secret)
                for secret in (b"server", b"intruder")
            ]
            try:
                server, intruder = clients
                good = torch.arange(64, dtype=torch.uint8)
                assert server.put("mine", good)
                zeros = torch.zeros(64, dtype=torch.uint8)
                assert intruder.put("planted", zeros)
                forged = bytes(64) + mac(b"intruder", "mine", bytes(64))
                assert intruder._store.upsert("mine", forged) == 0  # overwrites the value
                assert server.get("planted") is None and server.get("mine") is None
                assert server.stats.corrupt == 2
            finally:
                for c in clients:
                    c.close()
    except MooncakeUnavailable as e:
        pytest.skip(str(e))


# ---------------------------------------------------------------- 5. parsing


def test_deeply_nested_json_is_a_clean_400_not_a_500() -> None:
    app, engine = vllm_app()
    nested = b'{"kv_transfer_params": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"

    async def go(path: str) -> httpx.Response:
        async with client(app) as c:
            return await c.post(path, content=nested, headers=ALICE)

    for path in ("/v1/completions", CONTROL_PATH):
        response = asyncio.run(go(path))
        assert response.status_code == 400, response.text
        assert "Traceback" not in response.text and response.json()["error"]
    assert engine.bodies == [] and engine.control == []


def test_several_agent_hints_lines_are_combined() -> None:
    app, engine = vllm_app()
    lines = [*ALICE.items(), ("Agent-Hints", 'v=1, sid="s1"'), ("Agent-Hints", "gap=5, ttl=60")]
    post(app, "/v1/completions", PROMPT, lines)
    assert engine.transfer()["agent_hints"] == AgentHints(sid="s1", gap=5, ttl=60).normalized()


def test_one_tenant_cannot_flush_another_tenants_warmups() -> None:
    async def main() -> list[BranchKey]:
        prefetcher = Prefetcher(
            FakeDownstream(), max_requests=8, tenant_share=0.25, interval_s=3600
        )

        async def serve(tenant: str, sid: str) -> None:
            scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
            branch = Branch(BranchKey(tenant, sid, "root"), 5.0, False)
            await prefetcher.serve(scope, b"{}", branch, _no_body, _ignore)

        await serve("bob", "b1")
        for n in range(100):
            await serve("mallory", f"m{n}")
        await prefetcher.aclose()
        return list(prefetcher._last)

    remembered = asyncio.run(main())
    assert BranchKey("bob", "b1", "root") in remembered
    assert sum(k.tenant == "mallory" for k in remembered) == 2


async def _no_body() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _ignore(message: object) -> None:
    return None


def test_pop_item_returns_each_message_once_across_connections(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    items: list[Message] = [{"role": "user", "content": str(i)} for i in range(600)]
    anyio.run(SQLiteSession("s", path).add_items, items)
    popped: list[str] = []

    def drain() -> None:
        session = SQLiteSession("s", path)  # its own connection, as another process

        async def pop_all() -> None:
            while (item := await session.pop_item()) is not None:
                popped.append(str(item["content"]))

        anyio.run(pop_all)
        session.close()

    threads = [threading.Thread(target=drain) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(popped, key=int) == [str(i) for i in range(600)]


def test_a_huge_tool_result_is_cut_before_it_is_stored_and_resent() -> None:
    @tool
    def dump() -> str:
        return "x" * 100_000_000

    model = ScriptedModel([[ScriptedCall("dump", id="d")], "ok"])
    agent = Agent(name="a", instructions="i", model="m", tools=[dump])
    session = InMemorySession()
    anyio.run(lambda: Runner.run(agent, "go", client=model, session=session))
    [resent] = [m for m in model.requests[1].messages if m["role"] == "tool"]
    limit = RunConfig().max_tool_output_chars
    assert limit < len(resent["content"]) < limit + 100
    assert resent["content"].endswith("[truncated: the tool returned 100,000,000 characters]")
    stored = anyio.run(session.get_items)
    assert sum(len(json.dumps(m)) for m in stored) < 2 * limit


def test_a_hung_sync_tool_is_noticed_and_cannot_pile_up_threads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    started = 0

    @tool(timeout=0.05)
    def stuck() -> str:
        nonlocal started
        started += 1
        release.wait(30)
        return "late"

    calls = [ScriptedCall("stuck", id=f"c{i}") for i in range(MAX_ABANDONED_CALLS)]
    model = ScriptedModel([calls, "gave up", [ScriptedCall("stuck", id="more")], "still"])
    agent = Agent(name="a", instructions="i", model="m", tools=[stuck])
    with caplog.at_level(logging.WARNING, logger="agentsdk"):
        anyio.run(lambda: Runner.run(agent, "go", client=model))
        result = anyio.run(lambda: Runner.run(agent, "again", client=model))
        [refused] = [m["content"] for m in result.new_messages if m["role"] == "tool"]
        assert "still run after their timeout" in refused
        assert started == MAX_ABANDONED_CALLS  # the fifth never got a thread
        assert caplog.text.count("its thread cannot be stopped") == MAX_ABANDONED_CALLS
        release.set()
        deadline = time.monotonic() + 10
        while caplog.text.count("returned after") < MAX_ABANDONED_CALLS:
            assert time.monotonic() < deadline
            time.sleep(0.01)


# -------------------------------------------- 6. scheduler work and tenant isolation
# On the policy itself (a fake clock, no vLLM): a tenant's hints must not hold
# another tenant's requests back, claimed gaps must not evict a tenant within
# its fair share, and one tenant's flood of sessions (all sharing one prefix,
# so its block budget does not stop them) must leave the policy bounded in
# state and in work per call. Warm-ups never cost a real request its place:
# test_prefetch_preemption.py (vLLM's scheduler in-process). A scalar
# ``kv_transfer_params`` is no fault: test_prefetch_engine.py.


def _policy(**config: object) -> RetentionPolicy:
    return RetentionPolicy(PolicyConfig(total_blocks=1000, **config), clock=lambda: 0.0)  # type: ignore[arg-type]


def _retain(
    p: RetentionPolicy, tenant: str, sid: str, blocks: range | tuple[int, ...], gap: float
) -> None:
    p.on_request_finished(
        BranchKey(tenant, sid), tuple(blocks), BranchHints(gap=gap), True, now=0.0
    )


def test_another_tenants_branches_due_back_never_hold_a_request() -> None:
    p = _policy()
    _retain(p, "attacker", "a", range(0, 1), gap=1.0)  # due back in 1 s
    victim = BranchKey("victim", "v")
    assert not p.return_due(1.0, 0.5, victim)
    _retain(p, "victim", "other", range(10, 11), gap=1.0)
    assert p.return_due(1.0, 0.5, victim)  # its own tenant's branch counts


def test_claimed_gaps_do_not_evict_tenants_within_their_fair_share() -> None:
    # Global cap 500 blocks; B and C hold 250 each. An attacker claiming gap=0
    # under two identities takes only what they hold over a fair share (a
    # quarter each, among four tenants): their prefixes stay.
    p = _policy(max_held_fraction=0.5, max_tenant_fraction=1.0)
    _retain(p, "B", "b", range(0, 250), gap=100.0)
    _retain(p, "C", "c", range(250, 500), gap=100.0)
    for identity in ("A1", "A2"):
        for i in range(20):
            _retain(p, identity, f"s{i}", range(1000 + 100 * i, 1100 + 100 * i), gap=0.0)
    b, c = p.retention(BranchKey("B", "b")), p.retention(BranchKey("C", "c"))
    assert b is not None and c is not None
    assert b.block_ids == tuple(range(0, 125)) and c.block_ids == tuple(range(250, 375))
    assert p.held_blocks <= 500


def test_a_tenant_over_its_share_gives_way_to_newcomers() -> None:
    p = _policy(max_held_fraction=0.5, max_tenant_fraction=1.0)
    _retain(p, "B", "b", range(0, 500), gap=100.0)  # all of the cap, alone
    _retain(p, "A", "a", range(600, 700), gap=1.0)  # sooner, and B is over half
    assert p.tenant_held_blocks("A") == 100


def test_one_tenants_sessions_are_capped_in_number() -> None:
    p = _policy(max_held_fraction=1.0, max_tenant_fraction=1.0, max_tenant_retentions=100)
    for i in range(5000):  # every session the same 4-block prefix: the budget never binds
        _retain(p, "flood", f"s{i}", (1, 2, 3, 4), gap=10.0)
    _retain(p, "other", "o", (9,), gap=10.0)
    assert p.retained_branches == 101 and p.retention(BranchKey("other", "o")) is not None


def test_making_room_releases_a_bounded_number_of_retentions_per_call() -> None:
    # Many retentions share one block: freeing it needs them all. One call
    # releases at most MAX_DROPS; the shelf then takes the block itself.
    p = _policy(max_held_fraction=1.0, max_tenant_fraction=1.0, max_tenant_retentions=10_000)
    for i in range(2000):
        _retain(p, f"t{i % 10}", f"s{i}", (1,), gap=10.0)
    actions = p.make_room(1, now=0.0)
    assert 0 < len([a for a in actions if isinstance(a, Release)]) <= MAX_DROPS
    assert p.retained_branches >= 2000 - MAX_DROPS


def test_making_room_does_work_independent_of_the_number_of_tenants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 20,000 tenants of one block each, every one within its fair share: the
    # fair-share checks must not visit them all (they did: 6 ms per call).
    p = _policy(max_held_fraction=1.0, max_tenant_fraction=1.0)
    for i in range(20_000):
        _retain(p, f"t{i}", "s", (i % 900,), gap=10.0)
    visited: list[str] = []
    ledger = p._table.ledger
    held = ledger.tenant_held
    monkeypatch.setattr(ledger, "tenant_held", lambda t: visited.append(t) or held(t))
    monkeypatch.setattr(ledger, "tenants", lambda: pytest.fail("visited every tenant"))
    p.make_room(1, now=0.0)
    assert len(visited) < 100


# ---------------------------------------------------------------- 7. the real server


@pytest.fixture(scope="module")
def keyed_server(
    test_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalServer]:
    """The extension behind ``--api-key``, a gateway header trusted from a
    peer that is not this host, and a low control rate."""
    with local_server(
        test_model_dir,
        kv_blocks=64,
        max_model_len=2048,
        args=["--api-key", KEYS[0], KEYS[1]],
        extra_config={
            "tenant_header": "X-Tenant",
            "tenant_header_peers": "192.0.2.1",
            "control_rate": 2,
            "max_tenant_fraction": 1.0,
        },
        log_dir=tmp_path_factory.mktemp("keyed-logs"),
    ) as server:
        yield server


def _complete(
    server: LocalServer, prompt: list[int], headers: dict[str, str], path: str = "/v1/completions"
) -> int:
    """A 1-token completion; its cached prompt tokens."""
    status, reply = server.post_json(
        path, {"model": server.model, "prompt": prompt, "max_tokens": 1}, headers
    )
    assert status == 200, reply
    assert isinstance(reply, dict)
    return int((reply["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def _held(server: LocalServer) -> float:
    return server.metrics().get("agent_hints_held_blocks", 0.0)


@pytest.mark.server
def test_real_server_refuses_every_api_server_attack(keyed_server: LocalServer) -> None:
    server = keyed_server
    prompt = list(range(100, 100 + 640))  # 10 blocks
    # Alice's session is retained.
    hint = {"Agent-Hints": 'v=1, sid="alice-1", gap=300'}
    _complete(server, prompt, {**ALICE, **hint})
    deadline = 50
    while _held(server) < 10 and deadline:
        deadline -= 1
        _complete(server, [7], ALICE)  # an engine step publishes the gauge
    assert _held(server) >= 10
    # No key: refused by vLLM, nothing ends.
    assert server.post_json(CONTROL_PATH, events("alice-1"))[0] == 401
    assert server.post_json(CONTROL_PATH, events("alice-1"), {"X-Tenant": "x"})[0] == 401
    # A key plus the gateway's header, from this host (not the gateway): refused.
    status, reply = server.post_json(CONTROL_PATH, events("alice-1"), {**BOB, "X-Tenant": "a"})
    assert (status, reply) == (403, {"error": reply["error"]}) and reply["error"]["code"]
    # Bob cannot end Alice's session, whatever he sends: his own tenant.
    assert server.post_json(CONTROL_PATH, events("alice-1"), BOB)[0] == 200
    _complete(server, [7], BOB)
    assert _held(server) >= 10
    # Bob sharing Alice's prefix (with her hint) gets none of her cache.
    assert _complete(server, prompt, {**BOB, **hint}) == 0
    assert _complete(server, prompt, ALICE) >= 576  # hers still is
    # The control endpoint is rate-limited (bursts of 4 at 2/s).
    codes = [server.post_json(CONTROL_PATH, events("b", {"type": "tool_end"}), BOB)[0]
             for _ in range(8)]  # fmt: skip
    assert 429 in codes


def _retained(server: LocalServer, sid: str, prompt: list[int], headers: dict[str, str]) -> float:
    """Retain ``sid``'s ``prompt`` (10 blocks); the held blocks once published."""
    before = _held(server)
    _complete(server, prompt, {**headers, "Agent-Hints": f'v=1, sid="{sid}", gap=300'})
    for _ in range(50):
        if _held(server) >= before + 10:
            break
        _complete(server, [7], headers)  # an engine step publishes the gauge
    held = _held(server)
    assert held >= before + 10
    return held


def _settled_held(server: LocalServer) -> float:
    _complete(server, [7], ALICE)
    _complete(server, [7], ALICE)
    return _held(server)


@pytest.mark.server
def test_real_server_keeps_a_tenant_whole_under_header_body_and_route_attacks(
    keyed_server: LocalServer,
) -> None:
    server = keyed_server
    prompt = list(range(1000, 1000 + 640))
    held = _retained(server, "alice-2", prompt, ALICE)
    url = server.root_url
    with httpx.Client(timeout=60) as http:
        # A large body without a key is refused without being read (the
        # server may close the connection before the client has sent it all).
        try:
            big = http.post(url + "/v1/completions", content=b"[" * (8 << 20), headers=HINT)
            assert big.status_code == 401
        except (httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadError):
            pass
        # Two Authorization lines: vLLM checks the first, and the first names
        # the tenant, so Bob's key with Alice's after it is still Bob.
        two = [("Authorization", "Bearer sk-bob"), ("Authorization", "Bearer sk-alice")]
        assert http.post(url + CONTROL_PATH, json=events("alice-2"), headers=two).is_success
        # A scalar kv_transfer_params through vllm_xargs is no fault.
        xargs = {"model": server.model, "prompt": [1, 2, 3], "max_tokens": 1,
                 "vllm_xargs": {"kv_transfer_params": 0}}  # fmt: skip
        assert http.post(url + "/v1/completions", json=xargs, headers=BOB).status_code < 500
        # An unchecked key on a route vLLM leaves open names no tenant: no
        # share of Alice's cache, while her own key there still gets it.
        invented = {"Authorization": "Bearer sk-invented"}
        assert _complete(server, prompt, invented, "/invocations") == 0
        assert _complete(server, prompt, ALICE, "/invocations") >= 576
        # The control outcome says nothing of the TTL cap (600 s: the ETA is over it).
        start = events("alice-2", {"type": "tool_start", "tool": "bash", "eta": 5000})
        reply = http.post(url + CONTROL_PATH, json=start, headers=ALICE).json()
        assert reply["results"] == [{"index": 0, "outcome": "accepted"}]
    assert _settled_held(server) >= held
    after = server.metrics()
    assert after.get("agent_hints_faults_total", 0.0) == 0
    # /metrics is open: at the defaults no series answers a guessed session id.
    assert not {"agent_hints_rejected_total", "agent_hints_ends_total"} & set(after)
    # With keys set, no warning that clients name their own tenant.
    assert "no --api-key" not in server.log_path.read_text()
