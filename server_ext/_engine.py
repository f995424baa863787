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
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar

from hints_spec import ROOT_BRANCH

from ._contract import ControlMessage, HintedParams
from .policy import (
    Action,
    AdmissionTrial,
    BranchHints,
    BranchKey,
    EndEvent,
    Hold,
    Outcome,
    PolicyStats,
    Release,
    ReleaseReason,
    RetentionPolicy,
    ToolStartEvent,
    WarmFirstGate,
)

__all__ = ["BlockPort", "EngineRetention", "Progress"]

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


class BlockPort(Protocol):
    """The block-pool operations retention needs.

    ``hold`` protects each block (a held block is not evicted while the hold
    lasts, unless the pool asks the retention for room); ``release`` ends
    one protection, tail first, so the prefix stays cached longest; with
    ``evict_first`` (an ended branch) its blocks are the first a later
    allocation evicts, else they keep their place in LRU order;
    ``free_blocks`` counts blocks an allocation may take without touching a
    held or running one (cached but unreferenced blocks included).
    ``releases_for_room``: an allocation short of free blocks asks the
    retention to release some (``EngineRetention.make_room``, in its victim
    order); else it takes protected blocks in the pool's own order.
    """

    releases_for_room: bool

    def hold(self, block_ids: Sequence[int]) -> None: ...

    def release(self, block_ids: Sequence[int], evict_first: bool = False) -> None: ...

    def free_blocks(self) -> int: ...


class Progress(Protocol):
    """How far a request's prefill has come (vLLM's ``Request`` is one)."""

    @property
    def num_computed_tokens(self) -> int: ...

    @property
    def num_prompt_tokens(self) -> int: ...


class _Unknown:
    """The progress of a request registered without one: its prefill never
    counts as done, so warm-ups wait until it finishes."""

    num_computed_tokens = 0
    num_prompt_tokens = 1


_UNKNOWN = _Unknown()


@dataclass(slots=True)
class _InFlight:
    """One request from arrival to finish (control messages are not tracked).

    ``key`` and ``hints`` are set for a request with a usable hint;
    ``warmup`` marks the prefetcher's own (not real work, not the branch's
    return); ``obsolete``, a warm-up whose branch ended or came back (it
    retains nothing); ``running``, admitted by the scheduler. A real request
    arrived at ``arrived_at`` on the ``gated`` or open side of the admission
    trial (``AdmissionTrial``) until its prefill is done (``prefilled``).
    """

    progress: Progress
    arrived_at: float = 0.0
    gated: bool = False
    prefilled: bool = False
    key: BranchKey | None = None
    hints: BranchHints | None = None
    warmup: bool = False
    obsolete: bool = False
    running: bool = False

    @property
    def prefilling(self) -> bool:
        return self.progress.num_computed_tokens < self.progress.num_prompt_tokens


