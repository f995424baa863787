"""The connector's tier glue that needs no running engine."""

from __future__ import annotations

from server_ext._engine import HINTS_KEY, hint_params
from server_ext._vllm import TierWorkerMetadata, _tier_identity
from server_ext.tier import TierReport


def test_only_hinted_requests_use_the_tier_with_a_capped_soft_pin() -> None:
    assert _tier_identity(None, 600) is None
    assert _tier_identity({"other": 1}, 600) is None
    assert _tier_identity(hint_params("t", {"sid": None}), 600) is None
    assert _tier_identity({HINTS_KEY: {"hints": {"sid": "s"}}}, 600) is None  # no tenant
    assert _tier_identity(hint_params("t", {"sid": "s"}), 600) == ("t", 0.0)
    assert _tier_identity(hint_params("t", {"sid": "s", "gap": 2.5}), 600) == ("t", 2.5)
    assert _tier_identity(hint_params("t", {"sid": "s", "gap": 2, "ttl": 900}), 600) == (
        "t",
        600.0,
    )
    assert _tier_identity(hint_params("t", {"sid": "s", "ttl": 60, "end": True}), 600) == (
        "t",
        0.0,
    )


def test_worker_reports_aggregate_across_workers() -> None:
    a = TierWorkerMetadata(TierReport(["k1"], [], 10, 0))
    b = TierWorkerMetadata(TierReport([], ["k2"], 5, 7))
    merged = a.aggregate(b)
    assert isinstance(merged, TierWorkerMetadata)
    assert merged.report == TierReport(["k1"], ["k2"], 15, 7)
