"""Tier settings, read from the same ``kv_connector_extra_config`` as the rest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["TierConfig", "TierConfigError", "kv_role"]


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
    kind: ``"host"`` (a host-memory pool per worker) or ``"mooncake"``.
    budget_bytes: the host pool's budget; for Mooncake, how many bytes of keys
        the scheduler remembers (the store evicts on its own).
    mooncake_master: ``host:port`` of ``mooncake_master``.
    mooncake_segment_bytes: memory each worker contributes to the store.
    timeout_s: longest a Mooncake call may take before it counts as a miss.
    """

    kind: Literal["host", "mooncake"]
    budget_bytes: int
    mooncake_master: str
    mooncake_segment_bytes: int
    timeout_s: float

    @classmethod
    def from_mapping(cls, extra: Mapping[str, object] | None) -> TierConfig | None:
        """The tier settings in ``extra`` (keys ``tier``, ``tier_bytes``,
        ``mooncake_master``, ``mooncake_segment_bytes``, ``tier_timeout_s``), or
        None when no ``tier`` is set."""
        extra = extra or {}
        kind = extra.get("tier")
        if kind is None:
            return None
        if kind not in ("host", "mooncake"):
            raise _invalid("tier", kind, "'host' or 'mooncake'")
        master = extra.get("mooncake_master", "127.0.0.1:50051")
        if not isinstance(master, str) or ":" not in master:
            raise _invalid("mooncake_master", master, "'host:port'")
        return cls(
            kind="host" if kind == "host" else "mooncake",
            budget_bytes=int(_number(extra, "tier_bytes", 1 << 30)),
            mooncake_master=master,
            mooncake_segment_bytes=int(_number(extra, "mooncake_segment_bytes", 256 << 20)),
            timeout_s=float(_number(extra, "tier_timeout_s", 1.0)),
        )


def kv_role(tier: TierConfig | None) -> str:
    """The connector's vLLM ``kv_role``.

    With a tier the connector loads KV into device blocks, so vLLM must know it
    as a consumer (``kv_both``): under async scheduling it then defers freeing a
    finished request's blocks until no step in flight can still write them.
    Without one it loads nothing, and ``kv_producer`` spares every request that
    deferral.
    """
    return "kv_both" if tier is not None else "kv_producer"
