"""``python -m benchmarks.bound``: the reuse any eviction policy could reach in a run.

Replays the prompts of a saved run (the JSON of ``benchmarks.replay``) in the
order they were sent, one at a time, through a prefix cache of ``--blocks`` full
blocks, once under LRU and once under Belady's optimal policy (evict the block
whose next use is furthest in the future: perfect knowledge of what comes).
Blocks pinned by running requests are ignored, so both numbers are upper bounds
for their policy *given that order*: when a run's reuse is near the Belady
bound, better eviction cannot help, only a different order (admission) or more
capacity (a tier) can.

    python -m benchmarks.bound results/matrix.json [--blocks 256] [--configs retention]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._traces import PrefixIndex, TokenMapper, select_traces

REPO_ROOT = Path(__file__).resolve().parents[1]

_NEVER = float("inf")


def _hits(blocks: list[int], prompt_len: int, size: int, cached: Any) -> int:
    """Cached prefix tokens, capped like vLLM (the last prompt token is computed)."""
    limit = (prompt_len - 1) // size
    n = 0
    while n < min(len(blocks), limit) and blocks[n] in cached:
        n += 1
    return n * size


def bounds(prompts: Sequence[Sequence[int]], block_size: int, capacity: int) -> tuple[int, int]:
    """(LRU, Belady) cached tokens of ``prompts`` served in order."""
    index = PrefixIndex(block_size)
    seqs = [index.chain(p)[0] for p in prompts]
    next_use: list[dict[int, float]] = [{} for _ in seqs]
    seen: dict[int, float] = {}
    for i in range(len(seqs) - 1, -1, -1):
        next_use[i] = {b: seen.get(b, _NEVER) for b in seqs[i]}
        seen.update((b, i) for b in seqs[i])
    lru: OrderedDict[int, None] = OrderedDict()
    belady: dict[int, float] = {}
    lru_hits = belady_hits = 0
    for i, (prompt, blocks) in enumerate(zip(prompts, seqs, strict=True)):
        lru_hits += _hits(blocks, len(prompt), block_size, lru)
        belady_hits += _hits(blocks, len(prompt), block_size, belady)
        for b in blocks:
            lru[b] = None
            lru.move_to_end(b)
            belady[b] = next_use[i][b]
        while len(lru) > capacity:
            lru.popitem(last=False)
        if len(belady) > capacity:
            furthest = sorted(belady, key=belady.__getitem__, reverse=True)
            for b in furthest[: len(belady) - capacity]:
                del belady[b]
    return lru_hits, belady_hits


def _prompts_of(header: dict[str, Any], traces_dir: Path) -> dict[tuple[str, str, int], list[int]]:
    args = header["args"]
    trace_ids = args.get("trace_ids")
    traces = select_traces(
        traces_dir,
        args["scale_k"],
        args["max_model_len"] - args["max_out"],
        trace_ids=trace_ids.split(",") if trace_ids else None,
        n_traces=args["n_traces"],
        max_requests=args.get("max_requests_per_trace"),
    )
    prompts: dict[tuple[str, str, int], list[int]] = {}
    for trace in traces:
        mapper = TokenMapper(trace.trace_id, args["scale_k"])
        seq: defaultdict[str, int] = defaultdict(int)
        for branch, request in trace.ordered():
            prompts[(trace.trace_id, branch, seq[branch])] = mapper.prompt(request.hash_ids)
            seq[branch] += 1
    return prompts


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
    traces_dir = args.traces or Path(
        header_args.get("traces") or REPO_ROOT.parent / "shared" / "traces"
    )
    capacity = args.blocks or header_args["kv_blocks"]
    block_size = header_args["block_size"]
    prompts = _prompts_of(payload, traces_dir)
    wanted = args.configs.split(",") if args.configs else list(payload["configs"])
    head = f"{'config':<12}{'run reuse':>10}{'LRU bound':>11}{'Belady bound':>14}"
    print(f"{head}   ({capacity} blocks)")
    for name in wanted:
        records = sorted(payload["configs"][name]["records"], key=lambda r: r["sent_at"])
        theory = sum(r["theoretical_cached"] for r in records)
        cached = sum(r["cached_tokens"] or 0 for r in records)
        order = [prompts[(r["trace_id"], r["branch"], r["seq"])] for r in records]
        lru, belady = bounds(order, block_size, capacity)
        print(f"{name:<12}{cached / theory:>10.1%}{lru / theory:>11.1%}{belady / theory:>14.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
