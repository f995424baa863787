"""The Mooncake Store KV tier, and the settings of every tier.

The host-memory tier is vLLM's own offloading (``server_ext.offload``: vLLM's
``OffloadingConnector`` with the extension's cache policy). What stays here is
the tier vLLM's offloading does not cover on the CPU test bed: a Mooncake Store
shared by engines (docs/tiers.md says why). Hinted requests' full blocks are
copied to the store as they are computed, so a branch that left the device is
loaded back on return instead of recomputed. The scheduler side plans
(``TierPlanner``), the worker side moves bytes (``TierWorker``); only
``server_ext.connector`` connects them to vLLM.
"""

from ._blocks import BlockCodec
from ._config import (
    DEFAULT_TIER,
    TIER_KINDS,
    TIER_SECRET_ENV,
    TIER_STORES,
    TierConfig,
    TierConfigError,
    kv_role,
)
from ._guard import GuardedTier
from ._index import KeyIndex
from ._keys import Shard, block_key, checksum, mac, shard_key
from ._master import MooncakeMaster, MooncakeUnavailable, local_mooncake_master
from ._mooncake import MooncakeTier
from ._payoff import EXPLORE_SHARE, TierPayoff
from ._plan import BlockProgress, TierCounters, TierOps, TierPlanner
from ._protocol import KVTier, TierStats
from ._worker import TierReport, TierWorker

__all__ = [
    "DEFAULT_TIER",
    "EXPLORE_SHARE",
    "TIER_KINDS",
    "TIER_SECRET_ENV",
    "TIER_STORES",
    "BlockCodec",
    "BlockProgress",
    "GuardedTier",
    "KVTier",
    "KeyIndex",
    "MooncakeMaster",
    "MooncakeTier",
    "MooncakeUnavailable",
    "Shard",
    "TierConfig",
    "TierConfigError",
    "TierCounters",
    "TierOps",
    "TierPayoff",
    "TierPlanner",
    "TierReport",
    "TierStats",
    "TierWorker",
    "block_key",
    "checksum",
    "kv_role",
    "local_mooncake_master",
    "mac",
    "shard_key",
]
