"""The policy's addressable heap, and the benchmark of its operations at scale.

The attacks on the policy's work and on tenant isolation are in
test_security.py (section 6).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from benchmarks.policy_ops import main
from server_ext.policy._heap import IndexedHeap


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
