"""The extension composed with vLLM's own offloading through ``MultiConnector``.

``python -m server_ext serve`` puts the extension's connector first (it lowers
each request's hints into vLLM's ``kv_hints`` before vLLM's offloading builds
its request context) and vLLM's ``OffloadingConnector`` second, with the
extension's spec and cache policy; the hint-free baseline is vLLM's
offloading alone with vLLM's LRU. vLLM's own factories resolve every name,
through the ``vllm.general_plugins`` entry point or the module paths.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import msgspec
import pytest
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope
from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

from hints_spec import KV_HINTS_ACTION_TYPE, AgentHints, find_session_action
from server_ext import offloading_transfer, transfer_config
from server_ext.__main__ import main as serve_main
from server_ext._config import (
    CONNECTOR_NAME,
    HOST_OFFLOADING_CONNECTOR,
    OFFLOAD_MODULE,
    OFFLOAD_POLICY,
    OFFLOAD_SPEC,
)
from server_ext._contract import hint_params
from server_ext._plugin import register
from server_ext._vllm import connector_config
from server_ext.connector import AgentHintsConnector
from server_ext.offload import (
    AgentHintsCachePolicy,
    HostOffloadingConnector,
    HostOffloadingSpec,
    lower_to_envelope,
)


def test_the_default_is_vllms_offloading_beside_the_extension() -> None:
    config = transfer_config({"tier_bytes": 1 << 30, "ttl_cap_s": 60})
    assert config["kv_connector"] == "MultiConnector"
    # A tier miss is recomputed: vLLM reads this from the top-level config.
    assert config["kv_load_failure_policy"] == "recompute"
    ours, offloading = config["kv_connector_extra_config"]["connectors"]  # type: ignore[index]
    assert ours["kv_connector"] == CONNECTOR_NAME
    assert ours["kv_connector_extra_config"]["ttl_cap_s"] == 60
    assert offloading["kv_connector"] == HOST_OFFLOADING_CONNECTOR
    assert offloading["kv_connector_module_path"] == OFFLOAD_MODULE
    assert offloading["kv_connector_extra_config"] == {
        "spec_name": OFFLOAD_SPEC,
        "spec_module_path": OFFLOAD_MODULE,
        "cpu_bytes_to_use": 1 << 30,
        "eviction_policy": OFFLOAD_POLICY,
        "cache_policy_module_path": OFFLOAD_MODULE,
    }
    # vLLM accepts each entry as a KVTransferConfig (MultiConnector builds them so).
    for child in (ours, offloading):
        KVTransferConfig(**child)


def test_without_the_host_tier_the_extension_runs_alone() -> None:
    none = transfer_config({"tier": "none"})
    assert (none["kv_connector"], none["kv_role"]) == (CONNECTOR_NAME, "kv_producer")
    moon = transfer_config({"tier": "mooncake"})
    assert (moon["kv_connector"], moon["kv_role"]) == (CONNECTOR_NAME, "kv_both")
    assert moon["kv_load_failure_policy"] == "recompute"


def test_the_hint_free_baseline_is_vllms_lru_reading_no_hint() -> None:
    extra = offloading_transfer(123 << 20, hints=False)["kv_connector_extra_config"]
    assert extra["eviction_policy"] == "lru"  # type: ignore[index]
    assert "cache_policy_module_path" not in extra  # type: ignore[operator]
    assert extra["cpu_bytes_to_use"] == 123 << 20  # type: ignore[index]


def test_serve_composes_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    assert serve_main(["serve", "m", "--tier-bytes", "1000", "--print-command"]) == 0
    out = capsys.readouterr().out
    flag = out.split("--kv-transfer-config ")[1].strip().strip("'")
    assert json.loads(flag) == transfer_config({"tier_bytes": 1000})


def test_vllms_factories_resolve_every_name() -> None:
    register()
    register()  # vLLM may load plugins more than once per process
    assert KVConnectorFactory.get_connector_class_by_name(CONNECTOR_NAME) is AgentHintsConnector
    assert (
        KVConnectorFactory.get_connector_class_by_name(HOST_OFFLOADING_CONNECTOR)
        is HostOffloadingConnector
    )
    assert OffloadingSpecFactory.get_spec_cls({"spec_name": OFFLOAD_SPEC}) is HostOffloadingSpec
    assert CachePolicyFactory.get_cache_policy_cls(OFFLOAD_POLICY) is AgentHintsCachePolicy
    # and by module path, as a launch without the plugin names them
    by_path = {"spec_name": OFFLOAD_SPEC, "spec_module_path": OFFLOAD_MODULE}
    assert OffloadingSpecFactory.get_spec_cls(by_path) is HostOffloadingSpec
    assert CachePolicyFactory.get_cache_policy_cls("AgentHintsCachePolicy", OFFLOAD_MODULE) is (
        AgentHintsCachePolicy
    )


def test_the_plugin_is_an_entry_point_vllm_loads() -> None:
    from importlib.metadata import entry_points

    (plugin,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "agent_hints"]
    assert plugin.load() is register


def test_the_middleware_finds_the_extension_inside_multiconnector() -> None:
    config = transfer_config({"tier_bytes": 1 << 20, "control_rate": 7.0})
    kv = SimpleNamespace(
        kv_connector=config["kv_connector"],
        kv_connector_extra_config=config["kv_connector_extra_config"],
    )
    state = SimpleNamespace(vllm_config=SimpleNamespace(kv_transfer_config=kv))
    found = connector_config(state)
    assert found is not None and found.control_rate == 7.0
    other = SimpleNamespace(
        kv_connector="MultiConnector",
        kv_connector_extra_config={"connectors": [offloading_transfer(1 << 20, hints=False)]},
    )
    assert (
        connector_config(SimpleNamespace(vllm_config=SimpleNamespace(kv_transfer_config=other)))
        is None
    )


def test_hints_are_lowered_into_vllms_envelope_beside_other_actions() -> None:
    params = hint_params("t1", AgentHints(sid="s", br="b", gap=2.5, end=False))
    theirs = KvHintAction("x", "router.pin", "1", {"keep": True})
    forged = KvHintAction("y", KV_HINTS_ACTION_TYPE, "1", {"sid": "s", "tenant": "someone-else"})
    envelope = lower_to_envelope(KvHintsEnvelope("1", "m1", [theirs, forged]), params)
    assert envelope is not None and envelope.message_id == "m1"
    assert [a.action_id for a in envelope.actions] == ["x", "agent-hints"]  # in order

    found = find_session_action(msgspec.to_builtins(envelope))
    assert found is not None and found.tenant == "t1"  # the forged tenant was dropped
    assert (found.hints.sid, found.hints.br, found.hints.gap) == ("s", "b", 2.5)
    # An unhinted request keeps what it had; the forged action still goes.
    alone = lower_to_envelope(KvHintsEnvelope("1", "m2", [theirs, forged]), None)
    assert alone is not None and [a.action_id for a in alone.actions] == ["x"]
    assert lower_to_envelope(None, None) is None


def test_a_host_tier_without_vllms_offloading_beside_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def state(kv_connector: str, extra: object) -> SimpleNamespace:
        kv = SimpleNamespace(kv_connector=kv_connector, kv_connector_extra_config=extra)
        return SimpleNamespace(vllm_config=SimpleNamespace(kv_transfer_config=kv))

    with caplog.at_level("WARNING", logger="server_ext._vllm"):
        assert connector_config(state(CONNECTOR_NAME, {})) is not None  # the default: host
    assert "no host tier" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="server_ext._vllm"):
        composed = transfer_config({})
        connector_config(state("MultiConnector", composed["kv_connector_extra_config"]))
        connector_config(state(CONNECTOR_NAME, {"tier": "none"}))
    assert "no host tier" not in caplog.text
