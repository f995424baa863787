"""``AgentHintsCachePolicy`` inside vLLM's own ``CPUOffloadingManager``.

The manager is vLLM's (loaded by name and module path, as vLLM loads it from
``kv_connector_extra_config``); the tests drive it as vLLM's offloading
scheduler does: a request context per request, lookups, loads, stores, and
the request's end. Without hints the policy must evict exactly what vLLM's
LRU evicts; with them, ended and expired sessions' chunks go first, scoped by
tenant.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

from hints_spec import AgentHints
from hints_spec.core import EndEvent
from server_ext._contract import hint_params
from server_ext.offload import AgentHintsCachePolicy, lower_to_envelope
from server_ext.testing import ManualClock

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _key(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def _manager(policy: str, capacity: int) -> CPUOffloadingManager:
    path = None if policy == "lru" else "server_ext.offload"
    return CPUOffloadingManager(capacity, cache_policy=policy, cache_policy_module_path=path)


def _hinted(tenant: str = "t1", **hints: object) -> dict[str, object]:
    return hint_params(tenant, AgentHints(**hints))  # type: ignore[arg-type]


_next_id = iter(range(1 << 30))


def serve(
    manager: CPUOffloadingManager,
    keys: Sequence[OffloadKey],
    params: dict[str, object] | None = None,
    *,
    envelope: bool = False,
) -> list[OffloadKey]:
    """One request over ``keys`` (a prefix chain) as vLLM's offloading
    scheduler runs it: load the leading hits, store the rest, finish.
    Returns the keys its stores evicted."""
    kv_hints = lower_to_envelope(None, params) if envelope else None
    ctx = ReqContext(
        req_id=f"r{next(_next_id)}",
        kv_transfer_params=None if envelope else params,
        kv_hints=kv_hints,
    )
    manager.on_new_request(ctx)
    hits = 0
    while hits < len(keys) and manager.lookup(keys[hits], ctx) == LookupResult.HIT:
        hits += 1
    if hits:
        manager.prepare_load(keys[:hits], ctx)
        manager.complete_load(keys[:hits], ctx)
    evicted: list[OffloadKey] = []
    if hits < len(keys):
        out = manager.prepare_store(keys[hits:], ctx)
        if out is not None:
            evicted = out.evicted_keys
            manager.complete_store(out.keys_to_store, ctx)
    manager.on_request_finished(ctx)
    return evicted


def _chains(seed: int, n: int) -> list[list[OffloadKey]]:
    """Prefix chains as agent sessions make them: a session's next prompt
    extends its last one; sessions share a system prompt."""
    rng = random.Random(seed)
    system = [_key(i) for i in range(3)]
    sessions: list[list[OffloadKey]] = []
    fresh = iter(range(1000, 1 << 30))
    out = []
    for _ in range(n):
        if not sessions or rng.random() < 0.2:
            sessions.append(list(system))
        s = rng.choice(sessions)
        s.extend(_key(next(fresh)) for _ in range(rng.randint(1, 6)))
        out.append(list(s))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_without_hints_it_evicts_exactly_what_vllms_lru_evicts(seed: int) -> None:
    lru, ours = _manager("lru", 40), _manager("AgentHintsCachePolicy", 40)
    evictions = 0
    for chain in _chains(seed, 120):
        expected = serve(lru, chain)
        assert serve(ours, chain) == expected
        evictions += len(expected)
    assert evictions > 100  # the capacity was under pressure


@pytest.mark.parametrize("seed", range(3))
def test_session_ids_alone_are_lru(seed: int) -> None:
    """A client that sends a session id and nothing else (the hint-free
    baseline's client) gets LRU: no end, no ttl, nothing to act on."""
    lru, ours = _manager("lru", 40), _manager("AgentHintsCachePolicy", 40)
    for i, chain in enumerate(_chains(seed, 120)):
        assert serve(ours, chain, _hinted(sid=f"s{i}")) == serve(lru, chain)


def test_an_ended_session_leaves_first() -> None:
    manager = _manager("AgentHintsCachePolicy", 8)
    a = [_key(i) for i in range(4)]
    b = [_key(i) for i in range(10, 14)]
    serve(manager, a, _hinted(sid="A"))
    serve(manager, b, _hinted(sid="B"))
    serve(manager, a, _hinted(sid="A", end=True))  # A's last request: A most recent
    evicted = serve(manager, [_key(20), _key(21)], _hinted(sid="C"))
    assert set(evicted) <= set(a) and len(evicted) == 2
    # LRU would have taken B's, the least recently used.
    lru = _manager("lru", 8)
    serve(lru, a)
    serve(lru, b)
    serve(lru, a)
    assert set(serve(lru, [_key(20), _key(21)])) <= set(b)


def test_the_end_hint_travels_in_vllms_envelope() -> None:
    manager = _manager("AgentHintsCachePolicy", 8)
    a = [_key(i) for i in range(4)]
    serve(manager, a, _hinted(sid="A"), envelope=True)
    serve(manager, [_key(i) for i in range(10, 14)], _hinted(sid="B"), envelope=True)
    serve(manager, a, _hinted(sid="A", end=True), envelope=True)
    evicted = serve(manager, [_key(20)], _hinted(sid="C"), envelope=True)
    assert evicted == [a[-1]]  # the ended chain's tail first, as LRU orders a chain


def test_a_branch_end_releases_that_branch_only_a_root_end_the_session() -> None:
    manager = _manager("AgentHintsCachePolicy", 10)
    root = [_key(i) for i in range(4)]
    child = [*root, _key(5), _key(6)]
    other = [_key(i) for i in range(30, 34)]
    serve(manager, root, _hinted(sid="A"))
    serve(manager, child, _hinted(sid="A", br="c1", pbr="root"))
    serve(manager, other, _hinted(sid="B"))
    serve(manager, child, _hinted(sid="A", br="c1", pbr="root", end=True))
    # The child's own blocks go first; the prefix the root still holds stays.
    evicted = serve(manager, [_key(40), _key(41)], _hinted(sid="B"))
    assert set(evicted) == {_key(5), _key(6)}
    serve(manager, root, _hinted(sid="A", end=True))
    evicted = serve(manager, [_key(42), _key(43), _key(44), _key(45)], _hinted(sid="B"))
    assert set(evicted) == set(root)


def test_a_ttl_that_passed_without_a_return_releases_the_branch() -> None:
    clock = ManualClock()
    policy = AgentHintsCachePolicy(8, clock=clock)
    manager = _manager("AgentHintsCachePolicy", 8)
    manager._policy = policy  # the same class vLLM built, with a clock to turn
    a = [_key(i) for i in range(4)]
    b = [_key(i) for i in range(10, 14)]
    serve(manager, b, _hinted(sid="B", ttl=100))
    serve(manager, a, _hinted(sid="A", ttl=5))
    clock.now = 4.0
    assert set(serve(manager, [_key(20)], _hinted(sid="C"))) <= set(b)  # not yet: LRU
    clock.now = 6.0
    assert set(serve(manager, [_key(21)], _hinted(sid="C"))) <= set(a)
    assert policy.counters.expired_branches == 1


def test_a_later_request_renews_the_ttl() -> None:
    clock = ManualClock()
    policy = AgentHintsCachePolicy(8, clock=clock)
    manager = _manager("AgentHintsCachePolicy", 8)
    manager._policy = policy
    a = [_key(i) for i in range(4)]
    serve(manager, [_key(i) for i in range(10, 14)], _hinted(sid="B"))
    serve(manager, a, _hinted(sid="A", ttl=5))
    clock.now = 4.0
    serve(manager, a, _hinted(sid="A", ttl=5))  # came back: a new deadline at 9
    clock.now = 6.0
    assert not set(serve(manager, [_key(20)], _hinted(sid="C"))) & set(a)
    assert policy.counters.expired_branches == 0


def test_one_tenants_end_cannot_release_another_tenants_session() -> None:
    manager = _manager("AgentHintsCachePolicy", 8)
    a = [_key(i) for i in range(4)]
    b = [_key(i) for i in range(10, 14)]
    serve(manager, b, _hinted("t1", sid="B"))
    serve(manager, a, _hinted("t1", sid="A"))
    # Another tenant names the same session id (and even the same blocks).
    serve(manager, a, _hinted("t2", sid="A", end=True))
    evicted = serve(manager, [_key(20)], _hinted("t1", sid="C"))
    assert set(evicted) <= set(b)  # plain LRU: t1's A is untouched


def test_blocks_an_unhinted_request_used_are_never_released_by_a_hint() -> None:
    manager = _manager("AgentHintsCachePolicy", 8)
    shared = [_key(i) for i in range(4)]
    serve(manager, shared)  # unhinted
    serve(manager, [_key(i) for i in range(10, 14)], _hinted(sid="B"))
    serve(manager, shared, _hinted(sid="A", end=True))
    evicted = serve(manager, [_key(20)], _hinted(sid="C"))
    assert set(evicted) <= {_key(i) for i in range(10, 14)}


def test_a_malformed_hint_is_served_as_unhinted() -> None:
    lru, ours = _manager("lru", 8), _manager("AgentHintsCachePolicy", 8)
    bad = {"agent_hints": {"sid": 7, "end": "yes"}, "agent_hints_tenant": "t1"}
    for chain in _chains(1, 40):
        assert serve(ours, chain, bad) == serve(lru, chain)


def test_released_blocks_that_come_back_rejoin_lru() -> None:
    manager = _manager("AgentHintsCachePolicy", 8)
    a = [_key(i) for i in range(4)]
    b = [_key(i) for i in range(10, 14)]
    serve(manager, a, _hinted(sid="A", end=True))
    serve(manager, b, _hinted(sid="B"))
    serve(manager, a, _hinted(sid="A2"))  # a new session reuses the prefix
    evicted = serve(manager, [_key(20)], _hinted(sid="C"))
    assert set(evicted) <= set(b)


def test_both_insert_signatures() -> None:
    """vLLM 0.32 calls ``insert(key, chunk)``; 0.33 adds the request context."""
    policy = AgentHintsCachePolicy(4)
    ready = ChunkStatus(0)
    ready.ref_cnt = 0
    policy.insert(_key(1), ready)
    other = ChunkStatus(1)
    other.ref_cnt = 0
    policy.insert(_key(2), other, ReqContext(req_id="r"))
    assert policy.get(_key(1)) is ready and policy.get(_key(2)) is other
    assert [k for k, _ in policy.evict(2, set()) or []] == [_key(1), _key(2)]


def test_evict_is_atomic() -> None:
    policy = AgentHintsCachePolicy(4)
    for i in range(3):
        chunk = ChunkStatus(i)
        chunk.ref_cnt = 0
        policy.insert(_key(i), chunk)
    policy.mark_non_evictable(_key(0))
    assert policy.evict(3, set()) is None
    assert policy.evict(2, {_key(1)}) is None
    assert all(policy.get(_key(i)) is not None for i in range(3))
    assert [k for k, _ in policy.evict(1, {_key(1)}) or []] == [_key(2)]


def test_an_end_control_event_releases_like_an_end_hint() -> None:
    from server_ext._contract import control_params

    manager = _manager("AgentHintsCachePolicy", 8)
    a = [_key(i) for i in range(4)]
    b = [_key(i) for i in range(10, 14)]
    serve(manager, b, _hinted(sid="B"))
    serve(manager, a, _hinted(sid="A"))
    serve(manager, [], control_params("t2", "A", [EndEvent()]))  # another tenant's
    assert set(serve(manager, [_key(20)], _hinted(sid="C"))) <= set(b)
    serve(manager, [], control_params("t1", "A", [EndEvent()]))
    assert set(serve(manager, [_key(21)], _hinted(sid="C"))) <= set(a)
