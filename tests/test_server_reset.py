"""``AgentHintsConnector.reset_cache``, on vLLM's own scheduler (in-process, no model).

vLLM resets its connectors when the engine's KV goes stale (0.33: pause, sleep,
weight updates; 0.32: ``reset_prefix_cache(reset_connector=True)``, the path
driven here). Nothing of the old KV may come back afterwards: no retention, and
no block from the Mooncake tier, neither by the planner's index nor by the
shared store, which still holds the old blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from vllm.v1.core.sched.scheduler import Scheduler
from vllm_scheduler import request, scheduler, step

from hints_spec import AgentHints
from server_ext._contract import hint_params
from server_ext.connector import AgentHintsConnector, AgentHintsMetadata
from server_ext.connector import tier as connector_tier
from server_ext.connector.scheduler import ConnectorScheduler
from server_ext.connector.tier import SchedulerTier
from server_ext.tier import TIER_SECRET_ENV, Shard, TierConfig, shard_key

HINTED = hint_params("tenant", AgentHints(sid="s", gap=30.0))


def _connector(s: Scheduler) -> AgentHintsConnector:
    assert isinstance(s.connector, AgentHintsConnector)
    return s.connector


def _side(connector: AgentHintsConnector) -> ConnectorScheduler:
    assert connector._scheduler is not None
    return connector._scheduler


def _tier(connector: AgentHintsConnector) -> SchedulerTier:
    tier = _side(connector).tier
    assert tier is not None
    return tier


def _serve(s: Scheduler, name: str) -> None:
    """A hinted request of the same 3-block prompt each time, to its end."""
    s.add_request(request(name, 1, prompt_blocks=3, max_tokens=4, kv_transfer_params=HINTED))
    while s.has_unfinished_requests():
        step(s)


def test_a_reset_releases_every_retention(test_model_dir: Path) -> None:
    s = scheduler(test_model_dir, {})
    connector = _connector(s)
    _serve(s, "a")
    retention = _side(connector).retention
    assert retention is not None and retention.stats.holds == 1 and retention.stats.resets == 0
    assert connector.reset_cache() is True  # not None: done, not "not implemented"
    assert retention.stats.resets == 1
    assert connector.reset_cache() is True  # nothing left: still a success
    assert retention.stats.resets == 1
    # vLLM's own path: the prefix cache, then the connector
    _serve(s, "b")
    assert s.reset_prefix_cache(reset_connector=True) is True
    assert retention.stats.resets == 2


class _Store:
    """A shared Mooncake store seen through the scheduler's probe: it holds
    what it was given, and records what it was asked."""

    def __init__(self) -> None:
        self.held: set[str] = set()
        self.asked: list[str] = []

    def contains(self, keys: Sequence[str]) -> int:
        self.asked.extend(keys)
        return next((i for i, key in enumerate(keys) if key not in self.held), len(keys))

    def close(self) -> None:
        pass


def test_a_reset_makes_the_mooncake_tier_forget_the_old_kv(
    test_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, probes = _Store(), []

    def probe(config: TierConfig) -> _Store:
        probes.append(config)
        return store

    monkeypatch.setenv(TIER_SECRET_ENV, "test")
    monkeypatch.setattr(connector_tier, "shared_store_probe", probe)
    s = scheduler(test_model_dir, {"tier": "mooncake"})
    connector = _connector(s)
    saved: list[str] = []
    build = connector.build_connector_meta

    def recording(output: object) -> AgentHintsMetadata:
        meta = build(output)  # type: ignore[arg-type]
        assert isinstance(meta, AgentHintsMetadata)
        saved.extend(key for key, _, _ in meta.tier.saves)
        return meta

    monkeypatch.setattr(connector, "build_connector_meta", recording)
    _serve(s, "a")
    old = set(saved)
    assert len(old) >= 2
    store.held.update(shard_key(key, Shard()) for key in old)  # the workers stored them
    planner = _tier(connector).planner

    # Device cache emptied, the tier kept: the same prompt loads from the tier.
    assert s.reset_prefix_cache() is True
    _serve(s, "b")
    hits = planner.counters.hits
    assert hits >= 2

    assert s.reset_prefix_cache(reset_connector=True) is True
    store.asked.clear()
    _serve(s, "c")
    after = _tier(connector).planner
    assert after.counters.hits == hits  # nothing loaded; the counters carried over
    # The store was asked for c's blocks under new keys, and they were saved
    # under those: none of the old KV's.
    assert store.asked and not set(store.asked) & store.held
    new = set(saved) - old
    assert len(new) == len(old) and after.index.bytes_used > 0
    assert len(probes) == 1  # the one query-only client, kept
