"""vLLM's ``vllm.general_plugins`` entry point: the extension's names in vLLM's
registries, in every vLLM process (API server, engine core, workers).

With it a plain ``vllm serve`` takes ``"kv_connector": "AgentHintsConnector"``
and ``"HostOffloadingConnector"`` without ``kv_connector_module_path``, vLLM's
offloading takes
``"spec_name": "HostOffloadingSpec"`` and ``"eviction_policy":
"AgentHintsCachePolicy"`` without module paths, and ``MultiConnector`` can
rebuild the connector's statistics in the API server (it looks connectors up
by name there).
"""

from __future__ import annotations

from ._config import (
    CONNECTOR_MODULE,
    CONNECTOR_NAME,
    HOST_OFFLOADING_CONNECTOR,
    OFFLOAD_MODULE,
    OFFLOAD_POLICY,
    OFFLOAD_SPEC,
)

__all__ = ["register"]


def register() -> None:
    """Register the connector, offloading spec and cache policy by name (once
    per process: vLLM may load plugins more than once)."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    if CONNECTOR_NAME not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector(CONNECTOR_NAME, CONNECTOR_MODULE, CONNECTOR_NAME)
    if HOST_OFFLOADING_CONNECTOR not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector(
            HOST_OFFLOADING_CONNECTOR, OFFLOAD_MODULE, HOST_OFFLOADING_CONNECTOR
        )
    if OFFLOAD_SPEC not in OffloadingSpecFactory._registry:
        OffloadingSpecFactory.register_spec(OFFLOAD_SPEC, OFFLOAD_MODULE, OFFLOAD_SPEC)
    if OFFLOAD_POLICY not in CachePolicyFactory._registry:
        CachePolicyFactory.register_cache_policy(OFFLOAD_POLICY, OFFLOAD_MODULE, OFFLOAD_POLICY)
