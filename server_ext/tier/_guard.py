"""Containment for a remote tier: every call bounded in time, failures are misses."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from ._protocol import KVTier, TierStats

__all__ = ["GuardedTier"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class GuardedTier:
    """Runs a tier's calls on one helper thread with a timeout and a breaker.

    A call that raises or outlives ``timeout_s`` returns the miss value and
    opens the breaker for ``cooldown_s``: meanwhile every call is a miss at
    once, so a dead store (Mooncake's RPCs block ~4 s each) costs the engine
    one timeout per cooldown, never a failed request. The tier itself is built
    lazily on the helper thread, so a master that is down at startup only
    delays the first successful connection. The helper is a daemon thread: a
    call stuck in the store never holds up the engine's exit.
    """

    def __init__(
        self,
        factory: Callable[[], KVTier],
        *,
        timeout_s: float = 1.0,
        cooldown_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._factory = factory
        self._timeout_s = timeout_s
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="agent-hints-tier", daemon=True).start()
        self._inner: KVTier | None = None
        self._busy: Future[Any] | None = None
        self._open_until = 0.0
        self._deadline: float | None = None
        self._stats = TierStats()

    @property
    def available(self) -> bool:
        """False while the breaker is open (the store failed recently)."""
        return self._clock() >= self._open_until

    @contextmanager
    def deadline(self, at: float) -> Iterator[None]:
        """Calls inside wait for the store until ``at`` (this clock) at most:
        a slow but alive store costs the caller its time budget, not a
        timeout per call. A call cut short is a miss and leaves the breaker
        closed; the helper finishes it, and calls meanwhile are misses."""
        before, self._deadline = self._deadline, at
        try:
            yield
        finally:
            self._deadline = before

    def _call(self, fn: Callable[[KVTier], _T], miss: _T) -> _T:
        if not self.available or (self._busy is not None and not self._busy.done()):
            self._stats.errors += 1
            return miss
        wait = self._timeout_s
        if self._deadline is not None:
            wait = min(wait, self._deadline - self._clock())
            if wait <= 0:
                self._stats.errors += 1
                return miss
        future = self._submit(fn)
        try:
            return future.result(timeout=wait)
        except TimeoutError:
            self._stats.errors += 1
            if wait < self._timeout_s:  # out of budget, not out of patience
                return miss
            self._open(TimeoutError(f"no answer in {wait:g} s"))
            return miss
        except Exception as e:
            self._stats.errors += 1
            self._open(e)
            return miss

    def _open(self, error: BaseException) -> None:
        self._open_until = self._clock() + self._cooldown_s
        logger.warning("agent-hints tier unavailable for %.0f s: %r", self._cooldown_s, error)

    def connect(self) -> None:
        """Build the tier now, in the background: until it is up, calls are
        misses at once (the helper is busy), never a wait on the connection."""
        if self._inner is None and self._busy is None:
            self._submit(lambda t: None)

    def _submit(self, fn: Callable[[KVTier], _T]) -> Future[_T]:
        future: Future[_T] = Future()
        self._jobs.put((lambda: self._run(fn), future))
        self._busy = future
        return future

    def _serve(self) -> None:
        while True:
            job, future = self._jobs.get()
            try:
                future.set_result(job())
            except BaseException as e:
                future.set_exception(e)

    def _run(self, fn: Callable[[KVTier], _T]) -> _T:
        if self._inner is None:
            self._inner = self._factory()
        return fn(self._inner)

    def contains(self, keys: Sequence[str]) -> int:
        return self._call(lambda t: t.contains(keys), 0)

    def put(self, key: str, value: torch.Tensor, pin_s: float = 0.0) -> bool:
        return self._call(lambda t: t.put(key, value, pin_s), False)

    def get(self, key: str) -> torch.Tensor | None:
        return self._call(lambda t: t.get(key), None)

    def drop(self, keys: Sequence[str]) -> None:
        self._call(lambda t: t.drop(keys), None)

    def close(self) -> None:
        """Close the store, unless a call is stuck in it (then the OS will)."""
        if self._inner is not None:
            self._open_until = 0.0
            self._call(lambda t: t.close(), None)

    @property
    def bytes_used(self) -> int:
        return self._inner.bytes_used if self._inner is not None else 0

    @property
    def stats(self) -> TierStats:
        inner = self._inner.stats if self._inner is not None else TierStats()
        return TierStats(
            hits=inner.hits,
            misses=inner.misses,
            puts=inner.puts,
            evictions=inner.evictions,
            corrupt=inner.corrupt,
            errors=inner.errors + self._stats.errors,
        )
