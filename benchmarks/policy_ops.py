"""``python -m benchmarks.policy_ops``: what each retention-policy operation costs at scale.

The policy runs on vLLM's scheduler thread, between engine steps, so every
operation it does per step or per request must stay cheap however many
retentions tenants create. This builds a ``RetentionPolicy`` holding
``--retentions`` retentions over ``--tenants`` tenants (each branch its own
session, all sharing one 4-block prefix, the cheapest way to make many), then
times each operation ``--repeats`` times and prints microseconds per call
(median and p99), and writes them as JSON (``--out``).

    python -m benchmarks.policy_ops --retentions 100000 --tenants 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from server_ext.policy import (
    BranchHints,
    BranchKey,
    PolicyConfig,
    RetentionPolicy,
    ToolStartEvent,
)
from server_ext.testing import ManualClock

__all__ = ["build", "main", "time_ops"]

_PREFIX = (1, 2, 3, 4)


def build(retentions: int, tenants: int, total_blocks: int) -> tuple[RetentionPolicy, ManualClock]:
    """A policy holding ``retentions`` branches of ``tenants`` tenants."""
    clock = ManualClock()
    config = PolicyConfig(
        total_blocks=total_blocks,
        max_held_fraction=1.0,
        max_tenant_fraction=1.0,
        max_tenant_retentions=max(retentions // max(tenants, 1) + 1, 1),
    )
    policy = RetentionPolicy(config, clock=clock)
    for i in range(retentions):
        clock.now = i * 1e-4
        key = BranchKey(f"t{i % tenants}", f"s{i}")
        policy.on_request_finished(
            key, (*_PREFIX, 10 + i % 64), BranchHints(gap=5.0 + i % 50), True
        )
    return policy, clock


def time_ops(policy: RetentionPolicy, clock: ManualClock, repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each operation, ``repeats`` calls each."""
    n = policy.retained_branches
    ops: dict[str, Callable[[int], object]] = {
        # per engine step
        "expire (nothing due)": lambda i: policy.expire(),
        # per waiting hinted request per step (warm-first admission)
        "return_due": lambda i: policy.return_due(clock.now, 1.0, BranchKey("t0", "x")),
        # per request
        "retain a finished request": lambda i: policy.on_request_finished(
            BranchKey(f"t{i % 7}", f"new{i}"),
            (*_PREFIX, 99),
            BranchHints(gap=3.0),
            True,
        ),
        "a branch's request arrives": lambda i: policy.on_request_arrived(
            BranchKey(f"t{i % 7}", f"s{(i * 7919) % n}")
        ),
        "a branch's request starts": lambda i: policy.on_request_started(
            BranchKey(f"t{i % 7}", f"s{(i * 104729) % n}")
        ),
        "control: tool_start": lambda i: policy.on_control(
            f"t{i % 7}", f"s{(i * 31) % n}", ToolStartEvent(tool="bash", eta=4.0)
        ),
        # per allocation the free queue cannot serve
        "make_room(1)": lambda i: policy.make_room(1),
        # per warm-up considered
        "next_return": lambda i: policy.next_return(BranchKey("t1", f"s{i % n}"), clock.now),
        "releasable_for": lambda i: policy.releasable_for(
            clock.now + 1.0, clock.now, BranchKey("t1", "x"), 4
        ),
    }
    timings: dict[str, list[float]] = {}
    for name, op in ops.items():
        samples = []
        for i in range(repeats):
            start = time.perf_counter()
            op(i)
            samples.append(time.perf_counter() - start)
        timings[name] = samples
    return timings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.policy_ops", description=__doc__)
    p.add_argument("--retentions", type=int, default=100_000)
    p.add_argument("--tenants", type=int, default=100)
    p.add_argument("--blocks", type=int, default=200_000, help="KV blocks of the pool")
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--out", type=Path, default=Path("results/policy_ops.json"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    started = time.perf_counter()
    policy, clock = build(args.retentions, args.tenants, args.blocks)
    built_s = time.perf_counter() - started
    print(
        f"{policy.retained_branches:,} retentions of {args.tenants} tenants "
        f"built in {built_s:.1f} s ({1e6 * built_s / max(args.retentions, 1):.1f} us each)"
    )
    timings = time_ops(policy, clock, args.repeats)
    rows: dict[str, Any] = {}
    print(f"{'operation':<30}{'median us':>12}{'p99 us':>10}{'max us':>10}")
    for name, samples in timings.items():
        us = sorted(1e6 * s for s in samples)
        row = {
            "median_us": statistics.median(us),
            "p99_us": us[min(len(us) - 1, round(0.99 * (len(us) - 1)))],
            "max_us": us[-1],
        }
        rows[name] = row
        print(f"{name:<30}{row['median_us']:>12.1f}{row['p99_us']:>10.1f}{row['max_us']:>10.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "policy_ops",
                "retentions": args.retentions,
                "tenants": args.tenants,
                "build_s": built_s,
                "ops": rows,
            },
            indent=1,
        )
    )
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
