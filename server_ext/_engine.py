"""Engine-side glue between vLLM's request lifecycle and the retention policy.

No vLLM import: ``AgentHintsConnector`` forwards the scheduler's events here
and supplies a ``BlockPort`` over the real block pool, so this module runs
unchanged against a fake pool in unit tests (``server_ext.testing``). What a
request carries for it is the API server's contract (``server_ext._contract``).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

from hints_spec import ROOT_BRANCH

from ._contract import ControlMessage, HintedParams
from ._holds import BlockPort, HeldBlocks
from ._requests import UNKNOWN_PROGRESS, InFlight, Progress, RequestTable
from .policy import (
    Action,
    AdmissionTrial,
    BranchHints,
    BranchKey,
    EndEvent,
    Outcome,
    PolicyStats,
    RetentionPolicy,
    ToolStartEvent,
    WarmFirstGate,
)

__all__ = ["EngineRetention"]

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _contained(fallback: Any) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Hints are advisory: a fault in retention must never take the engine down.

    The wrapped engine hook logs the fault, counts it, drops every retention (the
    policy may have stopped half-way through an update, so its state is not
    trusted: ``EngineRetention.recover``) and returns ``fallback``; the engine
    goes on serving as plain vLLM would until new hints retain again.
    """

    def wrap(method: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(method)
        def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return method(*args, **kwargs)
            except Exception:
                logger.exception("agent-hints: %s failed; all retentions dropped", method.__name__)
                self = args[0]
                assert isinstance(self, EngineRetention)
                self.faults += 1
                try:
                    self.recover()
                except Exception:  # the pool itself failed: nothing more to undo
                    logger.exception("agent-hints: dropping retentions failed")
                return fallback  # type: ignore[no-any-return]

        return guarded

    return wrap


class EngineRetention:
    """Applies a ``RetentionPolicy`` to a block pool, one engine event at a time.

    Every block reference it takes is given back exactly once (``HeldBlocks``):
    after the policy's matching ``Release``, or at ``recover``. It keeps the
    requests in flight in ``requests`` (``RequestTable``: the connector's own,
    shared, or a table of its own), registered by ``request_added``.

    A prefetch warm-up (``PREFETCH_KEY``) is not its branch's return: it
    neither ends the retention nor teaches the estimator a gap, and when it
    finishes it retains the warmed blocks like the branch's last request did.
    An ``end`` of its branch, or the branch's real return, while it runs
    cancels that retention.
    """

    def __init__(
        self,
        policy: RetentionPolicy,
        pool: BlockPort,
        gate: WarmFirstGate | None = None,
        clock: Callable[[], float] = time.monotonic,
        requests: RequestTable | None = None,
    ) -> None:
        self.policy = policy
        self._pool = pool
        self._gate = gate
        self._clock = clock
        self.requests = requests if requests is not None else RequestTable()
        # Whether running warm-ups sit out the next engine step: vLLM schedules
        # running requests before waiting ones, so a warm-up's next prefill
        # chunk would take the step's token budget ahead of a real request.
        # Set when a real request arrives (it gets the next step), then after
        # each step while a real request scheduled in it has prefill left; not
        # for one that could not be scheduled at all (short of blocks, or held
        # by the gate): pausing then would idle the engine, or wait forever on
        # the blocks a paused warm-up holds.
        self.warmups_yield = False
        self.faults = 0
        self._holds = HeldBlocks(pool)

    @property
    def stats(self) -> PolicyStats:
        return self.policy.stats

    @property
    def deferrals(self) -> int:
        """Times a long cold prefill was passed over for a cheaper request."""
        return self._gate.deferrals if self._gate is not None else 0

    @property
    def trial(self) -> AdmissionTrial | None:
        """Warm-first admission's online trial (None without the gate)."""
        return self._gate.trial if self._gate is not None else None

    @_contained(False)
    def request_added(
        self,
        request_id: str,
        read: HintedParams | None,
        prompt_blocks: int = 0,
        progress: Progress = UNKNOWN_PROGRESS,
    ) -> bool:
        """Register a request (not a control message) of ``prompt_blocks``
        full blocks whose prefill advances in ``progress`` (``read``: its hint,
        ``read_params``), in the record its arrival left on ``requests`` if
        any; False when it carries no usable hint (warm-ups still give way to
        its prefill)."""
        now = self._clock()
        entry = self.requests.get(request_id)
        if entry is None or entry.real or entry.warmup:
            entry = self.requests.add(request_id, progress)
        entry.arrived_at = now
        warmup = read is not None and read.prefetch
        self.requests.counted(entry, warmup)
        if not warmup:
            self.warmups_yield = True
            entry.gated = self._gate is not None and self._gate.trial.assign()
        if read is None:
            return False
        hints = read.hints
        assert hints.sid is not None  # read_hint_params' promise
        key = entry.key = BranchKey(read.tenant, hints.sid, hints.br or ROOT_BRANCH)
        entry.hints = BranchHints(
            gap=hints.gap, ttl=hints.ttl, end=hints.end, prio=hints.prio, pbr=hints.pbr
        )
        if not warmup:
            self.policy.on_request_arrived(key)
            if self._gate is not None:
                held = self.policy.retention(key)
                estimate = prompt_blocks - len(held.block_ids) if held is not None else None
                self._gate.arrived(request_id, now, estimate, entry.gated)
        return True

    @_contained(False)
    def defers(self, request_id: str, uncached_blocks: int) -> bool:
        """Should the scheduler pass over ``request_id`` (which would compute
        ``uncached_blocks``) this step, for a cheaper hinted request?

        A hinted request waits for a due branch only while a real request
        runs: an idle engine gains nothing by waiting, it would only delay the
        request (work-conserving; on a fast engine the hold cost more TTFT
        than the recompute it saved).

        A warm-up never runs beside a real prefill, only on an idle engine or
        beside decodes: it waits while a real request (hinted or not, from any
        API server) waits or prefills, and when it does not fit without the
        blocks of a branch due back before its own. While recent warm-ups were
        mostly wasted (``RetentionPolicy.warmups_take_room``), one starts only
        on an idle engine: a warm-up that likely does not pay should cost real
        requests nothing, not even a slower decode step. (vLLM stops admitting
        for the step at the first request that cannot get blocks, so a warm-up
        left in the queue unable to allocate would hold up every real request
        behind it.)
        """
        entry = self.requests.get(request_id)
        if entry is None or entry.key is None:
            return False
        key = entry.key
        now, uncached_blocks = self._clock(), max(uncached_blocks, 0)
        if entry.warmup:
            return self._warmup_waits(entry, key, uncached_blocks, now)
        if self._gate is None:
            return False

        def return_due(within_s: float) -> bool:
            return self.requests.real_running > 0 and self.policy.return_due(now, within_s, key)

        return self._gate.defer(request_id, uncached_blocks, now, return_due)

    def _warmup_waits(
        self, warmup: InFlight, key: BranchKey, uncached_blocks: int, now: float
    ) -> bool:
        if self.requests.real and (
            not self.policy.warmups_take_room or self.requests.real_prefilling()
        ):
            return True
        short = uncached_blocks - self._pool.free_blocks()
        if short <= 0:
            return False
        if not self._pool.releases_for_room:
            return True  # the blocks it lacks would be taken from retentions, any of them
        due = self._warmup_due(warmup, key, now)
        return due is None or short > self.policy.releasable_for(due, now, key, short + 1)

    def _warmup_due(self, warmup: InFlight, key: BranchKey, now: float) -> float | None:
        """When a warm-up's branch is expected back; None when the warm-up may
        use free blocks but take none from a retention: it is obsolete, its
        branch ended or already came back, or recent warm-ups were mostly
        wasted (``RetentionPolicy.warmups_take_room``)."""
        if warmup.obsolete or not self.policy.warmups_take_room:
            return None
        return self.policy.next_return(key, now)

    @_contained(None)
    def request_scheduled(self, request_id: str) -> None:
        """The request now holds its own block references: its branch returned
        (a warm-up of it still running is obsolete: it is not retained)."""
        if self._gate is not None:
            self._gate.left(request_id)
        entry = self.requests.get(request_id)
        if entry is None or entry.running or not (entry.real or entry.warmup):
            return
        self.requests.started(entry)
        if entry.warmup:
            return
        if entry.key is not None:
            self._obsolete_warmups(entry.key, session=False)
            self._apply(self.policy.on_request_started(entry.key))

    @_contained(None)
    def request_finished(self, request_id: str, block_ids: Sequence[int]) -> None:
        """Before vLLM frees the request's blocks: retain them per the hints."""
        if self._gate is not None:
            self._gate.left(request_id)
        entry = self.requests.pop(request_id)
        if entry is None:
            return
        key, hints = entry.key, entry.hints
        if key is None or hints is None or entry.obsolete:
            return
        if hints.end:
            self._obsolete_warmups(key, session=key.br == ROOT_BRANCH)
        # The engine cannot see tool calls (parsing is API-side); a request that
        # names a session announces that the session continues, so it counts as
        # one that expects a return unless it says ``end``.
        decision = self.policy.on_request_finished(
            key, block_ids, hints, tool_calls=True, departs=not entry.warmup
        )
        self._apply(decision.actions)

    @_contained([])
    def control(self, message: ControlMessage) -> list[Outcome]:
        """Apply a control message (``read_control``)."""
        tenant, sid = message.tenant, message.sid
        outcomes: list[Outcome] = []
        for event in message.events:
            if event is None:
                outcomes.append(Outcome.REJECTED)
                continue
            if isinstance(event, EndEvent):
                ended = BranchKey(tenant, sid, event.br or ROOT_BRANCH)
                self._obsolete_warmups(ended, session=ended.br == ROOT_BRANCH)
            if message.learned and isinstance(event, ToolStartEvent):
                key = BranchKey(tenant, sid, event.br or ROOT_BRANCH)
                decision = self.policy.on_response_tool(key, event.tool)
            else:
                decision = self.policy.on_control(tenant, sid, event)
            self._apply(decision.actions)
            outcomes.append(decision.outcome)
        return outcomes

    @_contained(None)
    def step_scheduled(self, scheduled: Mapping[str, int]) -> None:
        """Once per engine step, when the scheduler has filled it (``scheduled``:
        tokens per request): decide whether warm-ups sit out the next step
        (first: a fault in the policy must not leave them paused; without
        warm-ups in flight, no scan of the step), record the first tokens for
        the gate's trial, and release expired retentions."""
        self.warmups_yield = self.requests.warmups > 0 and any(
            (r := self.requests.get(request_id)) is not None
            and r.real
            and r.progress.num_computed_tokens + tokens < r.progress.num_prompt_tokens
            for request_id, tokens in scheduled.items()
        )
        if self._gate is not None:
            self._record_first_tokens(self._clock(), scheduled)
        self._apply(self.policy.expire())

    def _record_first_tokens(self, now: float, scheduled: Mapping[str, int]) -> None:
        """Real requests whose prefill this step completes: how long each
        waited for its first token, for the admission trial."""
        assert self._gate is not None
        for request_id, tokens in scheduled.items():
            r = self.requests.get(request_id)
            if r is None or not r.real or r.prefilled:
                continue
            if r.progress.num_computed_tokens + tokens >= r.progress.num_prompt_tokens:
                r.prefilled = True
                self._gate.trial.record(r.gated, now - r.arrived_at)

    @_contained(False)
    def make_room(self, blocks_needed: int, request_id: str | None = None) -> bool:
        """Release retentions for an allocation of ``request_id`` (whose own
        branch is spared); False when nothing was left to release.

        A warm-up takes room only from branches due back after its own: a
        prefetch never costs a branch that returns sooner its prefix, and one
        whose branch is not expected (ended, or already back) takes none.
        """
        entry = self.requests.get(request_id) if request_id is not None else None
        if entry is None or entry.key is None:
            actions = self.policy.make_room(max(blocks_needed, 1))
        else:
            now = self._clock()
            due = self._warmup_due(entry, entry.key, now) if entry.warmup else None
            if entry.warmup and due is None:
                return False
            actions = self.policy.make_room(
                max(blocks_needed, 1), now=now, spare=entry.key, sooner_than=due
            )
        self._apply(actions)
        return bool(actions)

    @_contained(None)
    def release_all(self) -> None:
        """Drop every retention (before ``reset_prefix_cache``)."""
        self._apply(self.policy.release_all())

    def _obsolete_warmups(self, key: BranchKey, session: bool) -> None:
        """Mark the warm-ups of ``key`` in flight (of its whole session if
        ``session``) obsolete: they still give way while queued, but retain
        nothing when they finish."""
        for _, entry in self.requests.warmups_in_flight():
            k = entry.key
            if k is not None and (k == key or (session and k.sibling(ROOT_BRANCH) == key)):
                entry.obsolete = True

    def recover(self) -> None:
        """Drop every retention after a fault: the policy forgets them all, and
        the pool gets back each reference this object took (``HeldBlocks``).
        Learned gaps and counters survive."""
        try:
            self.policy.forget_all()
        finally:
            self._holds.release_everything()

    def _apply(self, actions: list[Action]) -> None:
        self._holds.apply(actions)
