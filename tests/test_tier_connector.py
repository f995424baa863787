"""The connector's tier glue that needs no running engine."""

from __future__ import annotations

from hints_spec import AgentHints
from server_ext._engine import TENANT_KEY, hint_params
from server_ext._vllm import AgentHintsConnector, TierWorkerMetadata, _tier_identity
from server_ext.tier import TierReport


def test_only_hinted_requests_use_the_tier_with_a_capped_soft_pin() -> None:
    assert _tier_identity(None, 600) is None
    assert _tier_identity({"other": 1}, 600) is None
    assert _tier_identity(hint_params("t", AgentHints(br="a")), 600) is None  # no session
    no_tenant = hint_params("t", AgentHints(sid="s"))
    del no_tenant[TENANT_KEY]
    assert _tier_identity(no_tenant, 600) is None
    assert _tier_identity(hint_params("t", AgentHints(sid="s")), 600) == ("t", 0.0)
    assert _tier_identity(hint_params("t", AgentHints(sid="s", gap=2.5)), 600) == ("t", 2.5)
    capped = hint_params("t", AgentHints(sid="s", gap=2, ttl=900))
    assert _tier_identity(capped, 600) == ("t", 600.0)
    ended = hint_params("t", AgentHints(sid="s", ttl=60, end=True))
    assert _tier_identity(ended, 600) == ("t", 0.0)


def test_worker_reports_aggregate_across_workers() -> None:
    a = TierWorkerMetadata(TierReport(["k1"], [], 10, 0))
    b = TierWorkerMetadata(TierReport([], ["k2"], 5, 7))
    merged = a.aggregate(b)
    assert isinstance(merged, TierWorkerMetadata)
    assert merged.report == TierReport(["k1"], ["k2"], 15, 7)


def test_the_connector_asks_no_reliable_kv_delivery() -> None:
    # vLLM would otherwise drop a preempted request's in-flight output (kv_both
    # counts as a producer), unlike plain vLLM: retention is best effort.
    prop = AgentHintsConnector.__dict__["requires_kv_delivery"]
    assert isinstance(prop, property) and prop.fget is not None
    assert prop.fget(object.__new__(AgentHintsConnector)) is False
