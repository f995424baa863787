"""Online accounting of what a mechanism gained against what it cost."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Payoff"]


@dataclass(slots=True)
class Payoff:
    """Recent gains and costs of one mechanism, in one unit (blocks, seconds).

    Every mechanism of the extension that can cost something (keeping blocks
    ahead of LRU order, holding a prefill back) records what each of its
    actions turned out to gain and to cost, measured against what plain vLLM
    would have done; while the costs outweigh the gains it steps back. Both
    sums decay by ``1 / memory`` per recorded outcome, so the verdict follows
    the workload; a new one starts from ``prior`` units of gain, so a mechanism
    runs until the evidence is against it.

    ``spread`` (the decayed sum of each outcome's squared net) says how much
    of a lead is chance: one request that gains a whole prompt and another
    that loses one leave the books even but the spread wide (``clears``).

    Invariants: ``gained >= 0``, ``cost >= 0`` and ``spread >= 0``;
    ``outcomes`` and the undecayed ``total_gained`` / ``total_cost`` (for
    metrics) only grow.
    """

    memory: float = 64.0
    prior: float = 4.0
    gained: float = 0.0
    cost: float = 0.0
    spread: float = 0.0
    outcomes: int = 0
    total_gained: float = 0.0
    total_cost: float = 0.0

    def __post_init__(self) -> None:
        if self.memory < 1 or self.prior < 0:
            raise ValueError("memory must be >= 1 and prior >= 0")
        self.gained += self.prior

    def add(self, gained: float = 0.0, cost: float = 0.0) -> None:
        """One outcome: what an action gained and what it cost (both >= 0)."""
        if gained < 0 or cost < 0:
            raise ValueError("gains and costs are counted as non-negative amounts")
        keep = 1.0 - 1.0 / self.memory
        self.gained = self.gained * keep + gained
        self.cost = self.cost * keep + cost
        self.spread = self.spread * keep + (gained - cost) ** 2
        self.outcomes += 1
        self.total_gained += gained
        self.total_cost += cost

    @property
    def pays(self) -> bool:
        """Whether recent gains cover recent costs."""
        return self.gained >= self.cost

    def clears(self, margin: float, sigmas: float) -> bool:
        """Whether recent gains lead recent costs by ``margin`` and by more
        than chance would: ``sigmas`` times the outcomes' spread."""
        return self.gained - self.cost >= margin + sigmas * math.sqrt(self.spread)

    def trails(self, margin: float, sigmas: float) -> bool:
        """Whether recent costs lead recent gains so (``clears`` reversed)."""
        return self.cost - self.gained >= margin + sigmas * math.sqrt(self.spread)
