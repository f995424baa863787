"""The server of each benchmark configuration, and its gauges over time.

Starting and stopping vLLM is ``server_ext.local_server``'s job (loopback only,
bounded startup, process group killed on exit), shared with the test fixtures;
this module only says what each configuration serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from server_ext import LocalServer, local_server, stop_local_servers
from server_ext.tier import DEFAULT_TIER, TierConfig, local_mooncake_master

from ._ceiling import ceiling, tier_blocks

__all__ = [
    "CONFIGS",
    "Config",
    "MetricsSample",
    "ServerPlan",
    "extension_tier_bytes",
    "sample_metrics",
    "serve",
    "sigterm_as_exit",
]


def extension_tier_bytes(extra_config: Mapping[str, object] | None = None) -> int:
    """The host tier's bytes the extension takes from ``extra_config``: its
    ``tier_bytes``, else the extension's default."""
    tier = TierConfig.from_mapping({**(extra_config or {}), "tier": "host"})
    if tier is None:  # a host tier was asked for
        raise AssertionError("no host tier")
    return tier.budget_bytes


@dataclass(frozen=True, slots=True)
class Config:
    """One configuration of the matrix: what the server runs, whether clients hint.

    Each step adds one mechanism to the previous, so adjacent rows of the table
    attribute the difference to it; ``unlimited`` is the bound. ``hint_free``:
    plain vLLM with vLLM's own KV offloading at the plan's ``tier_bytes`` and
    its LRU, reading no hint (what a user gets from vLLM's
    ``--kv-offloading-size``): the baseline the extension's tier must beat.
    """

    name: str
    description: str
    extension: bool = False
    prefetch: bool = False
    tier: Literal["host", "mooncake", "none"] | None = None  # None: the extension's default
    unlimited: bool = False
    hint_free: bool = False

    @property
    def hints(self) -> bool:
        """Clients send ``Agent-Hints`` exactly when the extension reads them."""
        return self.extension


CONFIGS: dict[str, Config] = {
    c.name: c
    for c in (
        Config("plain", "vLLM as shipped"),
        Config(
            "hint-free", "vLLM's offloading at the same bytes, LRU, no hints read", hint_free=True
        ),
        Config(
            "retention", "+ agent-hints retention (hinted clients)", extension=True, tier="none"
        ),
        Config(
            "prefetch",
            "+ prefetch by recompute in tool gaps",
            extension=True,
            prefetch=True,
            tier="none",
        ),
        Config("host", "+ host-memory KV tier", extension=True, prefetch=True, tier="host"),
        Config(
            "mooncake", "+ Mooncake Store KV tier", extension=True, prefetch=True, tier="mooncake"
        ),
        Config("unlimited", "vLLM with room for every block: the bound", unlimited=True),
    )
}
"""The benchmark matrix, in table order."""


@dataclass(frozen=True, slots=True)
class ServerPlan:
    """What every configuration shares.

    Args:
        model: Checkpoint directory (served with random weights).
        kv_blocks: KV capacity of every configuration but ``unlimited``.
        unlimited_blocks: KV capacity of ``unlimited``.
        extra_config: The extension's ``kv_connector_extra_config``; each
            configuration adds its own ``prefetch`` and tier keys.
        tier_bytes: Budget of the host tier and of each Mooncake segment:
            the extension's tier wherever it has one (its default, the host
            tier, included) and vLLM's offloading in ``hint-free`` get the same
            bytes (default: the extension's default).
        server_args: More vLLM flags, for every configuration alike.
    """

    model: str
    kv_blocks: int
    unlimited_blocks: int
    block_size: int = 64
    max_model_len: int = 8192
    extra_config: Mapping[str, object] | None = None
    tier_bytes: int = extension_tier_bytes()
    server_args: tuple[str, ...] = ()
    startup_timeout_s: float = 300.0

    def kv_blocks_of(self, config: Config) -> int:
        return self.unlimited_blocks if config.unlimited else self.kv_blocks

    def tier_of(self, config: Config) -> str | None:
        """The tier ``config`` runs with (``tier_bytes`` of it), None without."""
        if config.hint_free:
            return "host"
        if not config.extension:
            return None
        tier = config.tier or str((self.extra_config or {}).get("tier", DEFAULT_TIER))
        return None if tier == "none" else tier

    def ceiling_of(
        self, config: Config, prompts: Sequence[Sequence[int]], theoretical: int
    ) -> dict[str, Any]:
        """The ceiling (``benchmarks._ceiling``) of a run of ``config`` that sent
        ``prompts`` in this order: at its device KV, and with ``tier_bytes`` of
        tier in blocks of the served model."""
        return ceiling(
            prompts,
            theoretical,
            self.block_size,
            self.kv_blocks_of(config),
            tier_blocks(self.model, self.tier_bytes, self.block_size),
            tiered=self.tier_of(config) is not None,
        )

    def extra_config_of(self, config: Config, mooncake_master: str | None) -> dict[str, object]:
        """The extension's settings for ``config``: ``extra_config``, the
        configuration's mechanisms, and the per-session counters on
        ``/metrics`` that the report reads (they change no behaviour)."""
        extra: dict[str, object] = {
            "state_metrics": True,
            **(self.extra_config or {}),
            "prefetch": config.prefetch,
        }
        if config.tier is not None:
            extra["tier"] = config.tier
        if self.tier_of(config) in ("host", "mooncake"):
            extra["tier_bytes"] = self.tier_bytes
        if config.tier == "mooncake":
            extra.update(mooncake_master=mooncake_master, mooncake_segment_bytes=self.tier_bytes)
        return extra


@contextlib.contextmanager
def serve(plan: ServerPlan, config: Config, log_dir: Path) -> Iterator[LocalServer]:
    """A fresh server for ``config`` (and its Mooncake master), stopped on exit."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        master = (
            stack.enter_context(local_mooncake_master()).address
            if config.tier == "mooncake"
            else None
        )
        server = stack.enter_context(
            local_server(
                plan.model,
                extension=config.extension,
                kv_blocks=plan.kv_blocks_of(config),
                block_size=plan.block_size,
                max_model_len=plan.max_model_len,
                extra_config=plan.extra_config_of(config, master) if config.extension else None,
                args=plan.server_args,
                startup_timeout=plan.startup_timeout_s,
                log_dir=log_dir,
                offload_bytes=plan.tier_bytes if config.hint_free else None,
            )
        )
        yield server


_SIGTERM_GRACE_S = 60.0
"""How long a SIGTERM may take to unwind through ``serve`` (stopping a server
takes up to 30 s before its SIGKILL)."""


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Turn SIGTERM into ``SystemExit`` while the block runs (main thread only).

    Each server runs in its own process group, so a run killed by SIGTERM (a
    ``timeout``, a CI cancel) would leave its vLLM behind, 3.5 GB and a port; as
    an exception, the kill unwinds through ``serve``, which stops it. Python drops
    an exception raised while the handler interrupts a ``__del__`` or a weakref
    callback (a run once went on for 90 s after its SIGTERM), so a process still
    alive ``_SIGTERM_GRACE_S`` later stops its servers and exits without unwinding.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_(signum: int, _frame: object) -> None:
        def unwound_too_slowly() -> None:
            stop_local_servers()
            os._exit(128 + signum)

        fallback = threading.Timer(_SIGTERM_GRACE_S, unwound_too_slowly)
        fallback.daemon = True
        fallback.start()
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
