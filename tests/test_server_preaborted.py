"""Requests vLLM 0.33 adds only to abort them at once, on vLLM's own scheduler.

A request that arrives while the engine is paused is re-added with
``abort_immediately`` so that connectors can free what they set up for it: it
never runs. Its branch did not come back, so its hints must not act: no
return, no end, no new deadline, no hint for vLLM's offloading policy.
"""

from __future__ import annotations

from pathlib import Path

from vllm.v1.request import RequestStatus
from vllm_scheduler import request, scheduler, step

from hints_spec import AgentHints
from server_ext._contract import hint_params
from server_ext.connector import AgentHintsConnector


def test_a_pre_aborted_request_leaves_the_sessions_retention_as_it_was(
    test_model_dir: Path,
) -> None:
    s = scheduler(test_model_dir, {})
    connector = s.connector
    assert isinstance(connector, AgentHintsConnector)
    s.add_request(
        request("a", 1, max_tokens=4, kv_transfer_params=hint_params("t", AgentHints(sid="s")))
    )
    while s.has_unfinished_requests():
        step(s)
    assert connector._scheduler is not None
    retention = connector._scheduler.retention
    assert retention is not None and retention.stats.holds == 1
    ending = request("x", 1, kv_transfer_params=hint_params("t", AgentHints(sid="s", end=True)))
    ending.abort_immediately = True  # vLLM 0.33: arrived while paused
    s.add_request(ending)
    s.finish_requests(["x"], RequestStatus.FINISHED_ABORTED)
    stats = retention.stats
    assert (stats.returns, stats.ends, stats.replacements) == (0, 0, 0)
    assert [r.key.sid for r in retention.policy.retentions()] == ["s"]  # still held
    # Nothing of its hints reached the connectors after this one either.
    assert ending.kv_hints is None
    assert "agent_hints" not in (ending.kv_transfer_params or {})
