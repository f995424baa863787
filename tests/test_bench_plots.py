"""The replay benchmark's PNG plots, on hand-made runs (no server)."""

from __future__ import annotations

from pathlib import Path

from benchmarks._plots import write_plots
from benchmarks._replay import RequestRecord
from benchmarks._report import ConfigRun

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _record(
    seq: int, cached: int | None, ttft: float | None, error: str | None = None
) -> RequestRecord:
    return RequestRecord(
        trace_id="t", branch="root", seq=seq, sent_at=2.0 * seq, prompt_tokens=1000,
        max_tokens=4, theoretical_cached=100 * seq, cached_tokens=cached, ttft_s=ttft,
        latency_s=None if error else 0.5, error=error,
    )  # fmt: skip


def _run(name: str, records: list[RequestRecord]) -> ConfigRun:
    return ConfigRun(
        name=name, server_log="x.log", kv_blocks=64, wall_s=10.0, records=records,
        metrics_before={}, metrics_after={},
    )  # fmt: skip


def _assert_pngs(paths: list[Path], out: Path, stem: str) -> None:
    assert paths == [out / f"{stem}-ttft-cdf.png", out / f"{stem}-reuse-over-time.png"]
    for path in paths:
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC)
        assert len(data) > 5_000  # axes, lines and text, not an empty canvas


def test_writes_a_ttft_cdf_and_reuse_over_time_per_config(tmp_path: Path) -> None:
    runs = [
        _run("plain", [_record(i, 50 * i, 0.05 * (i + 1)) for i in range(8)]),
        _run("retention", [_record(i, 90 * i, 0.02 * (i + 1)) for i in range(8)]),
    ]
    out = tmp_path / "plots"
    _assert_pngs(write_plots(runs, out, "replay"), out, "replay")


def test_a_run_without_usable_records_gets_no_line(tmp_path: Path) -> None:
    runs = [
        _run("broken", [_record(i, None, None, error="HTTP 500") for i in range(3)]),
        _run("plain", [_record(i, 10 * i, 0.1) for i in range(3)]),
    ]
    _assert_pngs(write_plots(runs, tmp_path, "r"), tmp_path, "r")
    only_failed = [_run("broken", [_record(0, None, None, error="timeout")])]
    _assert_pngs(write_plots(only_failed, tmp_path, "f"), tmp_path, "f")
    _assert_pngs(write_plots([], tmp_path, "e"), tmp_path, "e")
