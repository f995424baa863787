"""Tier settings, read from the same ``kv_connector_extra_config`` as the rest."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DEFAULT_TIER",
    "TIER_KINDS",
    "TIER_SECRET_ENV",
    "TIER_STORES",
    "TierConfig",
    "TierConfigError",
    "kv_role",
]

TIER_SECRET_ENV = "AGENT_HINTS_TIER_SECRET"
"""The deployment's tier secret (the same on every engine sharing a store)."""

TIER_KINDS = ("host", "mooncake", "none")
"""Values of the ``tier`` key (``none``: device memory only)."""

TIER_STORES = ("computed", "evicted")
"""Values of the ``tier_store`` key: when the host tier (vLLM's offloading)
stores a block. ``computed``: vLLM's write-through, every block as it is
computed; ``evicted``: the blocks the device is about to evict, so that device
and tier hold different blocks (``server_ext.offload._victims``)."""

DEFAULT_TIER = "host"
"""A host-memory tier unless told otherwise: retention on the device only
chooses which blocks a full pool loses, a tier adds capacity (what the suite
measured: device-only retention even with plain LRU, the host tier ahead of it
on every family). The host tier is vLLM's own offloading (``OffloadingConnector``)
with the extension's cache policy (``server_ext.offload``)."""


class TierConfigError(ValueError):
    """An invalid tier setting; the message names the key."""


def _invalid(name: str, value: object, expected: str) -> TierConfigError:
    return TierConfigError(f"kv_connector_extra_config[{name!r}]={value!r}: expected {expected}")


def _number(extra: Mapping[str, object], name: str, default: float) -> float:
    value = extra.get(name, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise _invalid(name, value, "a number > 0")
    return value


@dataclass(frozen=True, slots=True)
class TierConfig:
    """Args:
    kind: ``"host"`` (vLLM's offloading to host memory) or ``"mooncake"``.
    budget_bytes: host memory for offloaded KV, all workers together (vLLM's
        ``cpu_bytes_to_use``); for Mooncake, how many bytes of keys the
        scheduler remembers (the store evicts on its own).
    mooncake_master: ``host:port`` of ``mooncake_master``.
    mooncake_segment_bytes: memory each worker contributes to the store.
    timeout_s: longest a Mooncake call may take before it counts as a miss.
    tenant_fraction: Mooncake: share of ``budget_bytes`` one tenant's blocks
        may take; a tenant over it makes room from its own blocks.
    step_budget_s: Mooncake: longest an engine step's loads, and its saves, may
        wait on the store; loads past it are recomputed, saves past it skipped.
    trial: Mooncake: save only while the store's loads pay for its step time
        (``TierPayoff``); False: always save.
    store: host: when vLLM's offloading stores a block (``TIER_STORES``).
    """

    kind: Literal["host", "mooncake"]
    budget_bytes: int
    mooncake_master: str
    mooncake_segment_bytes: int
    timeout_s: float
    tenant_fraction: float = 0.5
    step_budget_s: float = 0.25
    trial: bool = True
    store: Literal["computed", "evicted"] = "computed"

    @classmethod
    def from_mapping(cls, extra: Mapping[str, object] | None) -> TierConfig | None:
        """The tier settings in ``extra`` (keys ``tier``, ``tier_bytes``,
        ``mooncake_master``, ``mooncake_segment_bytes``, ``tier_timeout_s``,
        ``tier_tenant_fraction``, ``tier_step_budget_s``, ``tier_trial``, ``tier_store``;
        ``tier`` defaults to
        ``DEFAULT_TIER``), or None for ``"tier": "none"``."""
        extra = extra or {}
        kind = extra.get("tier", DEFAULT_TIER)
        if kind not in TIER_KINDS:
            raise _invalid("tier", kind, " or ".join(repr(k) for k in TIER_KINDS))
        if kind == "none":
            return None
        store = extra.get("tier_store", TIER_STORES[0])
        if store not in TIER_STORES:
            raise _invalid("tier_store", store, " or ".join(repr(s) for s in TIER_STORES))
        master = extra.get("mooncake_master", "127.0.0.1:50051")
        if not isinstance(master, str) or ":" not in master:
            raise _invalid("mooncake_master", master, "'host:port'")
        return cls(
            kind="host" if kind == "host" else "mooncake",
            budget_bytes=int(_number(extra, "tier_bytes", 1 << 30)),
            mooncake_master=master,
            mooncake_segment_bytes=int(_number(extra, "mooncake_segment_bytes", 256 << 20)),
            timeout_s=float(_number(extra, "tier_timeout_s", 1.0)),
            tenant_fraction=_fraction(extra, "tier_tenant_fraction", 0.5),
            step_budget_s=float(_number(extra, "tier_step_budget_s", 0.25)),
            trial=_flag(extra, "tier_trial", True),
            store="evicted" if store == "evicted" else "computed",
        )

    def secret(self) -> bytes | None:
        """The key of every tier key and value MAC: ``TIER_SECRET_ENV``,
        required for Mooncake (a store others can write to); the host tier,
        in the engine's own memory, needs none. The secret may be any length:
        its sha256 is the key (BLAKE2b takes at most 64 bytes)."""
        value = os.environ.get(TIER_SECRET_ENV, "")
        if self.kind == "mooncake" and not value:
            raise TierConfigError(
                f"tier='mooncake': set {TIER_SECRET_ENV} to a secret shared by every engine "
                "of the store (without it, anyone who can write to the store could plant KV)"
            )
        return hashlib.sha256(value.encode()).digest() if value else None

    @property
    def tenant_budget_bytes(self) -> int:
        return int(self.budget_bytes * self.tenant_fraction)


def _flag(extra: Mapping[str, object], name: str, default: bool) -> bool:
    value = extra.get(name, default)
    if not isinstance(value, bool):
        raise _invalid(name, value, "true or false")
    return value


def _fraction(extra: Mapping[str, object], name: str, default: float) -> float:
    value = _number(extra, name, default)
    if value > 1:
        raise _invalid(name, value, "a fraction in (0, 1]")
    return float(value)


def kv_role(tier: TierConfig | None) -> str:
    """The extension connector's vLLM ``kv_role``.

    With a tier of its own (Mooncake) the connector loads KV into device
    blocks, so vLLM must know it as a consumer (``kv_both``): under async
    scheduling it then defers freeing a finished request's blocks until no
    step in flight can still write them. Otherwise it loads nothing (the host
    tier is vLLM's offloading connector beside it), and ``kv_producer``
    spares every request that deferral.
    """
    return "kv_both" if tier is not None and tier.kind == "mooncake" else "kv_producer"
