"""The connector's tier glue that needs no running engine."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from vllm.config import KVTransferConfig

from hints_spec import AgentHints
from server_ext import extension_flags
from server_ext._engine import TENANT_KEY, hint_params
from server_ext._vllm import (
    AgentHintsConnector,
    TierWorkerMetadata,
    _tier_for_role,
    _tier_identity,
)
from server_ext.tier import TierConfigError, TierReport


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


def _role(extra: dict[str, object]) -> str:
    flags = extension_flags(extra)
    role = json.loads(flags[flags.index("--kv-transfer-config") + 1])["kv_role"]
    assert isinstance(role, str)
    return role


def test_only_a_tier_makes_the_connector_a_kv_consumer() -> None:
    # A consumer's finished blocks are freed a step late under async scheduling:
    # without a tier nothing is loaded, so nothing should pay for that.
    assert _role({"tier": "none"}) == "kv_producer"
    assert _role({"tier": "none", "max_held_fraction": 0.5}) == "kv_producer"
    assert _role({}) == "kv_both"  # the default tier: host memory
    assert _role({"tier": "host"}) == "kv_both"
    assert _role({"tier": "mooncake"}) == "kv_both"
    with pytest.raises(TierConfigError, match="'tier'"):
        extension_flags({"tier": "disk"})


def test_a_tier_without_the_consumer_role_is_refused_the_default_gives_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def transfer(role: Literal["kv_producer", "kv_both"]) -> KVTransferConfig:
        return KVTransferConfig(kv_connector="AgentHintsConnector", kv_role=role)

    with pytest.raises(TierConfigError, match=r"kv_role='kv_producer'.*kv_both"):
        _tier_for_role({"tier": "host"}, transfer("kv_producer"))
    assert _tier_for_role({"tier": "host"}, transfer("kv_both")) is not None
    assert _tier_for_role({"tier": "none"}, transfer("kv_producer")) is None
    # A launch written before the tier was the default (kv_producer, no tier
    # key) starts as it did, without a tier, and says why.
    assert _tier_for_role({}, transfer("kv_producer")) is None
    assert "no KV tier" in caplog.text
    default = _tier_for_role({}, transfer("kv_both"))
    assert default is not None and default.kind == "host"
