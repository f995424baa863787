"""What every KV tier offers the connector."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

__all__ = ["KVTier", "TierStats"]


@dataclass(slots=True)
class TierStats:
    """Counters of one tier instance (cumulative)."""

    hits: int = 0
    misses: int = 0
    puts: int = 0
    evictions: int = 0
    corrupt: int = 0
    errors: int = 0


class KVTier(Protocol):
    """A store of flat uint8 CPU tensors (packed KV blocks) by key.

    ``get`` returns None for anything it cannot vouch for (absent, evicted,
    checksum mismatch, store unreachable): a miss costs a recompute, never
    corrupt KV. ``put`` returns False when the value was not stored.
    """

    def contains(self, keys: Sequence[str]) -> int:
        """How many of ``keys``, from the first, the tier holds."""
        ...

    def put(self, key: str, value: torch.Tensor, pin_s: float = 0.0) -> bool: ...

    def get(self, key: str) -> torch.Tensor | None: ...

    def drop(self, keys: Sequence[str]) -> None: ...

    def close(self) -> None:
        """Release the store (native clients must not outlive the interpreter)."""
        ...

    @property
    def bytes_used(self) -> int: ...

    @property
    def stats(self) -> TierStats: ...
