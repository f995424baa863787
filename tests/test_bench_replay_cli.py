"""``python -m benchmarks.replay`` end to end: real servers, a real trace, the table,
the JSON and the plots (a short slice: 4 requests of one trace, plain and retention)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import misses
from benchmarks.replay import main

pytestmark = pytest.mark.server


def test_replay_prints_one_table_and_writes_the_json_and_plots(
    traces_dir: Path, test_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.json"
    argv = [
        "--traces", str(traces_dir), "--trace-ids", "trace_0100",
        "--max-requests-per-trace", "4", "--time-scale", "100", "--kv-blocks", "80",
        "--max-model-len", "4096", "--configs", "plain,retention",
        "--model", str(test_model_dir), "--out", str(out), "--startup-timeout", "240",
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rows = [
        w[0]
        for w in map(str.split, printed.splitlines())
        if w[:2] in (["plain", "4"], ["retention", "4"])
    ]
    # A running table after the first configuration, one final table after the last.
    assert rows == ["plain", "plain", "retention"]
    assert "retention / plain" in printed and f"wrote {out}" in printed
    run = json.loads(out.read_text())
    assert list(run["configs"]) == ["plain", "retention"]
    for config in run["configs"].values():
        summary = config["summary"]
        assert (summary["requests"], summary["failed"]) == (4, 0)
        assert [r["seq"] for r in config["records"]] == [0, 1, 2, 3]
        assert config["samples"], "gauges were sampled during the run"
    hinted = [r["hint"] for r in run["configs"]["retention"]["records"]]
    assert all(h and 'sid="trace_0100"' in h for h in hinted)
    assert all(r["hint"] is None for r in run["configs"]["plain"]["records"])
    assert (tmp_path / "run-ttft-cdf.png").stat().st_size > 0
    assert (tmp_path / "run-reuse-over-time.png").stat().st_size > 0
    # The saved run feeds the analyses.
    assert misses.main([str(out), "--traces", str(traces_dir), "--bound", "plain"]) == 0
    assert "TTFT by kind" in capsys.readouterr().out
