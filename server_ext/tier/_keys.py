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

import torch

__all__ = ["MAC_BYTES", "block_key", "checksum", "mac", "shard_key"]

MAC_BYTES = 16


def block_key(namespace: str, tenant: str, block_hash: bytes, secret: bytes | None = None) -> str:
    """A digest of (namespace, tenant, vLLM block hash), length-prefixed;
    keyed (BLAKE2b) with ``secret`` when given, else sha256."""
    digest = hashlib.blake2b(key=secret) if secret else hashlib.sha256()
    for part in (namespace.encode(), tenant.encode(), bytes(block_hash)):
        digest.update(len(part).to_bytes(4, "little"))
        digest.update(part)
    return "agent-hints/" + digest.hexdigest()


def shard_key(key: str, rank: int) -> str:
    """The store key of tensor-parallel rank ``rank``'s shard of block ``key``."""
    return f"{key}/tp{rank}"


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
