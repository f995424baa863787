"""A KV tier in host memory."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from ._index import KeyIndex
from ._keys import checksum
from ._protocol import TierStats

__all__ = ["HostTier"]


class HostTier:
    """Host-memory pool of packed KV blocks: byte budget, LRU, soft pins, checksums.

    Written against torch: on a GPU engine ``put`` copies device -> host, on the
    CPU test bed the (already packed, fresh) tensor is kept as is. With
    ``budget_bytes=None`` the pool never evicts on its own: an owner that keeps
    its own ``KeyIndex`` (the scheduler) tells it what to ``drop``.
    """

    def __init__(
        self, budget_bytes: int | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._index = KeyIndex(budget_bytes, clock)
        self._values: dict[str, tuple[torch.Tensor, int]] = {}
        self._stats = TierStats()

    def contains(self, keys: Sequence[str]) -> int:
        return self._index.leading(keys)

    def put(self, key: str, value: torch.Tensor, pin_s: float = 0.0) -> bool:
        host = value.detach().to("cpu").contiguous().view(torch.uint8).reshape(-1)
        evicted = self._index.add(key, host.numel(), pin_s)
        self._stats.evictions += len([k for k in evicted if k != key])
        for victim in evicted:
            self._values.pop(victim, None)
        if key in evicted:
            return False
        if key not in self._values:
            self._values[key] = (host, checksum(host))
            self._stats.puts += 1
        return True

    def get(self, key: str) -> torch.Tensor | None:
        entry = self._values.get(key)
        if entry is None:
            self._stats.misses += 1
            return None
        value, crc = entry
        if checksum(value) != crc:
            self._stats.corrupt += 1
            self._stats.misses += 1
            self.drop([key])
            return None
        self._index.touch([key])
        self._stats.hits += 1
        return value

    def drop(self, keys: Sequence[str]) -> None:
        self._index.remove(keys)
        for key in keys:
            self._values.pop(key, None)

    def close(self) -> None:
        self.drop(list(self._values))

    @property
    def bytes_used(self) -> int:
        return self._index.bytes_used

    @property
    def stats(self) -> TierStats:
        return self._stats
