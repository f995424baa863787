"""Each run's ceiling (LRU and Belady in its send order, at the device's KV and with
the tier's), the bytes of a KV block behind the tier's blocks, and the hint-free
baseline's server: what it starts and with how many bytes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks import _server
from benchmarks._ceiling import (
    ceiling,
    format_ceilings,
    kv_block_bytes,
    median_ceiling,
    tier_blocks,
)
from benchmarks._server import CONFIGS, ServerPlan, extension_tier_bytes, serve
from benchmarks._suite import SUITE_CONFIGS
from server_ext.tier import TierConfig

# Three one-block prefixes (and a computed tail token) in a cycle.
A, B, C = ([i] * 4 + [99] for i in (1, 2, 3))
CYCLE = [A, B, C] * 3
THEORY = 6 * 4  # every prompt after the first three could hit its block


def test_a_kv_block_of_the_generated_test_model(test_model_dir: Path) -> None:
    config = json.loads((test_model_dir / "config.json").read_text())
    layers, kv_heads = config["num_hidden_layers"], config["num_key_value_heads"]
    assert (layers, kv_heads, config["head_dim"], config["torch_dtype"]) == (2, 4, 64, "float32")
    # K and V x 2 layers x 4 KV heads x 64 dims x 2 bytes (vLLM's --dtype auto serves a
    # float32 checkpoint in bfloat16, its KV too) x 64 tokens.
    assert kv_block_bytes(test_model_dir, 64) == 2 * 2 * 4 * 64 * 2 * 64 == 131_072
    assert kv_block_bytes(test_model_dir, 16) == 131_072 // 4
    # The extension's default tier, 1 GiB, holds 8,192 of its 64-token blocks.
    assert tier_blocks(test_model_dir, 1 << 30, 64) == 8192


def test_a_kv_block_counts_kv_heads_head_dim_and_the_checkpoint_dtype(tmp_path: Path) -> None:
    def block(**config: object) -> int:
        (tmp_path / "config.json").write_text(json.dumps(config))
        return kv_block_bytes(tmp_path, 16)

    gqa = {"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4}
    # head_dim from hidden_size / heads; bfloat16: 2 bytes.
    assert block(**gqa, hidden_size=3584, torch_dtype="bfloat16") == 2 * 28 * 4 * 128 * 2 * 16
    # No KV-head count: every attention head has its own K and V.
    assert block(num_hidden_layers=2, num_attention_heads=8, hidden_size=512) == (
        2 * 2 * 8 * 64 * 2 * 16
    )
    assert block(**gqa, head_dim=64, hidden_size=1, dtype="float16") == 2 * 28 * 4 * 64 * 2 * 16
    with pytest.raises(ValueError, match="int4"):
        block(**gqa, head_dim=64, torch_dtype="int4")


def test_no_tier_blocks_for_a_model_that_is_no_directory(tmp_path: Path) -> None:
    assert tier_blocks("Qwen/Qwen2.5-7B-Instruct", 1 << 30, 64) is None
    assert tier_blocks(tmp_path, 1 << 30, 64) is None


def test_the_ceiling_of_a_run_at_the_device_and_with_the_tier() -> None:
    found = ceiling(CYCLE, THEORY, block_size=4, device_blocks=2, tier_blocks=1, tiered=True)
    # Room for two of three: LRU always evicts the one needed next, Belady keeps two;
    # with the tier's block added everything stays.
    assert found == {
        "device": {"blocks": 2, "lru": 0.0, "belady": pytest.approx(16 / 24)},
        "tiered": {"blocks": 3, "lru": 1.0, "belady": 1.0},
        "served": "tiered",
    }
    plain = ceiling(CYCLE, THEORY, block_size=4, device_blocks=2, tier_blocks=1, tiered=False)
    assert plain["served"] == "device" and plain["tiered"] == found["tiered"]
    unknown = ceiling(CYCLE, THEORY, block_size=4, device_blocks=2, tier_blocks=None, tiered=True)
    assert unknown["tiered"] is None and unknown["served"] == "device"
    assert ceiling([A], 0, 4, 2, 1, tiered=False)["device"]["lru"] is None


def test_the_median_ceiling_of_repeats() -> None:
    runs = [ceiling(CYCLE[:n], THEORY, 4, 2, 1, tiered=True) for n in (9, 6, 3)]
    merged = median_ceiling(runs)
    assert merged is not None and merged["served"] == "tiered"
    assert merged["device"] == {"blocks": 2, "lru": 0.0, "belady": pytest.approx(8 / 24)}
    assert merged["tiered"]["lru"] == pytest.approx(3 * 4 / 24)
    assert median_ceiling([]) is None


def test_the_ceiling_lines_show_each_run_against_belady_at_the_capacity_it_had() -> None:
    summaries = [
        {"config": "plain", "reuse_of_theoretical": 0.5,
         "ceiling": ceiling(CYCLE, THEORY, 4, 2, 1, tiered=False)},
        {"config": "hint-free", "reuse_of_theoretical": 0.5,
         "ceiling": ceiling(CYCLE, THEORY, 4, 2, 1, tiered=True)},
        {"config": "other", "reuse_of_theoretical": 0.5, "ceiling": None},
    ]  # fmt: skip
    lines = format_ceilings(summaries)
    assert "Belady: exact future knowledge" in lines[0]
    rows = {line.split()[0]: line.split()[1:] for line in lines[3:]}
    assert list(rows) == ["plain", "hint-free"]
    # reuse, device LRU, Belady, +tier LRU, Belady, of Belady, blocks
    assert rows["plain"] == ["50.0%", "0.0%", "66.7%", "100.0%", "100.0%", "75.0%", "2,", "3"]
    assert rows["hint-free"][5] == "50.0%"  # against the tiered Belady: it had the tier
    assert format_ceilings(summaries[2:]) == []


def test_hint_free_is_plain_vllm_with_vllms_offloading_at_the_tiers_bytes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def fake_server(model: str, **kwargs: Any) -> Iterator[object]:
        started.append(kwargs)
        yield object()

    monkeypatch.setattr(_server, "local_server", fake_server)
    hint_free = CONFIGS["hint-free"]
    assert hint_free.hint_free and not hint_free.extension and not hint_free.hints
    assert SUITE_CONFIGS["hint-free"] is hint_free
    plan = ServerPlan(model="m", kv_blocks=64, unlimited_blocks=512, tier_bytes=123 << 20)
    for name in ("plain", "hint-free", "host"):
        with serve(plan, CONFIGS[name], tmp_path):
            pass
    with serve(plan, SUITE_CONFIGS["extension"], tmp_path):
        pass
    plain, offloading, host, default = started
    assert plain["offload_bytes"] is None and plain["extra_config"] is None
    assert (offloading["extension"], offloading["offload_bytes"]) == (False, 123 << 20)
    assert offloading["extra_config"] is None and offloading["kv_blocks"] == 64
    # The extension's tier, its default one included, gets the very same bytes.
    assert host["extra_config"]["tier_bytes"] == 123 << 20 and host["offload_bytes"] is None
    assert default["extra_config"]["tier_bytes"] == 123 << 20
    assert "tier" not in default["extra_config"]  # still the extension's default tier


def test_the_plan_knows_which_runs_had_a_tier() -> None:
    plan = ServerPlan(model="m", kv_blocks=64, unlimited_blocks=512)
    tiers = {name: plan.tier_of(config) for name, config in CONFIGS.items()}
    assert tiers == {
        "plain": None, "hint-free": "host", "retention": None, "prefetch": None,
        "host": "host", "mooncake": "mooncake", "unlimited": None,
    }  # fmt: skip
    assert plan.tier_of(SUITE_CONFIGS["extension"]) == "host"
    no_tier = ServerPlan(
        model="m", kv_blocks=64, unlimited_blocks=512, extra_config={"tier": "none"}
    )
    assert no_tier.tier_of(SUITE_CONFIGS["extension"]) is None
    assert "tier_bytes" not in no_tier.extra_config_of(SUITE_CONFIGS["extension"], None)


def test_the_plans_tier_is_the_extensions_own_unless_told() -> None:
    default = TierConfig.from_mapping({})
    assert default is not None and extension_tier_bytes() == default.budget_bytes
    assert ServerPlan(model="m", kv_blocks=1, unlimited_blocks=1).tier_bytes == default.budget_bytes
    assert extension_tier_bytes({"tier_bytes": 5 << 20, "tier": "none"}) == 5 << 20


def test_a_plans_ceiling_uses_the_served_models_blocks(test_model_dir: Path) -> None:
    plan = ServerPlan(
        model=str(test_model_dir), kv_blocks=2, unlimited_blocks=100, block_size=4,
        tier_bytes=kv_block_bytes(test_model_dir, 4) + 1,
    )  # fmt: skip
    found = plan.ceiling_of(CONFIGS["hint-free"], CYCLE, THEORY)
    assert (found["device"]["blocks"], found["tiered"]["blocks"], found["served"]) == (
        2, 3, "tiered",
    )  # fmt: skip
    assert plan.ceiling_of(CONFIGS["unlimited"], CYCLE, THEORY)["device"]["blocks"] == 100
    assert plan.ceiling_of(CONFIGS["plain"], CYCLE, THEORY)["served"] == "device"
