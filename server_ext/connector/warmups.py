"""Prefetch warm-ups on vLLM's scheduler: paced against real requests, and
preempted before them.

A running warm-up sits out the steps retention says it must
(``EngineRetention.warmups_yield``: a real request's prefill goes first) by
having its ``next_decode_eligible_step`` pushed out of reach (``PAUSED``);
``WarmupsGoFirst`` has vLLM preempt a warm-up, never a real request, when a
running request's allocation fails. Both read the scheduler side's one record
per request (``RequestTable``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from .._requests import RequestTable
from .._vllm import RequestStatus, SchedulingPolicy

if TYPE_CHECKING:
    from vllm.v1.request import Request

__all__ = ["PAUSED", "WarmupsGoFirst", "pace_warmups", "yielded_warmups"]

PAUSED = 1 << 62
"""Added to a warm-up's ``next_decode_eligible_step`` while it yields."""


class WarmupsGoFirst:
    """Makes vLLM preempt a warm-up, never a real request, to free blocks.

    When a running request's allocation fails, vLLM's FCFS scheduler preempts
    the last entry of ``running``: often a real request admitted after a
    warm-up that keeps its blocks. ``short`` runs on such a failure, before
    vLLM picks: a warm-up that may be preempted this step (the failing one
    itself; one behind a failing real request, not yet scheduled; or one
    ahead of it that sits the step out) is swapped into the last place, which
    vLLM takes. Otherwise, while a warm-up ahead of the real request runs this
    step (its blocks come free when its prefill ends), ``passing`` has vLLM
    pass over the request for the step (``has_pending_block_frees``) instead
    of preempting. A swap only moves entries vLLM visits later or not at all
    this step, never one it scheduled. With the priority policy (vLLM picks by
    priority) only ``passing`` applies.
    """

    def __init__(self, scheduler: Any, requests: RequestTable) -> None:
        self._scheduler = scheduler
        self._requests = requests
        self._fcfs = getattr(scheduler, "policy", None) == SchedulingPolicy.FCFS
        self.passing = False

    def _is_warmup(self, request_id: str) -> bool:
        record = self._requests.get(request_id)
        return record is not None and record.warmup

    def short(self, request: Request) -> None:
        """``request``'s allocation failed; vLLM preempts next."""
        self.passing = False
        if not self._requests.warmups:
            return
        running: list[Request] = self._scheduler.running
        try:
            at = running.index(request)
        except ValueError:  # a waiting request: vLLM preempts nothing for it
            return
        if self._is_warmup(request.request_id):
            if self._fcfs:  # vLLM preempts the warm-up itself, and stops there
                running[at], running[-1] = running[-1], running[at]
            return
        ahead_running = False
        for i in range(len(running) - 1, -1, -1):
            r = running[i]
            if not self._is_warmup(r.request_id):
                continue
            paused = r.next_decode_eligible_step >= PAUSED
            if self._fcfs and (i > at or paused):
                running[i], running[-1] = running[-1], running[i]
                return
            ahead_running = ahead_running or (i < at and not paused)
        self.passing = ahead_running


def _warmups(requests: RequestTable) -> list[tuple[str, Request]]:
    """The warm-ups in flight, as vLLM's requests (their records' progress)."""
    return [(rid, cast("Request", r.progress)) for rid, r in requests.warmups_in_flight()]


def pace_warmups(requests: RequestTable, paused: bool) -> None:
    """Make running warm-ups sit out the next step (``paused``), or run again."""
    for _, request in _warmups(requests):
        step = request.next_decode_eligible_step
        if paused and step < PAUSED:
            request.next_decode_eligible_step = step + PAUSED
        elif not paused and step >= PAUSED:
            request.next_decode_eligible_step = step - PAUSED


def yielded_warmups(requests: RequestTable, scheduled: Mapping[str, int]) -> int:
    """Running warm-ups that sat out this step (``scheduled``: its tokens per request)."""
    return sum(
        request.next_decode_eligible_step >= PAUSED
        and request.status == RequestStatus.RUNNING
        and request_id not in scheduled
        for request_id, request in _warmups(requests)
    )
