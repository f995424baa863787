"""Unit tests of the Mooncake tier's pieces: key index, codec, planner, worker, guard."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from tier_fakes import MemoryTier

from server_ext.testing import ManualClock
from server_ext.tier import (
    TIER_SECRET_ENV,
    BlockCodec,
    BlockProgress,
    GuardedTier,
    KeyIndex,
    KVTier,
    Shard,
    TierConfig,
    TierConfigError,
    TierPayoff,
    TierPlanner,
    TierStats,
    TierWorker,
    block_key,
    kv_role,
    shard_key,
)


def blob(seed: int, n: int = 100) -> torch.Tensor:
    return torch.full((n,), seed % 256, dtype=torch.uint8)


def test_key_index_keeps_to_budget_lru_first() -> None:
    index = KeyIndex(300)
    for k in ("a", "b", "c"):
        assert index.add(k, 100) == []
    index.touch(["a"])  # a is now most recently used
    assert index.add("d", 100) == ["b"]  # the LRU key went
    assert (index.bytes_used, len(index)) == (300, 3)
    assert index.leading(["a", "c", "d"]) == 3 and "b" not in index
    assert index.add("huge", 301) == ["huge"]  # larger than the whole budget
    assert index.leading(["a", "c", "d"]) == 3 and "huge" not in index
    assert index.bytes_used == 300


def test_leading_counts_leading_keys_only() -> None:
    index = KeyIndex(None)
    index.add("a", 100)
    index.add("c", 100)
    assert index.leading(["a", "b", "c"]) == 1
    assert index.leading([]) == 0


def test_soft_pins_are_evicted_last_and_expire() -> None:
    clock = ManualClock()
    index = KeyIndex(200, clock)
    index.add("pinned", 100, pin_s=60)
    index.add("plain", 100)
    assert index.add("new", 100) == ["plain"]  # though "pinned" is older
    assert index.add("newer", 100, pin_s=60) == ["new"]  # the unpinned one went again
    # All pinned: soft pins yield, least recently used first.
    assert index.add("newest", 100, pin_s=60) == ["pinned"]
    assert index.leading(["newer", "newest"]) == 2
    index = KeyIndex(200, clock)
    index.add("p", 100, pin_s=10)
    index.add("q", 100)
    clock.now = 11  # the pin expired: plain LRU again
    assert index.add("r", 100) == ["p"]


def test_keys_are_salted_by_tenant_and_namespace() -> None:
    h = b"\x01" * 32
    keys = {
        block_key("model-a|64", "alice", h),
        block_key("model-a|64", "bob", h),
        block_key("model-b|64", "alice", h),
        block_key("model-a|64", "alice", b"\x02" * 32),
    }
    assert len(keys) == 4
    assert block_key("model-a|64", "alice", h) == block_key("model-a|64", "alice", h)
    # Length-prefixed: moving a separator between fields changes the key.
    assert block_key("ab", "c", h) != block_key("a", "bc", h)


def kv_caches(layers: int = 2, blocks: int = 6, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        f"layer.{i}": torch.randn(2, blocks, 4, 8, 16, generator=g).to(torch.bfloat16)
        for i in range(layers)
    }


def test_codec_round_trips_every_layer() -> None:
    source = kv_caches(seed=1)
    target = kv_caches(seed=2)
    codec = BlockCodec(source, num_blocks=6)
    packed = codec.pack([4, 1])
    assert [p.numel() for p in packed] == [codec.block_bytes] * 2
    assert codec.block_bytes == 2 * (2 * 4 * 8 * 16 * 2)
    into = BlockCodec(target, num_blocks=6)
    into.unpack(packed[0], 0)
    into.unpack(packed[1], 5)
    for name in source:
        assert torch.equal(target[name][:, 0], source[name][:, 4])
        assert torch.equal(target[name][:, 5], source[name][:, 1])
    with pytest.raises(ValueError):
        into.unpack(packed[0][:-2], 0)


def test_codec_handles_kernel_blocks_smaller_than_vllm_blocks() -> None:
    source = {"l": torch.arange(2 * 8 * 3, dtype=torch.float32).reshape(2, 8, 3, 1, 1)}
    target = {"l": torch.zeros(2, 8, 3, 1, 1)}
    packed = BlockCodec(source, num_blocks=4).pack([1])  # kernel blocks 2 and 3
    BlockCodec(target, num_blocks=4).unpack(packed[0], 3)  # into kernel blocks 6 and 7
    assert torch.equal(target["l"][:, 6:8], source["l"][:, 2:4])


BS = 4  # tokens per block in the planner tests


def planner(budget_blocks: int | None = None) -> TierPlanner:
    budget = None if budget_blocks is None else budget_blocks * 10
    return TierPlanner(KeyIndex(budget), "ns", BS, 10)


HASHES = [bytes([i]) * 8 for i in range(8)]


def test_planner_saves_full_blocks_once_then_loads_them() -> None:
    plan = planner()
    plan.track("r1", "t", pin_s=0)
    assert plan.lookup("r1", HASHES[:4], num_tokens=17, num_computed=0) == 0
    plan.allocated("r1", [10, 11, 12, 13, 14], 0)
    ops = plan.step([BlockProgress("r1", HASHES[:4], [10, 11, 12, 13, 14], 9)])
    assert [b for _, b, _ in ops.saves] == [10, 11]  # 9 tokens: two full blocks
    ops = plan.step([BlockProgress("r1", HASHES[:4], [10, 11, 12, 13, 14], 17)])
    assert [b for _, b, _ in ops.saves] == [12, 13]
    plan.finished("r1")

    # The same prefix returns with 2 blocks still on device: the tier has the
    # other 2, and the last prompt token is always left to compute.
    plan.track("r2", "t", pin_s=0)
    assert plan.lookup("r2", HASHES[:4], num_tokens=16, num_computed=8) == 4
    assert plan.lookup("r2", HASHES[:4], num_tokens=17, num_computed=8) == 8
    plan.allocated("r2", [20, 21, 22, 23, 24], 8)
    ops = plan.step([BlockProgress("r2", HASHES[:4], [20, 21, 22, 23, 24], 17)])
    assert [b for _, b in ops.loads] == [22, 23]
    assert ops.saves == []  # blocks 0-1 and the loaded 2-3 are all in the tier
    assert plan.counters.hits == 2
    # A failed load is counted, never taken back: counters feed Prometheus
    # counters, which cannot go down.
    plan.worker_report([], [ops.loads[0][0]], 0, 0)
    assert (plan.counters.hits, plan.counters.load_failures) == (2, 1)

    # Another tenant never sees them.
    plan.track("r3", "other", pin_s=0)
    assert plan.lookup("r3", HASHES[:4], num_tokens=17, num_computed=0) == 0


def test_planner_forgets_evictions_drops_sheds_and_forgets_failures() -> None:
    plan = planner(budget_blocks=2)
    plan.track("r", "t", pin_s=0)
    ops = plan.step([BlockProgress("r", HASHES[:3], [1, 2, 3], 12)])
    # Three saves into a two-block index: the first is evicted in the same
    # step, so it is simply not saved (and needs no drop).
    assert [b for _, b, _ in ops.saves] == [2, 3]
    assert ops.drops == []
    oldest = ops.saves[0][0]
    plan.track("s", "t", pin_s=0)
    ops = plan.step([BlockProgress("s", HASHES[4:5], [9], 4)])
    # The index's least recently used key makes room: the store evicts on its
    # own (another engine may still use the key), so it is forgotten, not dropped.
    assert ops.drops == [] and [b for _, b, _ in ops.saves] == [9]
    assert oldest not in plan.index and len(plan.index) == 2
    plan.worker_report([ops.saves[0][0]], [], 0, 0)
    assert len(plan.index) == 1
    assert plan.counters.save_failures == 1

    # A tenant beyond its share of the index: its own oldest keys are shed,
    # and a shed key the store holds is dropped.
    shares = TierPlanner(KeyIndex(None, owner_budget_bytes=20), "ns", BS, 10)
    shares.track("a", "t", pin_s=0)
    ops = shares.step([BlockProgress("a", HASHES[:3], [1, 2, 3], 12)])
    assert [b for _, b, _ in ops.saves] == [2, 3] and ops.drops == []  # shed before saved
    first = ops.saves[0][0]
    shares.track("b", "t", pin_s=0)
    ops = shares.step([BlockProgress("b", HASHES[4:5], [9], 4)])
    assert ops.drops == [first] and [b for _, b, _ in ops.saves] == [9]
    assert first not in shares.index and shares.index.owner_bytes("t") == 20


def test_planner_asks_a_shared_store_once_for_what_its_index_lacks() -> None:
    # Another engine stored blocks 0-2 of this prefix in the shared store.
    stored_elsewhere = {block_key("ns", "t", h) for h in HASHES[:3]}
    asked: list[list[str]] = []

    def shared(keys: Sequence[str]) -> int:
        asked.append(list(keys))
        return next((i for i, k in enumerate(keys) if k not in stored_elsewhere), len(keys))

    plan = TierPlanner(KeyIndex(None), "ns", BS, 10, shared=shared)
    plan.track("r", "t", pin_s=0)
    assert plan.lookup("r", HASHES[:5], num_tokens=21, num_computed=0) == 3 * BS
    # A waiting request is looked up every step: the store is asked once.
    assert plan.lookup("r", HASHES[:5], num_tokens=21, num_computed=0) == 3 * BS
    assert len(asked) == 1 and len(asked[0]) == 5
    plan.allocated("r", [7, 8, 9, 10, 11, 12], 3 * BS)
    ops = plan.step([BlockProgress("r", HASHES[:5], [7, 8, 9, 10, 11, 12], 21)])
    assert [b for _, b in ops.loads] == [7, 8, 9]
    assert [b for _, b, _ in ops.saves] == [10, 11]  # computed here, stored for others
    assert plan.counters.shared_blocks == 3 and plan.counters.hits == 3

    # The next request of the prefix finds it in the index, without asking.
    plan.track("s", "t", pin_s=0)
    assert plan.lookup("s", HASHES[:5], num_tokens=21, num_computed=0) == 5 * BS
    assert len(asked) == 1


def test_tier_payoff_allows_saves_while_loads_pay_or_within_the_allowance() -> None:
    books = TierPayoff(explore_share=0.1)
    assert books.saving  # nothing spent yet
    books.cost(0.5)
    assert not books.saving  # spent, nothing spared, no busy time to excuse it
    books.busy(4.0)
    assert not books.saving  # 0.1 * 4 s of allowance < 0.5 s
    books.busy(1.0)
    assert books.saving  # 0.5 s allowance: the share of busy time it may spend
    books.cost(1.0)
    books.spared(1.0)
    assert books.saving  # 1.5 s spent: 1.0 s spared + 0.5 s allowance
    books.cost(-5.0)  # nothing goes down
    assert books.cost_s == 1.5
    with pytest.raises(ValueError, match="explore_share"):
        TierPayoff(explore_share=1.5)


def test_planner_stops_saving_while_its_loads_do_not_pay() -> None:
    plan = planner()
    plan.engine_step(busy_s=1.0, seconds_per_token=0.01)
    plan.track("r", "t", pin_s=0)
    ops = plan.step([BlockProgress("r", HASHES[:4], [1, 2, 3, 4], 8)])
    assert [b for _, b, _ in ops.saves] == [1, 2]
    # Saving took 0.05 s of a 1 s busy engine: more than its 2% allowance, and
    # no load has spared anything. A request that starts now is not saved; one
    # being saved is saved whole (a prompt the tier holds only in part, past
    # its first blocks, could not be loaded).
    plan.worker_report([], [], 200, 0, seconds=0.05)
    assert not plan.payoff.saving
    plan.track("q", "t", pin_s=0)
    ops = plan.step(
        [
            BlockProgress("r", HASHES[:4], [1, 2, 3, 4], 16),
            BlockProgress("q", HASHES[4:6], [5, 6], 8),
        ]
    )
    assert [b for _, b, _ in ops.saves] == [3, 4] and plan.counters.unsaved == 2
    plan.finished("r")
    plan.finished("q")

    # A returning prefix loads two saved blocks: 8 tokens of prefill at 0.01 s
    # spared 0.08 s > 0.05 s spent, so saving resumes.
    plan.track("s", "t", pin_s=0)
    assert plan.lookup("s", HASHES[:4], num_tokens=17, num_computed=8) == 2 * BS
    plan.allocated("s", [7, 8, 9, 10, 11], 2 * BS)
    assert plan.payoff.saving
    plan.track("u", "t", pin_s=0)
    ops = plan.step(
        [
            BlockProgress("s", HASHES[:4], [7, 8, 9, 10, 11], 17),
            BlockProgress("u", HASHES[6:8], [12, 13], 8),
        ]
    )
    assert [b for _, b in ops.loads] == [9, 10] and [b for _, b, _ in ops.saves] == [12, 13]
    # A load that failed spared nothing: the books take it back as a cost.
    plan.worker_report([], [ops.loads[0][0]], 0, 0, seconds=0.0)
    assert plan.payoff.cost_s == pytest.approx(0.05 + 4 * 0.01)


def test_planner_with_the_trial_off_always_saves() -> None:
    plan = TierPlanner(KeyIndex(None), "ns", BS, 10, payoff=TierPayoff(False))
    plan.worker_report([], [], 0, 0, seconds=100.0)
    plan.track("r", "t", pin_s=0)
    assert len(plan.step([BlockProgress("r", HASHES[:2], [1, 2], 8)]).saves) == 2
    assert TierConfig.from_mapping({"tier_trial": False}).trial is False  # type: ignore[union-attr]
    with pytest.raises(TierConfigError, match="tier_trial"):
        TierConfig.from_mapping({"tier_trial": "no"})


def test_planner_untracked_requests_never_touch_the_tier() -> None:
    plan = planner()
    assert plan.lookup("x", HASHES, 33, 0) == 0
    assert not plan.step([BlockProgress("x", HASHES, list(range(8)), 32)])


def test_worker_moves_blocks_and_reports_failures() -> None:
    source, target = kv_caches(seed=3), kv_caches(seed=4)
    tier = MemoryTier()
    saver = TierWorker(tier, BlockCodec(source, 6), Shard())
    saver.save([("k1", 2, 0.0), ("k2", 3, 0.0)], drops=[])
    loader = TierWorker(tier, BlockCodec(target, 6), Shard())
    assert loader.load([("k1", 0), ("k2", 1), ("missing", 5)]) == {5}
    for name in source:
        assert torch.equal(target[name][:, 0:2], source[name][:, 2:4])
    report = loader.take_report()
    assert report is not None and report.failed_loads == ["missing"]
    assert report.bytes_loaded == 2 * loader.codec.block_bytes
    saver.save([], drops=["k1"])
    assert tier.contains([shard_key("k1", Shard())]) == 0


def test_a_corrupted_value_is_a_failed_load_never_corrupt_kv() -> None:
    source, target = kv_caches(seed=3), kv_caches(seed=4)
    before = {name: t.clone() for name, t in target.items()}
    tier = MemoryTier()
    TierWorker(tier, BlockCodec(source, 6)).save([("k1", 2, 0.0), ("k2", 3, 0.0)], drops=[])
    stored, _ = tier.values[shard_key("k1", Shard())]
    stored[3] ^= 0xFF  # the stored bytes rot
    loader = TierWorker(tier, BlockCodec(target, 6))
    assert loader.load([("k1", 0), ("k2", 1)]) == {0}  # vLLM recomputes block 0
    for name in source:
        assert torch.equal(target[name][:, 0], before[name][:, 0])  # left as it was
        assert torch.equal(target[name][:, 1], source[name][:, 3])
    report = loader.take_report()
    assert report is not None and report.failed_loads == ["k1"]
    assert tier.stats.corrupt == 1 and tier.contains([shard_key("k1", Shard())]) == 0


def test_worker_reports_the_step_time_its_transfers_took() -> None:
    clock = ManualClock()

    class SlowTier(MemoryTier):
        def put(self, key: str, value: torch.Tensor, pin_s: float = 0.0) -> bool:
            clock.now += 0.25
            return super().put(key, value, pin_s)

    worker = TierWorker(SlowTier(), BlockCodec(kv_caches(), 6), clock=clock)
    worker.save([("k1", 2, 0.0), ("k2", 3, 0.0)], drops=[])
    report = worker.take_report()
    assert report is not None and report.seconds == pytest.approx(0.5)


class BrokenTier:
    """A tier whose every call raises or hangs."""

    def __init__(self, hang: threading.Event | None = None) -> None:
        self.hang = hang
        self.calls = 0

    def _fail(self) -> None:
        self.calls += 1
        if self.hang is not None:
            self.hang.wait(5)
        raise ConnectionError("store down")

    def contains(self, keys: Sequence[str]) -> int:
        self._fail()
        return 0

    def put(self, key: str, value: torch.Tensor, pin_s: float = 0.0) -> bool:
        self._fail()
        return False

    def get(self, key: str) -> torch.Tensor | None:
        self._fail()
        return None

    def drop(self, keys: Sequence[str]) -> None:
        self._fail()

    def close(self) -> None:
        self._fail()

    @property
    def bytes_used(self) -> int:
        return 0

    @property
    def stats(self) -> TierStats:
        raise NotImplementedError


def test_guard_turns_failures_and_hangs_into_misses() -> None:
    clock = ManualClock()
    broken = BrokenTier()
    tier: KVTier = GuardedTier(lambda: broken, timeout_s=0.5, cooldown_s=10, clock=clock)
    assert tier.get("k") is None
    assert not tier.put("k", blob(1))  # breaker open: no call reaches the store
    assert broken.calls == 1
    clock.now = 11
    assert tier.contains(["k"]) == 0
    assert broken.calls == 2

    release = threading.Event()
    hung = GuardedTier(lambda: BrokenTier(release), timeout_s=0.2, cooldown_s=0, clock=clock)
    assert hung.get("k") is None  # timed out
    assert hung.get("k") is None  # the helper is still stuck: a miss at once
    release.set()


def test_factory_failure_is_contained_and_retried() -> None:
    clock = ManualClock()
    attempts: list[int] = []

    def factory() -> KVTier:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("master not up yet")
        return MemoryTier()

    tier = GuardedTier(factory, timeout_s=1, cooldown_s=5, clock=clock)
    assert not tier.put("k", blob(1))
    clock.now = 6
    assert tier.put("k", blob(1))
    assert tier.get("k") is not None


def test_connect_builds_the_tier_in_the_background() -> None:
    built = threading.Event()
    release = threading.Event()

    def factory() -> KVTier:
        built.set()
        release.wait(5)
        return MemoryTier()

    tier = GuardedTier(factory, timeout_s=1, cooldown_s=5)
    tier.connect()
    assert built.wait(5)
    assert tier.contains(["k"]) == 0  # still connecting: a miss at once, no wait
    assert tier.available  # and no breaker opened
    release.set()
    deadline = time.monotonic() + 5
    while not tier.put("k", blob(1)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tier.contains(["k"]) == 1


def test_a_worker_connects_its_tier_before_the_first_step() -> None:
    """A connection slower than a step's budget (Mooncake registering its
    segment on a busy host) must not skip the first prefill's saves: the
    worker starts connecting when it is built, so the engine's start-up
    covers the connection."""

    def factory() -> KVTier:
        time.sleep(0.4)
        return MemoryTier()

    worker = TierWorker(
        GuardedTier(factory, timeout_s=1), BlockCodec(kv_caches(seed=3), 6), budget_s=0.25
    )
    time.sleep(0.6)  # the engine's start-up after registering its KV caches
    worker.save([(f"k{i}", i, 0.0) for i in range(4)], drops=[])
    report = worker.take_report()
    assert report is not None and not report.failed_saves and report.bytes_saved > 0


def test_tier_config(monkeypatch: pytest.MonkeyPatch) -> None:
    # A host tier unless told otherwise: vLLM's offloading (its cpu_bytes_to_use).
    default = TierConfig.from_mapping({})
    assert default is not None and (default.kind, default.budget_bytes) == ("host", 1 << 30)
    assert TierConfig.from_mapping({"tier": "none"}) is None
    with pytest.raises(TierConfigError, match="'host' or 'mooncake' or 'none'"):
        TierConfig.from_mapping({"tier": None})
    config = TierConfig.from_mapping({"tier": "host", "tier_bytes": 1 << 20})
    assert config is not None and config.budget_bytes == 1 << 20
    # vLLM's offloading loads the host tier beside the extension's connector,
    # which itself loads KV (a consumer, kv_both) only from a Mooncake store.
    assert kv_role(default) == kv_role(config) == kv_role(None) == "kv_producer"
    mooncake = TierConfig.from_mapping({"tier": "mooncake"})
    assert mooncake is not None and mooncake.kind == "mooncake"
    assert kv_role(mooncake) == "kv_both"
    monkeypatch.delenv(TIER_SECRET_ENV, raising=False)
    assert config.secret() is None  # host memory of the engine itself needs no secret
    for bad in ({"tier": "disk"}, {"tier": "host", "tier_bytes": 0},
                {"tier": "mooncake", "mooncake_master": 5}):  # fmt: skip
        with pytest.raises(TierConfigError):
            TierConfig.from_mapping(bad)


def test_store_keys_bind_the_workers_layer_layout() -> None:
    """Two pipeline stages with equal layer counts hold same-shaped parts of a
    block: their store keys differ, so neither loads the other's layers."""
    stage0, stage1 = Shard(pp_rank=0, pp_size=2), Shard(pp_rank=1, pp_size=2)
    keys = {shard_key("k", s) for s in (stage0, stage1, Shard(tp_rank=1, tp_size=2), Shard())}
    assert len(keys) == 4
    split = Shard(pp_rank=0, pp_size=2, layers="10,22")
    assert shard_key("k", split) != shard_key("k", stage0)


