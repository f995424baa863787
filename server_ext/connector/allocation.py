"""The connector's hold on vLLM's allocations: ``KVCacheManager.allocate_slots``
and ``reset_prefix_cache``, wrapped on the bound instance.

An allocation first raises vLLM's admission watermark by the headroom the
running requests need (``server_ext._headroom``); one short of blocks gets
retained blocks given back (``EngineRetention.make_room``) before the
scheduler preempts; and when it still fails, vLLM preempts a warm-up rather
than a real request (``warmups.WarmupsGoFirst``).

vLLM hands a connector no reference to its scheduler (0.32 and 0.33 alike),
whose ``running`` list is what it preempts from: ``binding_scheduler`` finds
the scheduler that binds the KV cache manager on the call stack.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._engine import EngineRetention
from .._headroom import Headroom
from .._pool import allocate_after_room
from .._vllm import RequestStatus
from .warmups import WarmupsGoFirst

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.request import Request

__all__ = ["binding_scheduler", "wrap_allocations"]

logger = logging.getLogger(__name__)

_ADMITTING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
"""A request in these states is being admitted (vLLM's watermark states)."""

_SCHEDULER_FRAMES = 8
"""How far up the stack ``binding_scheduler`` looks (the scheduler, a
``MultiConnector`` or two, this connector)."""


def binding_scheduler(manager: KVCacheManager) -> Any | None:
    """The scheduler whose ``bind_kv_cache_manager`` call binds ``manager``,
    found on the call stack (vLLM gives connectors no reference to it; its
    ``running`` list is what vLLM preempts from), or None. The caller may be
    the scheduler itself or, with ``MultiConnector``, one or more composing
    connectors in between."""
    frame = sys._getframe(1)
    for _ in range(_SCHEDULER_FRAMES):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if (
            isinstance(getattr(owner, "running", None), list)
            and getattr(owner, "kv_cache_manager", None) is manager
        ):
            return owner
    logger.warning("agent-hints: no scheduler bound the KV cache; warm-ups may be preempted last")
    return None


def wrap_allocations(
    manager: KVCacheManager,
    block_size: int,
    retention: EngineRetention,
    releases_for_room: bool,
    release_all: Callable[[], None],
    scheduler: Any | None,
    headroom: Headroom | None,
    guard: WarmupsGoFirst | None,
) -> None:
    """Wrap, on the instance, ``manager``'s (``block_size``-token blocks)
    ``reset_prefix_cache`` (``release_all`` first) and ``allocate_slots``
    (headroom, room from retention when ``releases_for_room``, warm-ups
    preempted first)."""
    reset: Callable[[], bool] = manager.reset_prefix_cache

    def reset_prefix_cache() -> bool:
        release_all()
        return reset()

    manager.reset_prefix_cache = reset_prefix_cache  # type: ignore[method-assign]
    allocate: Callable[..., Any] = manager.allocate_slots

    def allocate_slots(request: Request, num_new_tokens: int, *args: Any, **kw: Any) -> Any:
        # Blocks loaded from the tier (vLLM's 4th optional argument, passed by name).
        loaded = kw.get("num_external_computed_tokens", args[3] if len(args) > 3 else 0)
        reserve = 0
        admitting = headroom is not None and request.status in _ADMITTING
        running: list[Request] = scheduler.running if scheduler is not None else []
        # vLLM's own rule for its watermark: admissions, not while nothing runs.
        if admitting and running:
            assert headroom is not None
            reserve = headroom.reserve(running, loads=loaded > 0)

        def attempt() -> Any:
            if not reserve:
                return allocate(request, num_new_tokens, *args, **kw)
            # vLLM adds its watermark to an admission's blocks in both of
            # its checks: the first chunk's and the whole prompt's.
            base = manager.watermark_blocks
            manager.watermark_blocks = base + reserve
            try:
                return allocate(request, num_new_tokens, *args, **kw)
            finally:
                manager.watermark_blocks = base

        blocks = attempt()
        if blocks is None and releases_for_room:
            # Soft retention: before the scheduler preempts or defers anything,
            # give back held blocks, furthest expected return first.
            needed = -(-num_new_tokens // block_size)
            blocks = allocate_after_room(
                attempt, lambda: retention.make_room(needed, request.request_id)
            )
        if blocks is not None and admitting:
            assert headroom is not None
            headroom.admitted(request)
        if blocks is None and guard is not None:
            guard.short(request)
        # A running request short of blocks: vLLM preempts next, unless a
        # warm-up's coming frees let it pass over the request.
        if (
            blocks is None
            and headroom is not None
            and request.status == RequestStatus.RUNNING
            and (guard is None or not guard.passing)
        ):
            headroom.short()
        return blocks

    manager.allocate_slots = allocate_slots  # type: ignore[method-assign]
