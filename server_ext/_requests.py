"""One record per request in the scheduler role, from arrival to finish.

No vLLM import. The connector's scheduler side reads a request's params once
(``read_params``) and keeps them here; retention (``_engine.EngineRetention``)
fills in what it learns (its branch, whether it is a warm-up, its admission
trial) and warm-up pacing, the tier side and headroom read the same record.
The simulator and the unit tests drive ``EngineRetention`` alone, which then
keeps a table of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from ._contract import RequestParams
from .policy import BranchHints, BranchKey

__all__ = ["UNKNOWN_PROGRESS", "InFlight", "Progress", "RequestTable"]


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


UNKNOWN_PROGRESS: Progress = _Unknown()


@dataclass(slots=True)
class InFlight:
    """One request from arrival to finish.

    ``progress`` is the request itself where vLLM's is at hand; ``params``,
    its ``kv_transfer_params`` read once (None where retention registered it
    alone). ``key`` and ``hints`` are set for a request with a usable hint;
    ``warmup`` marks the prefetcher's own (not real work, not the branch's
    return) and ``real`` any other that retention registered (control messages
    are neither); ``obsolete``, a warm-up whose branch ended or came back (it
    retains nothing); ``running``, admitted by the scheduler. A real request
    arrived at ``arrived_at`` on the ``gated`` or open side of the admission
    trial (``AdmissionTrial``) until its prefill is done (``prefilled``).
    ``tiered``: the tier plans for it (``TierPlanner.track``).
    """

    progress: Progress
    params: RequestParams | None = None
    arrived_at: float = 0.0
    gated: bool = False
    prefilled: bool = False
    key: BranchKey | None = None
    hints: BranchHints | None = None
    real: bool = False
    warmup: bool = False
    obsolete: bool = False
    running: bool = False
    tiered: bool = False

    @property
    def prefilling(self) -> bool:
        return self.progress.num_computed_tokens < self.progress.num_prompt_tokens


class RequestTable:
    """The records of the requests in flight, by request id, and how many of
    them are real (and of those, running) and warm-ups.

    Invariant: ``real``, ``real_running`` and ``warmups`` count the records
    in the table marked so (``counted``, ``started``).
    """

    def __init__(self) -> None:
        self._records: dict[str, InFlight] = {}
        self.real = 0
        self.real_running = 0
        self.warmups = 0

    def get(self, request_id: str) -> InFlight | None:
        return self._records.get(request_id)

    def items(self) -> Iterator[tuple[str, InFlight]]:
        return iter(self._records.items())

    def add(
        self,
        request_id: str,
        progress: Progress = UNKNOWN_PROGRESS,
        params: RequestParams | None = None,
    ) -> InFlight:
        """The record of a request that arrived (a new one in place of any
        left under its id)."""
        self.pop(request_id)
        record = self._records[request_id] = InFlight(progress, params)
        return record

    def counted(self, record: InFlight, warmup: bool) -> None:
        """``record`` (in the table) is a warm-up, or else a real request."""
        if warmup:
            record.warmup = True
            self.warmups += 1
        else:
            record.real = True
            self.real += 1

    def started(self, record: InFlight) -> None:
        """``record`` (in the table) was admitted by the scheduler."""
        record.running = True
        self.real_running += record.real

    def pop(self, request_id: str) -> InFlight | None:
        """The record of a finished request, off the table (None if not on it)."""
        record = self._records.pop(request_id, None)
        if record is not None:
            self.warmups -= record.warmup
            self.real -= record.real
            self.real_running -= record.real and record.running
        return record

    def warmups_in_flight(self) -> list[tuple[str, InFlight]]:
        """The warm-ups on the table (no scan without any)."""
        if not self.warmups:
            return []
        return [(rid, r) for rid, r in self._records.items() if r.warmup]

    def real_prefilling(self) -> bool:
        """Whether a real request on the table has prefill left."""
        return any(r.prefilling for r in self._records.values() if r.real)
