"""Tier keys and value checksums.

A key names one vLLM block (all layers packed) of one tenant of one model
layout, so a tier shared by several engines or tenants can never hand one
tenant's KV to another, nor KV of another model or block layout.

vLLM's block hashes are predictable (a fixed hash seed), so in a store that
others can write to (Mooncake) keys are keyed with the deployment's secret
(``TIER_SECRET_ENV``) and every value carries a MAC under it, bound to its
key: a writer without the secret can neither name a block a server will load
nor make a value it will accept, under that key or another.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass

import torch

__all__ = ["MAC_BYTES", "Shard", "block_key", "checksum", "mac", "shard_key"]

MAC_BYTES = 16


def block_key(namespace: str, tenant: str, block_hash: bytes, secret: bytes | None = None) -> str:
    """A digest of (namespace, tenant, vLLM block hash), length-prefixed;
    keyed (BLAKE2b) with ``secret`` when given, else sha256."""
    digest = hashlib.blake2b(key=secret) if secret else hashlib.sha256()
    for part in (namespace.encode(), tenant.encode(), bytes(block_hash)):
        digest.update(len(part).to_bytes(4, "little"))
        digest.update(part)
    return "agent-hints/" + digest.hexdigest()


@dataclass(frozen=True, slots=True)
class Shard:
    """Which part of a block's KV one worker holds: its pipeline stage (of
    how many, and how the layers are split over them), its tensor-parallel
    and decode-context-parallel rank (of how many).

    Every part goes into the store key, and so under the value's MAC: two
    stages with equal layer counts hold same-shaped values, and a key naming
    the rank alone would let one stage load another's layers as valid KV.
    """

    pp_rank: int = 0
    pp_size: int = 1
    tp_rank: int = 0
    tp_size: int = 1
    dcp_rank: int = 0
    dcp_size: int = 1
    layers: str = ""
    """The pipeline's layer split when an operator set one (vLLM's
    ``VLLM_PP_LAYER_PARTITION``), else empty: vLLM's even split."""

    def __str__(self) -> str:
        text = (
            f"pp{self.pp_rank}of{self.pp_size}.tp{self.tp_rank}of{self.tp_size}"
            f".dcp{self.dcp_rank}of{self.dcp_size}"
        )
        return f"{text}.layers{self.layers}" if self.layers else text


def shard_key(key: str, shard: Shard) -> str:
    """The store key of ``shard``'s part of block ``key``."""
    return f"{key}/{shard}"


def checksum(value: torch.Tensor) -> int:
    """crc32 of a flat uint8 CPU tensor: a mismatch on load is a miss, never bad KV
    (accidents only: the host tier's memory has no other writer)."""
    return zlib.crc32(value.numpy().data)


def mac(secret: bytes | None, key: str, payload: bytes | memoryview) -> bytes:
    """``MAC_BYTES`` of keyed BLAKE2b over (store key, value): without
    ``secret`` it still catches accidents and values moved between keys."""
    digest = hashlib.blake2b(key=secret or b"", digest_size=MAC_BYTES)
    encoded = key.encode()
    digest.update(len(encoded).to_bytes(4, "little"))
    digest.update(encoded)
    digest.update(payload)
    return digest.digest()
