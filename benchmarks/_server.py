"""The server of each benchmark configuration, and its gauges over time.

Starting and stopping vLLM is ``server_ext.local_server``'s job (loopback only,
bounded startup, process group killed on exit), shared with the test fixtures;
this module only says what each configuration serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from server_ext import LocalServer, local_server

__all__ = ["CONFIGS", "MetricsSample", "ServerPlan", "sample_metrics", "serve"]

CONFIGS = ("plain", "extension", "unlimited")
"""plain vLLM; the same plus the extension (hinted); plain vLLM with room for everything."""


@dataclass(frozen=True, slots=True)
class ServerPlan:
    """What every configuration shares.

    Args:
        model: Checkpoint directory (served with random weights).
        kv_blocks: KV capacity of ``plain`` and ``extension``.
        unlimited_blocks: KV capacity of ``unlimited``.
        extra_config: The extension's ``kv_connector_extra_config``.
        server_args: More vLLM flags, for every configuration alike.
    """

    model: str
    kv_blocks: int
    unlimited_blocks: int
    block_size: int = 64
    max_model_len: int = 8192
    extra_config: Mapping[str, object] | None = None
    server_args: tuple[str, ...] = ()
    startup_timeout_s: float = 300.0

    def kv_blocks_of(self, config: str) -> int:
        return self.unlimited_blocks if config == "unlimited" else self.kv_blocks


@contextlib.contextmanager
def serve(plan: ServerPlan, config: str, log_dir: Path) -> Iterator[LocalServer]:
    """A fresh server for ``config``, stopped on exit."""
    if config not in CONFIGS:
        raise ValueError(f"unknown config {config!r}")
    extension = config == "extension"
    log_dir.mkdir(parents=True, exist_ok=True)
    with local_server(
        plan.model,
        extension=extension,
        kv_blocks=plan.kv_blocks_of(config),
        block_size=plan.block_size,
        max_model_len=plan.max_model_len,
        extra_config=plan.extra_config if extension else None,
        args=plan.server_args,
        startup_timeout=plan.startup_timeout_s,
        log_dir=log_dir,
    ) as server:
        yield server


@dataclass(frozen=True, slots=True)
class MetricsSample:
    """Gauges at one instant of a run (``t`` in s from its start)."""

    t: float
    values: dict[str, float]


async def sample_metrics(
    server: LocalServer,
    names: Sequence[str],
    into: list[MetricsSample],
    start: float,
    period_s: float = 1.0,
) -> None:
    """Append the ``names`` gauges every ``period_s`` until cancelled."""
    while True:
        with contextlib.suppress(OSError):
            metrics = await asyncio.to_thread(server.metrics)
            values = {n: metrics[n] for n in names if n in metrics}
            into.append(MetricsSample(round(time.monotonic() - start, 2), values))
        await asyncio.sleep(period_s)
