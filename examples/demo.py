"""The README's main job: an agent workload through vLLM, plain vs hinted, side by side.

Starts a local vLLM CPU server (the generated tiny model, random weights) once
without and once with the extension, replays a short slice of real agentic coding
traces (../shared/traces) through each at the same KV capacity, prints the
comparison and where the JSON and the plots (TTFT CDF, reuse over time) went, and
stops the server. The full matrix (prefetch, tiers, the unlimited bound) is
``make bench`` (``python -m benchmarks.replay``).

    python -m examples.demo [--out results/demo.json] [any benchmarks.replay flag]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from benchmarks import replay

EXTENSION_CONFIG = '{"max_held_fraction": 1.0, "max_tenant_fraction": 1.0, "max_defer_s": 20}'
DEMO_ARGS = (
    "--n-traces", "4",
    "--max-requests-per-trace", "16",
    "--time-scale", "20",
    "--kv-blocks", "160",
    "--configs", "plain,retention",
    # Every request of the workload is hinted: lift the budget that keeps room
    # for unhinted traffic's LRU cache; think times are compressed, so allow
    # warm-first admission the same 20 s as the benchmark matrix.
    "--extension-config", EXTENSION_CONFIG,
    "--out", "results/demo.json",
)  # fmt: skip


def main(argv: Sequence[str] = ()) -> int:
    print("agent-hints demo: 4 real agent sessions, plain vLLM vs vLLM + agent-hints")
    return replay.main([*DEMO_ARGS, *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
