"""Data-parallel routing by session: one engine holds a session's KV.

With ``--data-parallel-size N`` behind one API server, vLLM's client balances
each request by load unless the request names a rank, so a session's turns,
its retention and its control events would land on different engines: each
turn misses the KV the last one left, and an ``end`` releases nothing. The
middleware names a rank for every hinted request (vLLM's own
``X-data-parallel-rank`` header, unless the client set one) and for every
control message (``data_parallel_rank``), from a stable hash of the tenant and
the session: every API server process and every restart picks the same one.

Where vLLM's API server does not balance across ranks (one rank, or an
external or hybrid load balancer that assigns ranks itself) there is nothing
to route: the balancer in front must keep sessions together (vllm-router's
``consistent_hash`` on ``X-Session-ID``).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

__all__ = ["RANK_HEADER", "SessionRanks"]

logger = logging.getLogger(__name__)

RANK_HEADER = b"x-data-parallel-rank"
"""vLLM's header that pins a request to a data-parallel rank."""


@dataclass(frozen=True, slots=True)
class SessionRanks:
    """The data-parallel rank of each session, among ``count`` engines."""

    count: int

    @classmethod
    def of(cls, app_state: Any) -> SessionRanks | None:
        """The ranks vLLM's API server balances across, or None when it
        balances none (one rank, or ranks assigned in front of it)."""
        parallel = getattr(getattr(app_state, "vllm_config", None), "parallel_config", None)
        size = int(getattr(parallel, "data_parallel_size", 1) or 1)
        if size <= 1:
            return None
        if getattr(parallel, "data_parallel_external_lb", False) or getattr(
            parallel, "data_parallel_hybrid_lb", False
        ):
            logger.warning(
                "agent-hints: data parallelism with ranks assigned in front of vLLM: keep "
                "each session on one rank there (e.g. vllm-router's consistent_hash on "
                "X-Session-ID), or its KV and retention split across engines"
            )
            return None
        return cls(size)

    def rank(self, tenant: str, sid: str) -> int:
        """The rank of ``tenant``'s session ``sid``: stable across processes
        and restarts (a keyed hash would not be; Python's ``hash`` is salted)."""
        digest = hashlib.blake2b(f"{tenant}\0{sid}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.count
