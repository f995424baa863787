"""The record of one retained branch."""

from __future__ import annotations

from dataclasses import dataclass, field

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
      - While ``children`` is non-empty the retention lives to its horizon
        (forks reuse its prefix); see ``effective_deadline``.
      - ``token`` names the only valid entry of this retention in the
        policy's deadline heap, which is keyed by ``effective_deadline``.

    Args:
        key: The branch.
        block_ids: Held block ids, prefix first.
        retained_at: When the branch's request finished.
        expected_return: Predicted time of the next request (median).
        deadline: Own expiry (a high quantile of the predicted gap, with slack).
        horizon: Hard end of the retention.
        prio: Client urgency 0..7, lower keeps longer (victim tiebreak).
        gap: Latest client gap estimate (request ``gap`` or tool_start ``eta``).
        ttl: The client's ``ttl`` hint.
        parent: Branch this one forked from, if the client said so.
        children: Live forked branches (until their ``end``); carried over
            when the retention is replaced, dropped when the branch returns.
        token: Current heap entry id.
    """

    key: BranchKey
    block_ids: tuple[int, ...]
    retained_at: float
    expected_return: float
    deadline: float
    horizon: float
    prio: int
    gap: float | None
    ttl: int | None
    parent: str | None = None
    children: set[str] = field(default_factory=set)
    token: int = -1

    @property
    def effective_deadline(self) -> float:
        """When ``expire`` releases it: its horizon while forks are live."""
        return self.horizon if self.children else self.deadline

    def victim_rank(self, now: float) -> tuple[bool, float, int, float]:
        """Sort key, first = released first: expired, then furthest expected
        return (Belady with predicted next use), then higher ``prio`` number,
        then oldest."""
        return (self.effective_deadline > now, -self.expected_return, -self.prio, self.retained_at)
