"""vLLM KV connector of the extension: ``kv_connector_module_path`` =
``server_ext.connector``, ``kv_connector`` = ``AgentHintsConnector``.

``connector`` is the thin class vLLM instantiates per role; ``scheduler`` and
``worker`` hold each role's work, ``allocation`` the wrapped KV cache manager,
``warmups`` the pacing and preemption of prefetch warm-ups, ``tier`` the tier
wiring and the scheduler's side of it, ``metadata`` and ``metrics`` what the roles exchange
and export. Every vLLM import goes through ``server_ext._vllm``.
"""

from .connector import AgentHintsConnector
from .metadata import AgentHintsMetadata, TierWorkerMetadata
from .metrics import AgentHintsPromMetrics, AgentHintsStats

__all__ = [
    "AgentHintsConnector",
    "AgentHintsMetadata",
    "AgentHintsPromMetrics",
    "AgentHintsStats",
    "TierWorkerMetadata",
]