class EngineRetention:
    """Applies a ``RetentionPolicy`` to a block pool, one engine event at a time.

    Invariant: every block reference this object takes with ``pool.hold`` is
    given back with ``pool.release`` exactly once: after the policy's matching
    ``Release``, or at ``recover``. The policy guarantees the pairing, and this
    object checks it against its own count of references: a batch of actions
    that would release one it does not hold is a policy fault, refused before
    the pool is touched. Within one batch all holds are applied before any
    release, so a block shared by a replaced retention and its replacement never
    drops to refcount 0 in between.

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
    ) -> None:
        self.policy = policy
        self._pool = pool
        self._gate = gate
        self._clock = clock
        # Every request from arrival to finish, and how many of them are real
        # (not warm-ups) and, of those, running; and how many are warm-ups.
        self._requests: dict[str, _InFlight] = {}
        self._real = 0
        self._real_running = 0
        self._warmups = 0
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
        # Block references taken with ``pool.hold`` and not yet released.
        self._held: Counter[int] = Counter()

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
        progress: Progress = _UNKNOWN,
    ) -> bool:
        """Register a request (not a control message) of ``prompt_blocks``
        full blocks whose prefill advances in ``progress`` (``read``: its hint,
        ``read_params``); False when it carries no usable hint (warm-ups still
        give way to its prefill)."""
        now = self._clock()
        entry = self._requests[request_id] = _InFlight(progress, arrived_at=now)
        if read is None or not read.prefetch:
            self._real += 1
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
        if read.prefetch:
            entry.warmup = True
            self._warmups += 1
        else:
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
        entry = self._requests.get(request_id)
        if entry is None or entry.key is None:
            return False
        key = entry.key
        now, uncached_blocks = self._clock(), max(uncached_blocks, 0)
        if entry.warmup:
            return self._warmup_waits(entry, key, uncached_blocks, now)
        if self._gate is None:
            return False

        def return_due(within_s: float) -> bool:
            return self._real_running > 0 and self.policy.return_due(now, within_s, key)

        return self._gate.defer(request_id, uncached_blocks, now, return_due)

    def _warmup_waits(
        self, warmup: _InFlight, key: BranchKey, uncached_blocks: int, now: float
    ) -> bool:
        if self._real and (
            not self.policy.warmups_take_room
            or any(r.prefilling for r in self._requests.values() if not r.warmup)
        ):
            return True
        short = uncached_blocks - self._pool.free_blocks()
        if short <= 0:
            return False
        if not self._pool.releases_for_room:
            return True  # the blocks it lacks would be taken from retentions, any of them
        due = self._warmup_due(warmup, key, now)
        return due is None or short > self.policy.releasable_for(due, now, key, short + 1)

    def _warmup_due(self, warmup: _InFlight, key: BranchKey, now: float) -> float | None:
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
        entry = self._requests.get(request_id)
        if entry is None or entry.running:
            return
        entry.running = True
        if entry.warmup:
            return
        self._real_running += 1
        if entry.key is not None:
            self._obsolete_warmups(entry.key, session=False)
            self._apply(self.policy.on_request_started(entry.key))

    @_contained(None)
    def request_finished(self, request_id: str, block_ids: Sequence[int]) -> None:
        """Before vLLM frees the request's blocks: retain them per the hints."""
        if self._gate is not None:
            self._gate.left(request_id)
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return
        if entry.warmup:
            self._warmups -= 1
        else:
            self._real -= 1
            self._real_running -= entry.running
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
        self.warmups_yield = self._warmups > 0 and any(
            (r := self._requests.get(request_id)) is not None
            and not r.warmup
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
            r = self._requests.get(request_id)
            if r is None or r.warmup or r.prefilled:
                continue
            if r.progress.num_computed_tokens + tokens >= r.progress.num_prompt_tokens:
                r.prefilled = True
                self._gate.trial.record(r.gated, now - r.arrived_at)

    def is_warmup(self, request_id: str) -> bool:
        """Whether ``request_id`` is a prefetch warm-up this engine tracks."""
        entry = self._requests.get(request_id)
        return entry is not None and entry.warmup

    def is_hinted(self, request_id: str) -> bool:
        """Whether ``request_id`` carries a usable hint (a branch of a session)."""
        entry = self._requests.get(request_id)
        return entry is not None and entry.key is not None

    @_contained(False)
    def make_room(self, blocks_needed: int, request_id: str | None = None) -> bool:
        """Release retentions for an allocation of ``request_id`` (whose own
        branch is spared); False when nothing was left to release.

        A warm-up takes room only from branches due back after its own: a
        prefetch never costs a branch that returns sooner its prefix, and one
        whose branch is not expected (ended, or already back) takes none.
        """
        entry = self._requests.get(request_id) if request_id is not None else None
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
        if not self._warmups:
            return
        for entry in self._requests.values():
            k = entry.key
            if (
                entry.warmup
                and k is not None
                and (k == key or (session and k.sibling(ROOT_BRANCH) == key))
            ):
                entry.obsolete = True

    def recover(self) -> None:
        """Drop every retention after a fault: the policy forgets them all, and
        the pool gets back each reference this object took (from its own count,
        not from the policy's state, which the fault may have left half-updated).
        Learned gaps and counters survive."""
        held, self._held = self._held, Counter()
        try:
            self.policy.forget_all()
        finally:
            if held:
                self._pool.release(list(held.elements()))

    def _apply(self, actions: list[Action]) -> None:
        holds = [a.block_ids for a in actions if isinstance(a, Hold)]
        releases = [a for a in actions if isinstance(a, Release)]
        if releases:
            released = Counter(b for a in releases for b in a.block_ids)
            taken = Counter(b for ids in holds for b in ids)
            if any(self._held[b] + taken[b] < n for b, n in released.items()):
                raise RuntimeError("the policy released a block reference it never held")
        for block_ids in holds:
            self._pool.hold(block_ids)
            self._held.update(block_ids)
        for release in releases:
            block_ids = release.block_ids
            # An ended branch's blocks go first (those no later request reused:
            # the port knows); any other's keep their place.
            self._pool.release(block_ids, evict_first=release.reason is ReleaseReason.END)
            for b in block_ids:
                if self._held[b] == 1:
                    del self._held[b]
                else:
                    self._held[b] -= 1
