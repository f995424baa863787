"""No tenant slows, evicts or outgrows another through the policy, and its work stays bounded.

The attacks of the security review, run on the policy itself (a fake clock, no
vLLM): a tenant's hints must not hold another tenant's requests back, claimed
gaps must not evict a tenant within its fair share, and one tenant's flood of
sessions (all sharing one prefix, so its block budget does not stop them) must
leave the policy bounded in state and in work per call.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from benchmarks.policy_ops import main
from server_ext.policy import (
    MAX_DROPS,
    BranchHints,
    BranchKey,
    PolicyConfig,
    Release,
    RetentionPolicy,
)
from server_ext.policy._heap import IndexedHeap


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


def test_indexed_heap_orders_re_ranks_and_removes() -> None:
    rng = random.Random(7)
    heap = IndexedHeap[int]()
    truth: dict[int, float] = {}
    for _ in range(3000):
        k = rng.randrange(200)
        if rng.random() < 0.3:
            heap.remove(k)
            truth.pop(k, None)
        else:
            truth[k] = rng.random()
            heap.set(k, truth[k])
        assert len(heap) == len(truth)
        first = heap.peek()
        assert (first is None) == (not truth)
        if first is not None:
            assert first[0] == min(truth.values())
    with heap.scan(lambda k: truth.get(k)) as keys:
        read = [next(keys) for _ in range(min(5, len(truth)))]
    assert read == sorted(truth, key=truth.__getitem__)[: len(read)]
    assert len(heap) == len(truth)  # the keys read are back


def test_the_operations_benchmark_times_every_operation(tmp_path: Path) -> None:
    out = tmp_path / "ops.json"
    assert (
        main(["--retentions", "2000", "--tenants", "10", "--repeats", "5", "--out", str(out)]) == 0
    )
    ops = json.loads(out.read_text())["ops"]
    assert {"make_room(1)", "return_due", "retain a finished request"} <= set(ops)
    assert all(row["median_us"] > 0 for row in ops.values())
