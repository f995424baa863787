"""The record of one retained branch."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._estimator import ReturnPlan
from ._keys import BranchKey


@dataclass(slots=True, eq=False)
class Retention:
    """A branch's KV blocks held across a tool gap.

    Invariants (kept by ``RetentionPolicy``):
      - ``block_ids`` are distinct and are exactly what the matching ``Hold``
        carried; the ``Release`` carries the same tuple.
      - ``retained_at <= deadline <= horizon``; ``horizon`` is
        ``retained_at + min(ttl, ttl_cap_s)`` and nothing moves a deadline past
        it, so no retention outlives the TTL cap.
      - While ``children`` is non-empty, or once the branch's next request has
        arrived (``arrived_at``) and waits to be scheduled, the retention lives
        to its horizon; see ``effective_deadline``.
      - ``rank`` is where the policy's victim orders hold it; ``due_at``, the
        return its tenant's due index holds it at (None: not there).

    Args:
        key: The branch.
        block_ids: Held block ids, prefix first.
        retained_at: When the branch's request finished.
        plan: When its next request is predicted (from its departure, a
            tool start or end, or its arrival).
        deadline: Own expiry (a high quantile of the predicted gap, with slack).
        horizon: Hard end of the retention.
        prio: Client urgency 0..7, lower keeps longer (victim tiebreak).
        gap: Latest client gap estimate (request ``gap`` or tool_start ``eta``).
        ttl: The client's ``ttl`` hint.
        parent: Branch this one forked from, if the client said so.
        children: Live forked branches (until their ``end``); carried over
            when the retention is replaced, dropped when the branch returns.
        arrived_at: When the branch's next request reached the engine, if it
            is queued: its blocks are the surest next use of all.
        warmed: A prefetch warm-up recomputed some of ``block_ids``; how the
            retention ends (its branch back, or released first) scores prefetch.
        rank: Its place in victim order, as last ranked.
        due_at: Its place in the due index.
    """

    key: BranchKey
    block_ids: tuple[int, ...]
    retained_at: float
    plan: ReturnPlan
    deadline: float
    horizon: float
    prio: int
    gap: float | None
    ttl: int | None
    parent: str | None = None
    children: set[str] = field(default_factory=set)
    arrived_at: float | None = None
    warmed: bool = False
    rank: tuple[int, float, int, float] = (0, 0.0, 0, 0.0)
    due_at: float | None = None

    @property
    def effective_deadline(self) -> float:
        """When ``expire`` releases it: its horizon while forks are live or
        its next request waits in the engine's queue."""
        return self.horizon if self.children or self.arrived_at is not None else self.deadline

    @property
    def expected_return(self) -> float:
        """The planned time of the next request (the median)."""
        return self.plan.expected

    def next_use(self, now: float) -> float:
        """When the branch is predicted back, given that it is still away at
        ``now`` (``ReturnPlan.next_use``). A branch overdue on a heavy-tailed
        gap is likely away much longer, so it must not stay the last victim
        as if it were back any second. A queued request's is its arrival."""
        if self.arrived_at is not None:
            return self.arrived_at
        return self.plan.next_use(now)

    def evicts_for(self, expected_return: float, now: float) -> bool:
        """May a newcomer expected back at ``expected_return`` take this
        retention's budget? Only if this one is due later (Belady admission)
        or expired."""
        if self.effective_deadline <= now:
            return True
        return self.arrived_at is None and self.next_use(now) > expected_return
