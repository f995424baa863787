"""A KV tier in Mooncake Store (a shared, distributed KV pool)."""

from __future__ import annotations

import hmac
import socket
from collections.abc import Sequence
from typing import Any

import torch

from ._keys import MAC_BYTES, mac
from ._protocol import TierStats

__all__ = ["MooncakeTier"]


class MooncakeTier:
    """Mooncake Store client over TCP with the ``P2PHANDSHAKE`` metadata mode.

    Values are the packed block bytes plus a MAC trailer under the
    deployment's ``secret``, bound to the key and verified on every get (a
    value anyone else wrote is a miss). Soft pins map to Mooncake's
    ``soft_pin_ttl_ms`` (evicted only when nothing else can be). The store
    evicts on its own; the planner drops only a tenant's blocks beyond its
    share (other engines may still want anything else). Construction
    connects and raises ``OSError`` when the master cannot be reached;
    wrap the tier in ``GuardedTier`` so that a slow or dead store is a miss.
    """

    def __init__(
        self,
        master: str,
        *,
        local_host: str = "127.0.0.1",
        segment_bytes: int = 256 << 20,
        buffer_bytes: int = 64 << 20,
        secret: bytes | None = None,
    ) -> None:
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig, SoftPinAction

        # setup() against an absent master retries for ~90 s holding the GIL,
        # which no thread timeout can bound: probe the port first.
        host, _, port = master.rpartition(":")
        socket.create_connection((host, int(port)), timeout=1.0).close()
        self._store: Any = MooncakeDistributedStore()
        rc = self._store.setup(
            local_host, "P2PHANDSHAKE", segment_bytes, buffer_bytes, "tcp", "", master
        )
        if rc != 0:
            raise OSError(f"mooncake setup({master}) returned {rc}")
        self._replicate_config = ReplicateConfig
        self._soft_pin = SoftPinAction.ENABLE
        self._secret = secret
        self._bytes_put = 0
        self._stats = TierStats()

    def contains(self, keys: Sequence[str]) -> int:
        if not keys:
            return 0
        found = self._store.batch_is_exist(list(keys))
        for i, flag in enumerate(found):
            if flag != 1:
                return i
        return len(keys)

    def put(self, key: str, value: torch.Tensor, pin_s: float = 0.0) -> bool:
        host = value.detach().to("cpu").contiguous().view(torch.uint8).reshape(-1)
        data = host.numpy().tobytes()
        payload = data + mac(self._secret, key, data)
        config = self._replicate_config()
        if pin_s > 0:
            config.soft_pin_action = self._soft_pin
            config.soft_pin_ttl_ms = int(pin_s * 1000)
        rc = self._store.put(key, payload, config)
        if rc != 0:
            self._stats.errors += 1
            return False
        self._stats.puts += 1
        self._bytes_put += len(payload)
        return True

    def get(self, key: str) -> torch.Tensor | None:
        data: bytes = self._store.get(key)
        if len(data) <= MAC_BYTES:  # a missing key reads as b""
            self._stats.misses += 1
            return None
        body = memoryview(data)[:-MAC_BYTES]
        if not hmac.compare_digest(mac(self._secret, key, body), data[-MAC_BYTES:]):
            self._stats.corrupt += 1
            self._stats.misses += 1
            return None
        self._stats.hits += 1
        return torch.frombuffer(bytearray(body), dtype=torch.uint8)

    def drop(self, keys: Sequence[str]) -> None:
        if keys:
            self._store.batch_remove(list(keys))

    def close(self) -> None:
        self._store.close()

    @property
    def bytes_used(self) -> int:
        """Bytes this client has put (the store's own usage is on the master)."""
        return self._bytes_put

    @property
    def stats(self) -> TierStats:
        return self._stats
