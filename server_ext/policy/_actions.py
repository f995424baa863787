"""What the policy tells its adapter to do, and how it answers a hint."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from hints_spec.core import Outcome

from ._keys import BranchKey


class ReleaseReason(StrEnum):
    """Why a retention ended (a metrics label)."""

    END = "end"
    EXPIRED = "expired"
    PRESSURE = "pressure"
    BUDGET = "budget"
    REPLACED = "replaced"
    RETURNED = "returned"
    RESET = "reset"


class Reason(StrEnum):
    """Why an outcome is clipped or rejected."""

    TTL_CAPPED = "ttl_capped"
    BUDGET_CLIPPED = "budget_clipped"
    OVER_BUDGET = "over_budget"
    UNKNOWN_BRANCH = "unknown_branch"
    TOO_MANY_CHILDREN = "too_many_children"


@dataclass(frozen=True, slots=True)
class Hold:
    """Take one reference on each of ``block_ids`` (block_pool.touch)."""

    key: BranchKey
    block_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Release:
    """Drop the references a matching earlier ``Hold`` took (free_blocks)."""

    key: BranchKey
    block_ids: tuple[int, ...]
    reason: ReleaseReason


Action = Hold | Release
"""All Holds of a list must be applied before its Releases, so blocks that a
replaced retention shares with its replacement never reach refcount 0. The
policy puts Holds first in every list, so applying a list in order suffices."""


@dataclass(frozen=True, slots=True)
class Decision:
    """Actions caused by a request or control event, and the hint's outcome."""

    actions: list[Action]
    outcome: Outcome = Outcome.ACCEPTED
    reason: Reason | None = None
