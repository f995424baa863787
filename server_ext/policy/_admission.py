"""Warm-first admission: a mostly cached request goes before a long cold prefill."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from ._heap import IndexedHeap


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Bounds of ``WarmFirstGate``.

    Args:
        max_defer_s: Longest a request is held back after it arrived (0: never).
        min_gain_blocks: Defer only for a request at least this many uncached
            blocks cheaper (smaller gains are not worth reordering for).
        lookahead_s: A retained branch expected back (before or after now)
            within the time the held request's prefill would take, as the
            engine's steps measure it, and at most this many seconds, counts
            as due; 0: due branches never hold a request back (e.g. when a KV
            tier makes their return cheap anyway).
        block_size: Tokens per KV block (to time a prefill of so many blocks;
            the default is vLLM's).
        step_tokens: The engine's token budget per step (vLLM's
            ``max_num_batched_tokens``): a prefill that fits in one step is
            never held back, since the step takes it beside the cheaper
            requests anyway and holding it would only leave the budget unused
            (None: not known, any prefill may be held).
    """

    max_defer_s: float = 10.0
    min_gain_blocks: int = 4
    lookahead_s: float = 2.5
    block_size: int = 16
    step_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_defer_s < 0 or self.min_gain_blocks < 1 or self.lookahead_s < 0:
            raise ValueError("max_defer_s and lookahead_s must be >= 0 and min_gain_blocks >= 1")
        if self.block_size < 1 or (self.step_tokens is not None and self.step_tokens < 1):
            raise ValueError("block_size and step_tokens must be >= 1")


_MIN_TIMED_TOKENS = 256
"""Steps with fewer tokens are mostly fixed per-step overhead (decodes): not timed."""


