"""Whether the tier's saves pay for themselves on this engine."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EXPLORE_SHARE", "TierPayoff"]

EXPLORE_SHARE = 0.02
"""Share of the engine's busy time the tier may spend without paying back:
saves must come before any load can pay for them, and a workload that fits the
device never loads, so a tier that has not paid (yet) costs at most this."""


@dataclass(slots=True)
class TierPayoff:
    """The tier's books: engine seconds it cost against prefill seconds it spared.

    The worker saves and loads inside engine steps, so every second it spends
    is a second of every running request's latency (``cost``). Each block it
    loads spares the prefill of its tokens, at the engine's measured seconds
    per prefill token (``spared``). Saves go on while the spared seconds, plus
    ``explore_share`` of the engine's busy time (``busy``), cover the cost;
    otherwise the tier stops saving and the engine serves as without it
    (loads of what the tier holds go on: each is a prefill spared). As busy
    time grows the allowance returns, so a tier that stepped back keeps
    saving a little and finds out when its loads start paying again. With
    ``trial`` off the books are kept and the tier always saves.

    Invariants: every total is >= 0 and only grows; ``saving`` is
    ``not trial or spared_s + explore_share * busy_s >= cost_s``.
    """

    trial: bool = True
    explore_share: float = EXPLORE_SHARE
    busy_s: float = 0.0
    cost_s: float = 0.0
    spared_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.explore_share <= 1:
            raise ValueError("explore_share must be in [0, 1]")

    def busy(self, seconds: float) -> None:
        """The engine ran steps for ``seconds``."""
        self.busy_s += max(seconds, 0.0)

    def cost(self, seconds: float) -> None:
        """The worker spent ``seconds`` of steps saving or loading."""
        self.cost_s += max(seconds, 0.0)

    def spared(self, seconds: float) -> None:
        """Loads spared ``seconds`` of prefill."""
        self.spared_s += max(seconds, 0.0)

    @property
    def saving(self) -> bool:
        """Whether the tier should save the blocks of a request starting now."""
        return not self.trial or self.spared_s + self.explore_share * self.busy_s >= self.cost_s
