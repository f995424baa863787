"""Which branches of each session are known: one index for retention and prefetch."""

from __future__ import annotations

from ._keys import BranchKey

__all__ = ["SessionIndex"]


class SessionIndex:
    """The branch ids known of each ``(tenant, sid)``, so that ending a
    session finds its branches without a scan. A session without a branch
    left is dropped: the index never outgrows what its owner tracks."""

    def __init__(self) -> None:
        self._branches: dict[tuple[str, str], set[str]] = {}

    def __len__(self) -> int:
        return len(self._branches)

    def add(self, key: BranchKey) -> None:
        self._branches.setdefault((key.tenant, key.sid), set()).add(key.br)

    def discard(self, key: BranchKey) -> None:
        session = (key.tenant, key.sid)
        branches = self._branches.get(session)
        if branches is None:
            return
        branches.discard(key.br)
        if not branches:
            del self._branches[session]

    def branches(self, tenant: str, sid: str) -> tuple[str, ...]:
        """The session's branch ids (a copy: the caller may discard them)."""
        return tuple(self._branches.get((tenant, sid), ()))

    def clear(self) -> None:
        self._branches.clear()
