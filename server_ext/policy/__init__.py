"""KV retention policy for agent sessions: pure Python, no vLLM import.

Driven by events and an injected clock, it decides which branches' KV blocks to
hold across tool gaps and when to let them go; an adapter applies its
``Hold``/``Release`` actions to vLLM's block pool. The same code runs in the
engine core, in unit tests with a fake clock, and in simulators.
``PrefetchPlanner`` plans when to bring an idle branch's KV back before it
returns, from the same gap estimates; ``WarmFirstGate`` lets a mostly cached
request be admitted before a long cold prefill. The lifecycle events and
``Outcome`` are the protocol's plain ones (``hints_spec.core``), re-exported.
"""

from hints_spec.core import EndEvent, Event, ForkEvent, Outcome, ToolEndEvent, ToolStartEvent

from ._actions import Action, Decision, Hold, Reason, Release, ReleaseReason
from ._admission import AdmissionConfig, AdmissionTrial, StepTimer, WarmFirstGate
from ._config import EstimatorConfig, PolicyConfig
from ._estimator import GapEstimator, Prediction, ReturnPlan, median_given_elapsed
from ._evict import MAX_DROPS, MAX_ROOM_CALLS
from ._keys import BranchHints, BranchKey
from ._payoff import Payoff
from ._planner import Plan, PlannerStats, PrefetchPlanner
from ._policy import PolicyStats, RetentionPolicy
from ._retention import Retention
from ._table import MAX_LIVE_FORKS

__all__ = [
    "MAX_DROPS",
    "MAX_LIVE_FORKS",
    "MAX_ROOM_CALLS",
    "Action",
    "AdmissionConfig",
    "AdmissionTrial",
    "BranchHints",
    "BranchKey",
    "Decision",
    "EndEvent",
    "EstimatorConfig",
    "Event",
    "ForkEvent",
    "GapEstimator",
    "Hold",
    "Outcome",
    "Payoff",
    "Plan",
    "PlannerStats",
    "PolicyConfig",
    "PolicyStats",
    "Prediction",
    "PrefetchPlanner",
    "Reason",
    "Release",
    "ReleaseReason",
    "Retention",
    "RetentionPolicy",
    "ReturnPlan",
    "StepTimer",
    "ToolEndEvent",
    "ToolStartEvent",
    "WarmFirstGate",
    "median_given_elapsed",
]