@dataclass(slots=True)
class StepTimer:
    """Seconds the engine takes per scheduled token, learned from its steps.

    A step is timed by the interval to the next ``step`` call (the scheduler
    fills a step right after the previous one ran), and only when it carried
    at least ``_MIN_TIMED_TOKENS`` and one of its requests is scheduled again
    in the next: otherwise the engine may have idled in between.

    ``busy_s`` adds up every interval between two steps that share a request,
    whatever their size: the time the engine spent running steps.

    Invariants: ``seconds_per_token`` is None until a step was timed, then an
    exponential average (weight ``smoothing`` per step) of the timed steps;
    ``_last`` is the previous step if it carried at least ``_MIN_TIMED_TOKENS``,
    else None; ``_previous`` is the previous step's start and requests (a
    record of the step, not of any request).
    """

    smoothing: float = 0.2
    seconds_per_token: float | None = None
    busy_s: float = 0.0
    _last: tuple[float, int, frozenset[str]] | None = field(default=None, init=False, repr=False)
    _previous: tuple[float, Mapping[str, int]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.smoothing <= 1:
            raise ValueError("smoothing must be in (0, 1]")

    def step(self, now: float, scheduled: Mapping[str, int]) -> None:
        """A step was filled at ``now`` with ``scheduled`` (tokens per request)."""
        if self._previous is not None:
            started, requests = self._previous
            if now > started and not requests.keys().isdisjoint(scheduled):
                self.busy_s += now - started
        # The scheduler's mapping is new every step: kept, not copied.
        self._previous = (now, scheduled) if scheduled else None
        if self._last is not None:
            started, tokens, ids = self._last
            if now > started and not ids.isdisjoint(scheduled):
                sample = (now - started) / tokens
                last = self.seconds_per_token
                a = self.smoothing
                self.seconds_per_token = sample if last is None else (1 - a) * last + a * sample
        tokens = sum(scheduled.values())
        # Only a step that will be timed keeps its requests (no copy per decode step).
        self._last = (now, tokens, frozenset(scheduled)) if tokens >= _MIN_TIMED_TOKENS else None

    def seconds(self, tokens: int) -> float | None:
        """How long ``tokens`` of prefill take; None until a step was timed."""
        spt = self.seconds_per_token
        return None if spt is None else spt * tokens


class _Waiting(NamedTuple):
    arrived_at: float
    gated: bool


@dataclass(slots=True)
class _DecayingMean:
    """Mean of recent samples (weight ``1 / memory`` each once ``n`` is large)."""

    memory: float
    value: float = 0.0
    n: int = 0

    def add(self, sample: float) -> None:
        self.n += 1
        self.value += (sample - self.value) / min(self.n, self.memory)


class AdmissionTrial:
    """Does warm-first admission pay on this engine, now? An online trial.

    Holding a cold prefill back helps when the engine is loaded and the
    cheaper requests or the branch due back really come first, and costs
    when they do not (a slower machine, a busy neighbour, hints that miss).
    So arrivals are grouped in epochs of ``epoch`` requests, each *gated* (the
    gate may hold its hinted requests back) or *open* (first come, first
    served, as plain vLLM), drawn at random: even odds until each side has
    ``min_samples`` requests, then ``confident`` odds for the side whose
    requests waited less, on average, from arrival to their first token (a
    decaying mean over ``memory`` requests), the other side still drawn now
    and then so the verdict follows the workload. Every request counts,
    hinted or not: the gate must pay for all of them. Epochs alternate in
    time, so a change of the machine's speed weighs on both sides alike.

    ``fixed_share`` replaces the learned odds (1.0: always gated, as for
    clients whose hints are known to pay; tests).

    Invariants: ``gated_share`` is ``fixed_share`` if set, else 0.5 until
    both sides have ``min_samples``, else ``confident`` or ``1 - confident``.
    """

    def __init__(
        self,
        epoch: int = 16,
        min_samples: int = 32,
        confident: float = 0.875,
        memory: float = 128.0,
        seed: int = 0,
        fixed_share: float | None = None,
    ) -> None:
        if epoch < 1 or min_samples < 1 or not 0.5 <= confident < 1 or memory < 1:
            raise ValueError("epoch, min_samples >= 1; confident in [0.5, 1); memory >= 1")
        if fixed_share is not None and not 0 <= fixed_share <= 1:
            raise ValueError("fixed_share must be in [0, 1]")
        self.fixed_share = fixed_share
        self.epoch = epoch
        self.min_samples = min_samples
        self.confident = confident
        self._rng = random.Random(seed)
        self._waits = {True: _DecayingMean(memory), False: _DecayingMean(memory)}
        self._gated = True
        self._left = 0

    @property
    def gated_share(self) -> float:
        """The odds that an epoch is gated, as the evidence stands."""
        if self.fixed_share is not None:
            return self.fixed_share
        gated, open_ = self._waits[True], self._waits[False]
        if min(gated.n, open_.n) < self.min_samples:
            return 0.5
        return self.confident if gated.value <= open_.value else 1.0 - self.confident

    def mean_wait_s(self, gated: bool) -> float | None:
        """Recent mean wait, arrival to first token, of one side (None: no sample)."""
        side = self._waits[gated]
        return side.value if side.n else None

    def assign(self) -> bool:
        """Whether a request arriving now is gated (its epoch's side)."""
        if self._left == 0:
            self._gated = self._rng.random() < self.gated_share
            self._left = self.epoch
        self._left -= 1
        return self._gated

    def record(self, gated: bool, wait_s: float) -> None:
        """A request of that side waited ``wait_s`` for its first token."""
        self._waits[gated].add(max(wait_s, 0.0))


class WarmFirstGate:
    """Shortest prefill first among hinted requests waiting for the engine, bounded.

    vLLM admits waiting requests first come, first served. Under load that
    interleaves every session, and each long cold prefill evicts the prefixes
    of the sessions queued behind it, whose requests then turn cold too. The
    gate lets the scheduler pass over (one step at a time) a hinted request
    whose uncached prefill is long while another waiting hinted request needs
    at most half as many blocks, or while a retained branch is due back (its
    request will be nearly free): short jobs first lowers the mean wait, and a
    warm prefix is used before anything can evict it. Under overload this is
    load control against thrashing: the sessions whose KV is resident keep
    cycling while a cold one waits, at most ``max_defer_s``. (It waits even
    when it would fit beside the due branch: a long prefill occupies the
    engine for seconds, so the due request would wait behind it and more
    branches fall due meanwhile. Deferring only on a capacity shortfall
    measured 60% reuse instead of 74% on the trace benchmark.) A branch counts
    as due only if it is expected back before the held prefill would be done
    (``StepTimer``, at most ``lookahead_s``): one due later loses nothing to the
    prefill, and on an engine whose prefills are fast, holding for it cost more
    mean TTFT than the recompute it saved. The engine asks ``warm_return_due``
    only while a real request runs: on an idle engine a hold saves nothing and
    only delays.

    Pure and synchronous, driven by the adapter's scheduler events and an
    explicit ``now``; ``timer`` is the engine's, stepped by its owner (the
    connector times each step once, for every mechanism). Its waiting set is
    an index over the engine's requests (the hinted ones still waiting, and a
    heap of their sizes for the cheapest other), kept here rather than in the
    engine's record of each request: the gate is pure policy, with no view of
    the engine's records, and the heap must be its own.
    Invariants:
      - ``_waiting`` holds exactly the hinted requests that arrived and have
        been neither scheduled nor finished, with their arrival time and the
        best known count of uncached blocks (None until known).
      - A request is never deferred at or after ``arrival + max_defer_s``, so
        the gate only reorders; it cannot starve. Unhinted requests never
        enter the gate and are never deferred.
    """

    def __init__(
        self,
        config: AdmissionConfig | None = None,
        trial: AdmissionTrial | None = None,
        timer: StepTimer | None = None,
    ) -> None:
        self.config = config or AdmissionConfig()
        self.timer = timer if timer is not None else StepTimer()
        self.trial = trial or AdmissionTrial()
        self._waiting: dict[str, _Waiting] = {}
        self._sizes = IndexedHeap[str]()  # uncached blocks of those known
        self.deferrals = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def arrived(
        self,
        request_id: str,
        now: float,
        uncached_blocks: int | None = None,
        gated: bool = True,
    ) -> None:
        """A hinted request reached the engine; ``uncached_blocks`` is an
        estimate (e.g. its prompt past its branch's retained blocks). One not
        ``gated`` (``AdmissionTrial``) is never held back, but may go before
        others."""
        self._waiting[request_id] = _Waiting(now, gated)
        if uncached_blocks is not None:
            self._sizes.set(request_id, uncached_blocks)

    def lookahead(self, uncached_blocks: int) -> float:
        """How far from now a retained branch's return holds back a prefill
        of ``uncached_blocks``: its duration, at most ``lookahead_s`` (all of
        it until a step was timed)."""
        cap = self.config.lookahead_s
        seconds = self.timer.seconds(uncached_blocks * self.config.block_size)
        return cap if seconds is None else min(cap, seconds)

    def defer(
        self,
        request_id: str,
        uncached_blocks: int,
        now: float,
        warm_return_due: Callable[[float], bool] = lambda within_s: False,
    ) -> bool:
        """The scheduler considers ``request_id``, which would compute
        ``uncached_blocks``: should it wait this step for a cheaper request?

        ``warm_return_due(within_s)`` says whether a retained branch is due
        back within ``within_s`` of now (``lookahead``): its request will be
        nearly free, so it counts as a waiting one that needs no blocks
        (admitting a cold prefill first would evict it, or make it queue).
        It is asked only when the answer matters.
        """
        entry = self._waiting.get(request_id)
        if entry is None:
            return False
        self._sizes.set(request_id, uncached_blocks)
        if not entry.gated or now - entry.arrived_at >= self.config.max_defer_s:
            return False
        if uncached_blocks < self.config.min_gain_blocks:
            return False  # nothing cheaper could gain enough
        steps = self.config.step_tokens
        if steps is not None and uncached_blocks * self.config.block_size <= steps:
            return False  # one step takes it beside the others: waiting gains nothing
        cheapest = self._sizes.smallest_other(request_id)
        cheaper = (
            cheapest is not None
            and uncached_blocks - cheapest >= self.config.min_gain_blocks
            and 2 * cheapest <= uncached_blocks
        )
        if not cheaper:
            within_s = self.lookahead(uncached_blocks)
            if within_s <= 0 or not warm_return_due(within_s):
                return False
        self.deferrals += 1
        return True

    def left(self, request_id: str) -> None:
        """The request was scheduled or finished: no longer waiting."""
        self._waiting.pop(request_id, None)
        self._sizes.remove(request_id)
