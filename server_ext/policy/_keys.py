"""Identity of a retained branch and the per-request hints the policy reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from hints_spec.core import DEFAULT_PRIO, ROOT_BRANCH


class BranchKey(NamedTuple):
    """One branch of one session of one tenant.

    Every lookup in the policy goes through a full key, so a tenant can only
    name its own sessions: isolation holds by construction, not by checks.
    (A tuple: hashed and compared in C, as the policy's indexes do per call.)
    """

    tenant: str
    sid: str
    br: str = ROOT_BRANCH

    def sibling(self, br: str) -> BranchKey:
        """Another branch of the same session."""
        return BranchKey(self.tenant, self.sid, br)


@dataclass(frozen=True, slots=True)
class BranchHints:
    """The hints of a finished request, as the policy needs them.

    The adapter converts ``hints_spec.AgentHints`` into this so that the policy
    stays free of pydantic and runs unchanged in simulators.

    Args:
        gap: Seconds the client expects before this branch's next request.
        ttl: Longest retention, in seconds, the client asks for.
        end: Last request of the branch (of the session on the root branch).
        prio: 0..7, lower keeps longer; only breaks ties between victims.
        pbr: Parent branch this branch forked from.
        tool: Name of the tool the response called, if known (keys learning).
    """

    gap: float | None = None
    ttl: int | None = None
    end: bool = False
    prio: int = DEFAULT_PRIO
    pbr: str | None = None
    tool: str | None = None
