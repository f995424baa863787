"""An in-memory ``KVTier`` for tests that need some tier (worker, guard, security)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from server_ext.tier import TierStats, checksum


class MemoryTier:
    """A dict of flat uint8 tensors, each kept with its checksum: never evicts,
    and a value whose bytes changed since ``put`` is a miss (``get``: None).

    ``put`` keeps the tensor it is given (a flat uint8 CPU tensor is stored as
    is), so a test can corrupt a stored value through its own reference or
    ``values``."""

    def __init__(self) -> None:
        self.values: dict[str, tuple[torch.Tensor, int]] = {}
        self._stats = TierStats()

    def contains(self, keys: Sequence[str]) -> int:
        for i, key in enumerate(keys):
            if key not in self.values:
                return i
        return len(keys)

    def put(self, key: str, value: torch.Tensor, pin_s: float = 0.0) -> bool:
        flat = value.detach().to("cpu").contiguous().view(torch.uint8).reshape(-1)
        self.values[key] = (flat, checksum(flat))
        self._stats.puts += 1
        return True

    def get(self, key: str) -> torch.Tensor | None:
        entry = self.values.get(key)
        if entry is not None and checksum(entry[0]) != entry[1]:
            self._stats.corrupt += 1
            del self.values[key]
            entry = None
        if entry is None:
            self._stats.misses += 1
            return None
        self._stats.hits += 1
        return entry[0]

    def drop(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.values.pop(key, None)

    def close(self) -> None:
        self.values.clear()

    @property
    def bytes_used(self) -> int:
        return sum(value.numel() for value, _ in self.values.values())

    @property
    def stats(self) -> TierStats:
        return self._stats
