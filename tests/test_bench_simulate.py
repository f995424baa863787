"""The fleet simulator (``python -m benchmarks.simulate``): its engine model,
that it drives the project's own policies, and its validation mechanics.
Small generated or hand-written workloads only: no server, no ../shared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

from benchmarks import simulate
from benchmarks._sim._cache import DevicePool
from benchmarks._sim._cluster import CONFIGS, Cluster, RunSpec, run
from benchmarks._sim._model import MODELS, PRESETS, LinkSpec, Measured, Preset
from benchmarks._sim._summary import SUMMARY_KEYS
from benchmarks._sim._tier import offload_key, offload_keys
from benchmarks._sim._validate import logged_token_s, validate
from benchmarks._sim._workload import Pacing, Template, from_trace
from benchmarks._traces import parse_trace
from server_ext.offload import AgentHintsCachePolicy


def _req(hash_ids: list[int], think: float = 0.0, out: int = 64, end_turn: bool = False) -> Any:
    r: dict[str, Any] = {
        "type": "n",
        "t": 0.0,
        "in": 64 * len(hash_ids),
        "out": out,
        "hash_ids": hash_ids,
        "think_time": think,
    }
    if end_turn:
        r["stop"] = "end_turn"
    return r


def _trace(tid: str, turns: int = 6, grow: int = 32, think: float = 20.0) -> dict[str, Any]:
    """A session whose prompt grows by ``grow`` hash ids a turn, with one
    sub-agent fork after its second request."""
    requests: list[dict[str, Any]] = []
    for i in range(turns):
        requests.append(_req(list(range((i + 1) * grow)), think=think if i else 0.0))
        if i == 1:
            sub = [_req([1000 + j for j in range(grow)]), _req([1000 + j for j in range(2 * grow)])]
            requests.append(
                {
                    "type": "subagent",
                    "t": 0.0,
                    "agent_id": f"{tid}-a",
                    "duration_ms": 5000.0,
                    "requests": sub,
                }
            )
    return {"id": tid, "requests": requests}


def _bed(device_blocks: int = 64, tier_blocks: int = 512) -> Preset:
    """A small engine: 64-token blocks of 64 KiB, a fast step."""
    return Preset(
        name="small",
        cost=Measured(step_s_fixed=0.01, prefill_token_s=1e-5, decode_seq_s=0.0),
        block_tokens=64,
        device_blocks=device_blocks,
        kv_block_bytes=64 << 10,
        host_tier_bytes=tier_blocks * (64 << 10),
        pcie=LinkSpec(1e9, 1e-4),
        pool_link=LinkSpec(1e9, 1e-4),
        max_batched_tokens=2048,
        max_seqs=64,
        token_scale=1 / 16,
        max_out=8,
        max_model_len=8192,
    )


def _templates(preset: Preset, n: int = 4, **kw: Any) -> list[Template]:
    pacing = Pacing(
        time_scale=10.0,
        max_wait_s=30.0,
        token_scale=preset.token_scale,
        block_tokens=preset.block_tokens,
        max_out=preset.max_out,
    )
    return [from_trace(parse_trace(_trace(f"t{i}", **kw)), pacing) for i in range(n)]


# -- the engine model


def test_device_pool_evicts_a_chain_from_its_tail_and_sets_held_blocks_aside() -> None:
    pool = DevicePool(4)
    assert pool.acquire([1, 2, 3], anon=0)
    pool.computed([1, 2, 3])
    pool.release([1, 2, 3], anon=0)
    assert pool.hit([1, 2, 3], limit=3) == 3
    pool.hold([3])  # retention keeps the tail: the next eviction passes over it
    assert pool.acquire([7, 8], anon=0)
    pool.computed([7, 8])
    # One empty block, then one eviction: 3 is the oldest but held, so 2 goes.
    assert pool.hit([1, 2, 3], limit=3) == 1
    assert pool.hit([3], limit=1) == 1
    pool.release([7, 8], anon=0)
    assert pool.free_blocks() == 4  # held blocks count free, as vLLM counts them


def test_a_request_that_cannot_get_blocks_changes_nothing() -> None:
    pool = DevicePool(3)
    assert pool.acquire([1, 2], anon=1)
    assert not pool.acquire([5, 6], anon=0)
    assert pool.free_blocks() == 0
    assert pool.hit([5], limit=1) == 0


def test_ended_blocks_go_first_and_a_put_back_block_keeps_its_place() -> None:
    pool = DevicePool(4)
    assert pool.acquire([1, 2, 3, 4], anon=0)
    pool.computed([1, 2, 3, 4])
    pool.hold([1, 4])
    pool.release([1, 2, 3, 4], anon=0)  # freed 4, 3, 2, 1
    pool.release_held([1], evict_first=True)  # an ended branch's block: first
    pool.release_held([4], evict_first=False)  # back in its place: the oldest
    assert pool.acquire([5, 6], anon=0)
    assert pool.hit([2, 3], limit=2) == 2 and pool.hit([1], 1) == 0 and pool.hit([4], 1) == 0


def test_the_tiers_keys_are_vllms_offload_keys() -> None:
    keys = [0, 1, (7 << 40) | 12345, (1 << 63) - 1]
    assert offload_keys(keys) == [offload_key(k) for k in keys]


def test_the_logs_step_cost_counts_only_intervals_saturated_throughout(tmp_path: Path) -> None:
    line = (
        "Avg prompt throughput: {} tokens/s, Avg generation throughput: 1.0 tokens/s, "
        "Running: 3 reqs, Waiting: {} reqs, CPU KV cache usage: 50.0%, "
        "Prefix cache hit rate: {}%, External prefix cache hit rate: 0.0%"
    )
    log = tmp_path / "vllm.log"
    rows = [(500, 4, 0), (2000, 3, 0), (1000, 0, 0), (9000, 2, 0), (1000, 5, 0), (4000, 5, 10)]
    log.write_text("\n".join(line.format(*r) for r in rows))
    # The first interval held the idle start; the fourth began with nothing
    # waiting; the last counts cache hits: 2000 and 1000 tokens/s remain.
    assert logged_token_s([log]) == pytest.approx(1 / 1500)


def test_roofline_kv_geometry_from_the_model_configs() -> None:
    assert MODELS["llama-70b"].kv_bytes_per_token(2) == 320 * 1024
    assert MODELS["llama-8b"].kv_bytes_per_token(2) == 128 * 1024
    p = PRESETS["h100-70b"]
    # Four 80 GB GPUs less 141 GB of weights: a few hundred thousand tokens.
    assert 300_000 < p.device_blocks * p.block_tokens < 500_000
    assert p.kv_block_bytes == 256 * 320 * 1024
    # Prefill is compute-bound: 8k tokens of a 70B take ~1 s on 4 H100s at 50% MFU.
    assert 0.3 < p.cost.step_s(8192, 8192 * 4096, 0, 0) < 2.0


def test_a_load_from_the_tier_waits_for_its_copy() -> None:
    preset = _bed(device_blocks=30)
    templates = _templates(preset, n=4, grow=64)
    records, cluster = run(RunSpec(preset=preset), "hint-free", templates, True)
    engine = cluster.engines[0]
    assert engine.loads > 0
    assert engine.bytes_loaded["host"] > 0
    # Every load took at least its bytes over the link.
    per_load = engine.load_wait_s / engine.loads
    assert per_load >= preset.pcie.latency_s
    assert all(r.cached_tokens <= r.prompt_tokens for r in records)


# -- the project's own policies


def test_the_extension_runs_the_projects_retention_and_tier_policy() -> None:
    preset = _bed()
    records, cluster = run(RunSpec(preset=preset), "extension", _templates(preset), True)
    engine = cluster.engines[0]
    assert engine.tier is not None and engine.retention is not None
    policy = engine.tier.manager._policy
    assert isinstance(policy, AgentHintsCachePolicy)
    assert policy.counters.ended_branches > 0  # each sub-agent's last request says end
    assert engine.retention.stats.holds > 0
    assert records and all(r.ttft_s > 0 for r in records)


def test_hint_free_is_vllms_lru_and_plain_has_no_tier() -> None:
    preset = _bed()
    hint_free = Cluster(RunSpec(preset=preset), "hint-free").engines[0]
    assert hint_free.tier is not None and hint_free.retention is None
    assert isinstance(hint_free.tier.manager._policy, LRUCachePolicy)
    plain = Cluster(RunSpec(preset=preset), "plain").engines[0]
    assert plain.tier is None and plain.retention is None


def test_the_sticky_router_keeps_a_session_on_one_instance() -> None:
    cluster = Cluster(RunSpec(preset=_bed(), instances=8), "plain")
    assert len({cluster.route("session-a").index for _ in range(5)}) == 1
    assert len({cluster.route(f"s{i}").index for i in range(200)}) == 8
    load = Cluster(RunSpec(preset=_bed(), instances=3, router="load"), "plain")
    assert load.route("x").index == 0  # all idle: the first


# -- the command


def test_the_command_writes_every_configuration(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    code = simulate.main(
        [
            "--preset",
            "h100-8b",
            "--generated",
            "--sessions",
            "3",
            "--rate",
            "0.1",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    data = json.loads(out.read_text())
    assert set(data["summary"]) == set(CONFIGS)
    for s in data["summary"].values():
        assert set(SUMMARY_KEYS) <= set(s)
        assert s["sessions"] == 3 and s["requests"] > 0
    summary = data["summary"]
    assert summary["unlimited"]["reuse_of_theoretical"] == pytest.approx(1.0)
    assert summary["belady"]["reuse_of_theoretical"] >= summary["plain"]["reuse_of_theoretical"]


def test_validation_compares_the_simulated_runs_with_the_measured(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    for i in range(3):
        (traces / f"t{i}.json").write_text(json.dumps(_trace(f"t{i}")))
    measured = {
        "reuse_of_theoretical": 0.5,
        "ttft_mean_s": 0.1,
        "requests": 30,
        "server_prefill_time_mean_s": 0.02,
        "server_prefill_tokens": 20000,
    }
    configs = ("plain", "hint-free", "extension", "unlimited")
    runs = {c: {"summary": dict(measured)} for c in configs}
    suite = {
        "args": {
            "scale_k": 4,
            "block_size": 64,
            "max_model_len": 8192,
            "max_out": 8,
            "sessions": 3,
            "traces": str(traces),
        },
        "tier_bytes": 1 << 30,
        "runs": {"dense": {"quiet": {"0": runs}}},
    }
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(suite))
    report = validate([path], tmp_path, None)
    assert set(report["validation"]) == {"plain", "hint-free", "extension"}
    row = report["validation"]["plain"]
    assert row["measured_reuse"] == 0.5
    # Measured numbers set to the simulated ones hold; off by half, they do not.
    for config, r in report["validation"].items():
        runs[config]["summary"]["reuse_of_theoretical"] = r["simulated_reuse"]
        runs[config]["summary"]["ttft_mean_s"] = r["simulated_ttft_mean_s"]
    path.write_text(json.dumps(suite))
    assert validate([path], tmp_path, None)["passed"]
    for config in ("plain", "hint-free", "extension"):
        runs[config]["summary"]["ttft_mean_s"] *= 2
    path.write_text(json.dumps(suite))
    assert not validate([path], tmp_path, None)["passed"]


def test_a_shared_pool_serves_what_another_instance_computed() -> None:
    """Load-based routing moves sessions between instances; the pool (vLLM's
    manager, LRU) gives one instance the blocks another computed."""
    preset = _bed(device_blocks=30, tier_blocks=0)
    spec = RunSpec(preset=preset, instances=2, router="load", pool_bytes=4096 * (64 << 10))
    records, cluster = run(spec, "hint-free", _templates(preset, n=6, grow=64), True)
    assert cluster.pool is not None
    assert sum(e.bytes_loaded["pool"] for e in cluster.engines) > 0
    assert sum(e.bytes_stored["pool"] for e in cluster.engines) > 0
    assert all(e.tier is None for e in cluster.engines)  # no host tier at 0 bytes
    assert {r.session for r in records} == {f"t{i}" for i in range(6)}
