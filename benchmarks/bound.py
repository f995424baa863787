"""``python -m benchmarks.bound``: the reuse any eviction policy could reach in a run.

Replays the prompts of a saved run (the JSON of ``benchmarks.replay``) in the
order they were sent, one at a time, through a prefix cache of ``--blocks`` full
blocks, under three policies: LRU (no knowledge of what comes); the
extension's ``RetentionPolicy`` (retaining each response as the extension
does, taught by the run's ``gap`` hints and the gaps seen so far, and
releasing in its victim order); and Belady's optimal policy (evict the block
whose next use is furthest in the future: perfect knowledge). Blocks pinned
by running requests are ignored, so the numbers are upper bounds for their
policy *given that order*: when a run's reuse is near the Belady bound,
better eviction cannot help, only a different order (admission) or more
capacity (a tier) can; the gap between the predicted and the Belady column is
what imperfect predictions of returns cost. LRU and Belady are
``benchmarks._ceiling``'s, which every benchmark's table shows for each run at
its device KV and with the tier's blocks added.

    python -m benchmarks.bound results/matrix.json [--blocks 256] [--configs retention]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server_ext.policy import BranchHints, BranchKey, PolicyConfig, RetentionPolicy

from ._ceiling import bounds, prefix_hits, touch
from ._report import hinted_gap
from ._traces import (
    PrefixIndex,
    RequestKey,
    default_traces_dir,
    request_prompts,
    run_requests,
)

__all__ = ["Sent", "bounds", "main", "predicted"]

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Sent:
    """A request of a run, as ``predicted`` needs it.

    Args:
        prompt: Its token ids.
        session: Its session (gaps are learned per session, as the server does).
        branch: Its branch in the session.
        sent_at: When it was sent; requests come in this order.
        done_at: When its response ended (the branch leaves for its tool).
        gap: The ``gap`` hint it carried, if any.
    """

    prompt: Sequence[int]
    session: str
    branch: str
    sent_at: float
    done_at: float
    gap: float | None = None


def predicted(requests: Sequence[Sent], block_size: int, capacity: int) -> int:
    """Cached tokens of ``requests`` served in order when the extension's
    ``RetentionPolicy`` chooses what to evict.

    Each response's blocks are retained as the policy retains them (its
    ``gap`` hint as prior, gaps learned per session; budget as in the matrix:
    the whole cache). When the cache is over capacity, blocks no retention
    holds go first (least recently used first), then the policy releases
    retentions in its own victim order: expired first, then the branch
    predicted back last given how long it has been away. Starts and finishes
    reach the policy in time order (a response may end after later requests
    were sent).
    """
    index = PrefixIndex(block_size)
    config = PolicyConfig(total_blocks=capacity, max_held_fraction=1.0, max_tenant_fraction=1.0)
    policy = RetentionPolicy(config)
    cache: OrderedDict[int, None] = OrderedDict()
    chains = [index.chain(r.prompt)[0] for r in requests]
    # (time, finish after start at the same instant, request)
    events = sorted(
        [(r.sent_at, False, i) for i, r in enumerate(requests)]
        + [(r.done_at, True, i) for i, r in enumerate(requests)]
    )
    hits = 0
    for now, finish, i in events:
        r, blocks = requests[i], chains[i]
        key = BranchKey("", r.session, r.branch)
        if finish:
            policy.on_request_finished(key, blocks, BranchHints(gap=r.gap), True, now=now)
            continue
        policy.on_request_started(key, now=now)  # back: learns the gap
        hits += prefix_hits(blocks, len(r.prompt), block_size, cache)
        touch(cache, blocks)
        while len(cache) > capacity:
            held = {b for retained in policy.retentions() for b in retained.block_ids}
            for b in [b for b in cache if b not in held][: len(cache) - capacity]:
                del cache[b]
            if len(cache) > capacity and not policy.make_room(len(cache) - capacity, now=now):
                break
    return hits


def _prompts_of(args: dict[str, Any], traces_dir: Path) -> dict[RequestKey, list[int]]:
    return request_prompts(run_requests(args, traces_dir), args["scale_k"])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bound", description=__doc__)
    p.add_argument("run", type=Path, help="JSON written by benchmarks.replay")
    p.add_argument("--blocks", type=int, help="cache capacity (default: the run's --kv-blocks)")
    p.add_argument("--configs", help="comma-separated configurations (default: all)")
    p.add_argument("--traces", type=Path, help="trace directory (default: the run's)")
    args = p.parse_args(argv)
    if not args.run.is_file():
        sys.exit(f"error: no such file: {args.run}")
    payload = json.loads(args.run.read_text())
    header_args = payload["args"]
    traces_dir = args.traces or Path(header_args.get("traces") or default_traces_dir(REPO_ROOT))
    capacity = args.blocks or header_args["kv_blocks"]
    block_size = header_args["block_size"]
    prompts = _prompts_of(header_args, traces_dir)
    wanted = args.configs.split(",") if args.configs else list(payload["configs"])
    head = f"{'config':<12}{'run reuse':>10}{'LRU':>8}{'predicted':>11}{'Belady':>8}"
    print(f"{head}   (bounds in the run's send order, {capacity} blocks)")
    for name in wanted:
        records = sorted(payload["configs"][name]["records"], key=lambda r: r["sent_at"])
        theory = sum(r["theoretical_cached"] for r in records)
        cached = sum(r["cached_tokens"] or 0 for r in records)
        sent = [_sent(r, prompts[(r["trace_id"], r["branch"], r["seq"])]) for r in records]
        lru, belady = bounds([x.prompt for x in sent], block_size, capacity)
        hinted = predicted(sent, block_size, capacity)
        print(
            f"{name:<12}{cached / theory:>10.1%}{lru / theory:>8.1%}"
            f"{hinted / theory:>11.1%}{belady / theory:>8.1%}"
        )
    return 0


def _sent(record: dict[str, Any], prompt: list[int]) -> Sent:
    done_at = record["sent_at"] + (record["latency_s"] or 0.0)
    gap = hinted_gap(record.get("hint"))
    return Sent(prompt, record["trace_id"], record["branch"], record["sent_at"], done_at, gap)


if __name__ == "__main__":
    sys.exit(main())
