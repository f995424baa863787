"""What the connector's two roles send each other every step."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._vllm import KVConnectorMetadata, KVConnectorWorkerMetadata
from ..tier import TierOps, TierReport

__all__ = ["AgentHintsMetadata", "TierWorkerMetadata"]


@dataclass
class AgentHintsMetadata(KVConnectorMetadata):
    """Scheduler -> worker, every step: the tier's loads, saves and drops."""

    tier: TierOps = field(default_factory=TierOps)


@dataclass
class TierWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker -> scheduler, every step with tier work: what failed, bytes moved."""

    report: TierReport

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if isinstance(other, TierWorkerMetadata):
            mine, theirs = self.report, other.report
            mine.failed_saves.extend(theirs.failed_saves)
            mine.failed_loads.extend(theirs.failed_loads)
            mine.bytes_saved += theirs.bytes_saved
            mine.bytes_loaded += theirs.bytes_loaded
            mine.seconds = max(mine.seconds, theirs.seconds)  # ranks move bytes in parallel
        return self
