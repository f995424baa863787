"""Tier keys and value checksums.

A key names one vLLM block (all layers packed) of one tenant of one model
layout, so a tier shared by several engines or tenants can never hand one
tenant's KV to another, nor KV of another model or block layout.
"""

from __future__ import annotations

import hashlib
import zlib

import torch

__all__ = ["block_key", "checksum", "shard_key"]


def block_key(namespace: str, tenant: str, block_hash: bytes) -> str:
    """sha256 of (namespace, tenant, vLLM block hash), length-prefixed."""
    digest = hashlib.sha256()
    for part in (namespace.encode(), tenant.encode(), bytes(block_hash)):
        digest.update(len(part).to_bytes(4, "little"))
        digest.update(part)
    return "agent-hints/" + digest.hexdigest()


def shard_key(key: str, rank: int) -> str:
    """The store key of tensor-parallel rank ``rank``'s shard of block ``key``."""
    return f"{key}/tp{rank}"


def checksum(value: torch.Tensor) -> int:
    """crc32 of a flat uint8 CPU tensor: a mismatch on load is a miss, never bad KV."""
    return zlib.crc32(value.numpy().data)
