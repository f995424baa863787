"""The replay benchmark's summaries, table and JSON, on hand-made records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks._replay import RequestRecord
from benchmarks._report import ConfigRun, format_table, summarize, write_json
from benchmarks._server import MetricsSample


def _record(cached: int, theory: int, ttft: float, error: str | None = None) -> RequestRecord:
    return RequestRecord(
        trace_id="t", branch="root", seq=0, sent_at=0.0, prompt_tokens=1000, max_tokens=4,
        theoretical_cached=theory, cached_tokens=cached, ttft_s=ttft, error=error,
    )  # fmt: skip


def _run(name: str, records: list[RequestRecord], **after: float) -> ConfigRun:
    return ConfigRun(
        name=name, server_log="x.log", kv_blocks=256, wall_s=10.0, records=records,
        metrics_before={"vllm:num_preemptions_total": 1.0},
        metrics_after={"vllm:num_preemptions_total": 3.0, **after},
        samples=[MetricsSample(0.0, {"agent_hints_held_blocks": 4.0}),
                 MetricsSample(1.0, {"agent_hints_held_blocks": 8.0})],
    )  # fmt: skip


def test_summary_counts_reuse_against_the_theoretical_maximum() -> None:
    run = _run(
        "extension",
        [_record(600, 800, 0.1), _record(200, 800, 0.3), _record(0, 0, 9.0, error="HTTP 500")],
        agent_hints_holds_total=5.0,
        agent_hints_held_blocks=0.0,
    )
    s = summarize(run)
    assert (s["requests"], s["failed"]) == (3, 1)
    assert s["reuse_of_theoretical"] == pytest.approx(0.5)
    assert s["prefill_tokens"] == 1200
    assert s["ttft_mean_s"] == pytest.approx(0.2)
    assert s["preemptions"] == 2.0
    assert s["agent_hints"] == {"holds": 5.0}
    assert (s["held_blocks_mean"], s["held_blocks_max"]) == (6.0, 8.0)


def test_table_has_a_row_per_config_and_ratio_rows(tmp_path: Path) -> None:
    runs = [
        _run("plain", [_record(400, 800, 0.4)]),
        _run("extension", [_record(600, 800, 0.2)]),
        _run("unlimited", [_record(800, 800, 0.1)]),
    ]
    table = format_table([summarize(r) for r in runs])
    lines = table.splitlines()
    assert [line.split()[0] for line in lines[2:5]] == ["plain", "extension", "unlimited"]
    ratios = {line.split()[0] + line.split()[2]: line.split()[1:] for line in lines[7:]}
    assert set(ratios) == {"extensionplain", "extensionunlimited", "plainunlimited"}
    assert ratios["extensionplain"][2] == "1.50x"  # reuse
    assert ratios["extensionplain"][6] == "0.50x"  # mean TTFT
    out = tmp_path / "r.json"
    write_json(out, {"args": {}}, runs)
    data = json.loads(out.read_text())
    assert set(data["configs"]) == {"plain", "extension", "unlimited"}
    assert data["configs"]["plain"]["records"][0]["cached_tokens"] == 400
