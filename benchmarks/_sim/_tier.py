"""The host tier and the shared pool: vLLM's own ``CPUOffloadingManager``,
with the links their copies take.

The manager is vLLM's, unchanged: its chunk pool, reference counts and
store/load protocol, and a ``CachePolicy`` that picks what goes: vLLM's
``LRUCachePolicy`` (hint-free) or the extension's ``AgentHintsCachePolicy``
(its default tier), the latter on the simulator's clock. The scheduler side
is modelled as vLLM's offloading connector drives it: a request's lookup
after its device hit (the longest run of ready chunks), ``prepare_load`` /
``complete_load`` around an asynchronous load the request waits for,
``prepare_store`` of the blocks a request computed once its prefill is done
and ``complete_store`` when the copy lands, ``on_request_finished`` (the
policy's recency and hints) when it ends. A control message reaches the
policy as vLLM's offloading sees one: a request with no blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import cast

from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from server_ext.offload import AgentHintsCachePolicy

from ._model import LinkSpec

__all__ = ["Link", "Tier", "offload_key", "offload_keys"]


def offload_key(key: int) -> OffloadKey:
    return make_offload_key(key.to_bytes(8, "big"), 0)


def offload_keys(keys: Sequence[int]) -> list[OffloadKey]:
    """``offload_key`` of each key, at once: the key's 8 bytes and group 0's
    4 zero bytes are the 12 bytes of ``key << 32``."""
    return cast(list[OffloadKey], [(k << 32).to_bytes(12, "big") for k in keys])


class Link:
    """One direction of a path: transfers queue behind each other."""

    __slots__ = ("_free_at", "busy_s", "bytes_moved", "spec")

    def __init__(self, spec: LinkSpec) -> None:
        self.spec = spec
        self._free_at = 0.0
        self.bytes_moved = 0
        self.busy_s = 0.0

    def transfer(self, now: float, nbytes: int) -> float:
        """When ``nbytes`` sent at ``now`` have arrived."""
        seconds = nbytes / self.spec.bandwidth
        start = max(now, self._free_at)
        self._free_at = start + seconds
        self.bytes_moved += nbytes
        self.busy_s += seconds
        return self._free_at + self.spec.latency_s


class Tier:
    """A ``CPUOffloadingManager`` of ``chunks`` blocks under ``policy``
    (``"lru"`` or ``"hints"``: ``AgentHintsCachePolicy`` on ``clock``)."""

    def __init__(self, chunks: int, policy: str, clock: Callable[[], float]) -> None:
        self.manager = CPUOffloadingManager(max(chunks, 1), cache_policy="lru")
        if policy == "hints":
            # vLLM builds its policy from the capacity alone (wall clock); the
            # same class on the simulated clock, before the manager used it.
            self.manager._policy = AgentHintsCachePolicy(max(chunks, 1), clock=clock)
        elif policy != "lru":
            raise ValueError(f"unknown tier policy {policy!r}")
        self.stores = 0
        self.loads = 0

    @staticmethod
    def context(request_id: str, params: Mapping[str, object] | None) -> ReqContext:
        return ReqContext(req_id=request_id, kv_transfer_params=dict(params) if params else None)

    def begin(self, ctx: ReqContext) -> None:
        self.manager.on_new_request(ctx)

    def hits(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> list[OffloadKey]:
        """The leading ``keys`` ready in the tier."""
        lookup, hit = self.manager.lookup, LookupResult.HIT
        n = 0
        for key in keys:
            if lookup(key, ctx) is not hit:
                break
            n += 1
        return list(keys[:n])

    def load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        self.manager.prepare_load(keys, ctx)
        self.loads += len(keys)

    def loaded(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        self.manager.complete_load(keys, ctx)

    def store(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> list[OffloadKey]:
        """Offer ``keys`` (computed by the request); those the tier takes
        (a copy to make), none when it has no room."""
        out = self.manager.prepare_store(keys, ctx)
        if out is None:
            return []
        self.stores += len(out.keys_to_store)
        return list(out.keys_to_store)

    def stored(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        self.manager.complete_store(keys, ctx)

    def finished(self, ctx: ReqContext) -> None:
        self.manager.on_request_finished(ctx)

    def control(self, request_id: str, params: Mapping[str, object]) -> None:
        """A control message, as the extension sends it to vLLM's offloading."""
        ctx = self.context(request_id, params)
        self.manager.on_new_request(ctx)
        self.manager.on_request_finished(ctx)
