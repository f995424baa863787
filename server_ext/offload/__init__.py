"""The KV tier is vLLM's own offloading; the hints are its cache policy.

``--kv-transfer-config`` names these by module path (vLLM's
``spec_module_path`` and ``cache_policy_module_path``)::

    {"kv_connector": "HostOffloadingConnector",
     "kv_connector_module_path": "server_ext.offload", "kv_role": "kv_both",
     "kv_connector_extra_config": {
       "spec_name": "HostOffloadingSpec", "spec_module_path": "server_ext.offload",
       "cpu_bytes_to_use": 8589934592,
       "eviction_policy": "AgentHintsCachePolicy",
       "cache_policy_module_path": "server_ext.offload"}}

``python -m server_ext serve`` composes it with the extension's own connector
through vLLM's ``MultiConnector`` (``server_ext._launcher``).
``HostOffloadingConnector`` is vLLM's ``OffloadingConnector``, whose loads
complete within their engine step where the copy is a host memcpy (vLLM's
``"OffloadingConnector"`` works too, one engine step slower per tier hit on a
CPU). vLLM touch points of this package: ``OffloadingConnector``
(``get_num_new_matched_tokens``, ``get_finished``), ``OffloadingSpecFactory.get_spec_cls``,
``OffloadingSpec`` / ``CPUOffloadingSpec`` (``blocks_per_chunk``, ``num_chunks``,
``get_worker``), ``OffloadingWorker`` and its specs
(``GPULoadStoreSpec.group_sizes`` / ``block_indices``, ``CanonicalKVCaches``),
``CachePolicy`` (0.32: ``insert(key, chunk)``; 0.33 adds ``req_context``),
``ReqContext.kv_hints`` / ``kv_transfer_params`` / ``get_state`` / ``set_state``,
and ``KvHintsEnvelope`` / ``KvHintAction``.
"""

from ._connector import HostOffloadingConnector
from ._hints import lower_to_envelope, session_action
from ._policy import AgentHintsCachePolicy, PolicyCounters, policy_counters
from ._spec import HostOffloadingSpec
from ._worker import HostOffloadingWorker

__all__ = [
    "AgentHintsCachePolicy",
    "HostOffloadingConnector",
    "HostOffloadingSpec",
    "HostOffloadingWorker",
    "PolicyCounters",
    "lower_to_envelope",
    "policy_counters",
    "session_action",
]
