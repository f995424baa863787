"""The live retentions and the bookkeeping kept in step with them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ._actions import Action, Release, ReleaseReason
from ._books import PrefetchAccuracy
from ._heap import IndexedHeap
from ._keys import BranchKey
from ._ledger import BlockLedger
from ._order import Ranking
from ._retention import Retention
from ._sessions import SessionIndex

__all__ = ["MAX_LIVE_FORKS", "RetentionTable"]

MAX_LIVE_FORKS = 256
"""Live forks one retention tracks (over all fork events); bounds the state a
tenant can create. Not the protocol's ``MAX_CHILDREN``, a cap per fork event."""


class RetentionTable:
    """Every live retention, and each index that must change with it: its
    session's branches, the distinct blocks it holds (``BlockLedger``), its
    deadline, its rank (``Ranking``), its tenant's count, its live forks.

    It exists so that a retention is only ever added (``insert``), shrunk
    (``trim``) or removed (``drop``) in one place that updates all of them
    at once: the deciding code above (``RetentionPolicy``, ``Evictor``)
    chooses *which* retention, this object keeps the books true. It also
    counts what was released and why, and scores warmed retentions as they
    end (``prefetch``).

    Invariants: each retention of ``retentions`` is in ``sessions``, counted
    once in ``ledger`` and ``tenant_retentions``, in ``deadlines`` at its
    ``effective_deadline`` and in ``ranking``; nothing else is in any of them.
    """

    def __init__(self) -> None:
        self.retentions: dict[BranchKey, Retention] = {}
        self.sessions = SessionIndex()
        self.ledger = BlockLedger()
        self.deadlines = IndexedHeap[BranchKey]()
        self.ranking = Ranking(self.retentions)
        self.tenant_retentions: Counter[str] = Counter()
        self.released: Counter[ReleaseReason] = Counter()
        self.holds = 0
        self.prefetch = PrefetchAccuracy()

    def insert(self, r: Retention, now: float) -> None:
        """Add ``r`` (its ``Hold`` is the caller's to announce)."""
        self.retentions[r.key] = r
        self.sessions.add(r.key)
        self.ledger.add(r.key.tenant, r.block_ids)
        self.tenant_retentions[r.key.tenant] += 1
        self.holds += 1
        self.replan(r, now)

    def drop(self, r: Retention, reason: ReleaseReason) -> tuple[Release, list[int], list[int]]:
        """Forget ``r``; return its Release and the blocks no longer held
        globally and by its tenant."""
        key = r.key
        del self.retentions[key]
        self.sessions.discard(key)
        freed, tenant_freed = self.ledger.remove(key.tenant, r.block_ids)
        self.deadlines.remove(key)
        self.tenant_retentions[key.tenant] -= 1
        last_of_tenant = not self.tenant_retentions[key.tenant]
        if last_of_tenant:
            del self.tenant_retentions[key.tenant]
        self.ranking.remove(r, last_of_tenant)
        self.released[reason] += 1
        if r.warmed and reason not in (ReleaseReason.REPLACED, ReleaseReason.RESET):
            self.prefetch.add(reason is ReleaseReason.RETURNED)
        return Release(key, r.block_ids, reason), freed, tenant_freed

    def trim(self, r: Retention, keep: int) -> tuple[Release, list[int], list[int]]:
        """Keep ``r``'s first ``keep`` blocks (its prefix) and give up the
        rest; like ``drop``, return that Release and the blocks it frees."""
        tail = r.block_ids[keep:]
        r.block_ids = r.block_ids[:keep]
        freed, tenant_freed = self.ledger.remove(r.key.tenant, tail)
        self.released[ReleaseReason.BUDGET] += 1
        return Release(r.key, tail, ReleaseReason.BUDGET), freed, tenant_freed

    def schedule(self, r: Retention) -> None:
        """Keep ``r`` in the deadline heap at its current effective deadline."""
        self.deadlines.set(r.key, r.effective_deadline)

    def replan(self, r: Retention, now: float) -> None:
        """``r``'s deadline or planned return changed: re-schedule and re-rank it."""
        self.schedule(r)
        self.ranking.index(r, now)

    def expire(self, now: float) -> tuple[list[Action], int]:
        """Release retentions past their deadline; return the actions and how
        many distinct blocks they freed. O(1) when none is due."""
        actions: list[Action] = []
        freed = 0
        while (first := self.deadlines.peek()) is not None and first[0] <= now:
            release, released, _ = self.drop(self.retentions[first[1]], ReleaseReason.EXPIRED)
            actions.append(release)
            freed += len(released)
        return actions, freed

    def add_children(self, r: Retention, children: Iterable[str]) -> bool:
        """Register live forks of ``r``; False if some did not fit."""
        for child in children:
            if child != r.key.br and child not in r.children:
                if len(r.children) >= MAX_LIVE_FORKS:
                    return False
                r.children.add(child)
        self.schedule(r)
        return True

    def end(self, key: BranchKey, session: bool, resume_by: float) -> list[Action]:
        """Release branch ``key`` (or its whole session) and unregister it as
        a live fork: a parent whose last child ended keeps its own deadline,
        but lives at least until ``resume_by``, since it usually resumes now."""
        in_session = [
            self.retentions[key.sibling(br)] for br in self.sessions.branches(key.tenant, key.sid)
        ]
        if session:
            return [self.drop(r, ReleaseReason.END)[0] for r in in_session]
        actions: list[Action] = []
        for r in in_session:
            if r.key == key:
                actions.append(self.drop(r, ReleaseReason.END)[0])
            elif key.br in r.children:
                r.children.discard(key.br)
                if not r.children:
                    r.deadline = max(r.deadline, min(resume_by, r.horizon))
                self.schedule(r)
        return actions

    def release_all(self, reason: ReleaseReason) -> list[Action]:
        """Release every retention."""
        actions: list[Action] = [self.drop(r, reason)[0] for r in list(self.retentions.values())]
        self.deadlines.clear()
        self.ranking.clear()
        return actions

    def forget_all(self) -> None:
        """Drop every retention without a ``Release`` (see
        ``RetentionPolicy.forget_all``); the counters stay."""
        self.retentions.clear()
        self.sessions.clear()
        self.ledger = BlockLedger()
        self.tenant_retentions.clear()
        self.deadlines.clear()
        self.ranking.clear()