def test_a_save_one_worker_failed_is_dropped_on_every_worker() -> None:
    """Parallel workers each store their part of a key: when one fails, the
    others' parts are dropped with the next step, not left outside the budget."""
    plan = TierPlanner(KeyIndex(None), "ns", BS, 10)
    plan.track("r", "t", pin_s=0)
    ops = plan.step([BlockProgress("r", HASHES[:2], [0, 1], 2 * BS)])
    first, second = (key for key, _, _ in ops.saves)
    plan.worker_report([first], [], bytes_saved=10, bytes_loaded=0)
    assert first not in plan.index and second in plan.index
    assert plan.step([]).drops == [first]
    assert plan.step([]).drops == []


def test_with_mla_one_rank_stores_the_part_every_rank_loads() -> None:
    """MLA's latent KV is the same on every tensor-parallel rank: rank 0
    stores one part, the others store nothing and load that part."""
    source, target = kv_caches(seed=3), kv_caches(seed=4)
    tier = MemoryTier()
    TierWorker(tier, BlockCodec(source, 6), Shard(), stores=False).save([("k1", 2, 0.0)], [])
    assert tier.contains([shard_key("k1", Shard())]) == 0  # rank 1: nothing stored
    TierWorker(tier, BlockCodec(source, 6), Shard()).save([("k1", 2, 0.0)], [])
    other_rank = TierWorker(tier, BlockCodec(target, 6), Shard(), stores=False)
    assert other_rank.load([("k1", 0)]) == set()
    for name in source:
        assert torch.equal(target[name][:, 0], source[name][:, 2])


def test_the_scheduler_names_mla_blocks_by_one_part() -> None:
    from types import SimpleNamespace

    from server_ext.connector.tier import first_shard as _first_shard

    def config(mla: bool) -> Any:
        parallel = SimpleNamespace(
            pipeline_parallel_size=1, tensor_parallel_size=4, decode_context_parallel_size=1
        )
        return SimpleNamespace(parallel_config=parallel, model_config=SimpleNamespace(use_mla=mla))

    assert _first_shard(config(True)) == Shard()
    assert _first_shard(config(False)) == Shard(tp_size=4)
