"""The replay benchmark's summaries, table and JSON, on hand-made records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import report
from benchmarks._replay import RequestRecord, hint_header
from benchmarks._report import (
    ConfigRun,
    format_table,
    ratios,
    read_json,
    summarize,
    write_json,
)
from benchmarks._server import MetricsSample
from benchmarks._spread import Spread, format_spread, spread_json, spreads


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
        **{"vllm:request_prefill_kv_computed_tokens_sum": 1300.0},
    )
    s = summarize(run)
    assert (s["requests"], s["failed"]) == (3, 1)
    assert s["reuse_of_theoretical"] == pytest.approx(0.5)
    assert s["prefill_tokens"] == 1200
    assert s["server_prefill_tokens"] == 1300.0  # warm-ups included
    assert s["ttft_mean_s"] == pytest.approx(0.2)
    assert s["preemptions"] == 2.0
    assert (s["warmup_preemptions"], s["real_preemptions"]) == (0.0, 2.0)
    assert s["agent_hints"] == {"holds": 5.0}
    assert (s["held_blocks_mean"], s["held_blocks_max"]) == (6.0, 8.0)


def test_preempted_warm_ups_are_told_apart_from_preempted_requests() -> None:
    run = _run("prefetch", [_record(600, 800, 0.1)], agent_hints_warmup_preemptions_total=1.0)
    s = summarize(run)
    assert (s["preemptions"], s["warmup_preemptions"], s["real_preemptions"]) == (2.0, 1.0, 1.0)
    row = format_table([s]).splitlines()[2]
    assert "warm-ups preempted 1" in row


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


def _timed(
    trace: str, branch: str, seq: int, sent_at: float, latency: float | None, gap: float | None
) -> RequestRecord:
    hint = None if gap is None else hint_header(trace, branch, None, gap, end=False)
    return RequestRecord(
        trace_id=trace, branch=branch, seq=seq, sent_at=sent_at, prompt_tokens=100,
        max_tokens=4, theoretical_cached=0, hint=hint, cached_tokens=0, latency_s=latency,
    )  # fmt: skip


def test_calibration_compares_each_hinted_gap_with_the_next_request_of_its_branch() -> None:
    records = [  # issue order
        _timed("t", "root", 0, 0.0, 1.0, 2.0),  # next root at 4.0: 3 s, within 2x
        _timed("u", "root", 0, 0.5, None, 1.0),  # failed before its latency was known
        _timed("t", "a1", 0, 1.0, 0.2, 0.5),  # next a1 at 3.2: 2 s, 4x
        _timed("t", "a1", 1, 3.2, 0.3, 0.5),  # the branch's last request: no pair
        _timed("t", "root", 1, 4.0, 0.5, 1.0),  # next root at once: 0 s (floored), ~100x
        _timed("t", "root", 2, 4.5, 0.5, 1.0),
        _timed("t", "a1", 0, 5.0, 0.2, 1.0),  # a second fork reusing the agent id
        _timed("u", "root", 1, 5.0, 1.0, None),  # no hint
        _timed("u", "root", 2, 7.0, 1.0, 1.0),
    ]
    c = summarize(_run("retention", records))["calibration"]
    assert c["pairs"] == 3
    assert (c["predicted_median_s"], c["actual_median_s"]) == (1.0, 2.0)
    assert c["median_abs_log2_error"] == pytest.approx(2.0)  # of 0.58, 2 and 6.6
    assert c["within_2x"] == pytest.approx(1 / 3)
    assert summarize(_run("plain", [_record(1, 1, 0.1), _record(1, 1, 0.1)]))["calibration"] is None


def test_server_calibration_comes_from_the_extension_counters() -> None:
    run = _run(
        "retention",
        [_record(1, 1, 0.1)],
        agent_hints_predicted_returns_total=4.0,
        agent_hints_return_log2_error_sum=2.0,
        agent_hints_returns_within_2x_total=3.0,
    )
    c = summarize(run)["server_calibration"]
    assert c == {"returns": 4, "mean_abs_log2_error": 0.5, "within_2x": 0.75}
    assert summarize(_run("plain", [_record(1, 1, 0.1)]))["server_calibration"] is None


def test_tier_bytes_and_prefetches_are_deltas_of_their_counters() -> None:
    tiered = _run(
        "host",
        [_record(600, 800, 0.1)],
        agent_hints_tier_moved_bytes_total=3_500_000.0,
        agent_hints_prefetch_total=7.0,
        **{
            'agent_hints_prefetch_total{result="issued"}': 4.0,
            'agent_hints_prefetch_total{result="cancelled"}': 3.0,
            'agent_hints_prefetch_created{result="issued"}': 1e9,
        },
    )
    tiered.metrics_before["agent_hints_tier_moved_bytes_total"] = 500_000.0
    tiered.metrics_before['agent_hints_prefetch_total{result="issued"}'] = 1.0
    s = summarize(tiered)
    assert s["tier_bytes_moved"] == 3_000_000.0
    assert s["prefetch"] == {"issued": 3.0, "cancelled": 3.0}
    plain = summarize(_run("plain", [_record(400, 800, 0.4)]))
    assert (plain["tier_bytes_moved"], plain["prefetch"]) == (0.0, None)
    lines = format_table([plain, s]).splitlines()
    column = lines[0].index("tier MB") + len("tier MB")
    assert [line[column - 5 : column].strip() for line in lines[2:4]] == ["-", "3.0"]


def test_a_matrix_of_configs_gets_ratios_against_both_baselines() -> None:
    names = ["plain", "retention", "prefetch", "host", "mooncake", "unlimited"]
    table = format_table([summarize(_run(n, [_record(400, 800, 0.4)])) for n in names])
    ratios = [line.split()[:3] for line in table.splitlines()[len(names) + 4 :]]
    assert [f"{a} {b} {c}" for a, b, c in ratios] == [
        *(f"{n} / plain" for n in names[1:-1]),
        *(f"{n} / unlimited" for n in names[:-1]),
    ]


def test_saved_runs_read_back_to_the_same_summaries(tmp_path: Path) -> None:
    runs = [
        _run("plain", [_record(400, 800, 0.4)]),
        _run("retention", [_record(600, 800, 0.2)], agent_hints_holds_total=3.0),
    ]
    write_json(tmp_path / "a.json", {"benchmark": "replay"}, runs)
    header, back = read_json(tmp_path / "a.json")
    assert header == {"benchmark": "replay"}
    for before, after in zip(runs, back, strict=True):
        expected, actual = summarize(before), summarize(after)
        for key in ("reuse_of_theoretical", "ttft_mean_s", "preemptions", "agent_hints"):
            assert actual.get(key) == expected.get(key)


def test_the_report_command_merges_files_later_ones_winning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = [_run("plain", [_record(400, 800, 0.4)]), _run("unlimited", [_record(0, 800, 9.0)])]
    write_json(tmp_path / "a.json", {"benchmark": "replay"}, first)
    write_json(
        tmp_path / "b.json", {"benchmark": "replay"}, [_run("unlimited", [_record(800, 800, 0.1)])]
    )
    out = tmp_path / "m.json"
    assert report.main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert list(merged["configs"]) == ["plain", "unlimited"]
    assert merged["configs"]["unlimited"]["summary"]["reuse_of_theoretical"] == 1.0
    assert len(merged["merged_from"]) == 2
    assert (tmp_path / "m-ttft-cdf.png").is_file()
    assert "plain / unlimited" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no such file"):
        report.main([str(tmp_path / "missing.json"), "--out", str(out)])


def test_the_report_command_takes_named_configurations_of_a_file(tmp_path: Path) -> None:
    write_json(
        tmp_path / "a.json",
        {"benchmark": "replay"},
        [_run("plain", [_record(400, 800, 0.4)]), _run("host", [_record(500, 800, 0.3)])],
    )
    write_json(
        tmp_path / "b.json",
        {"benchmark": "replay"},
        [_run("plain", [_record(0, 800, 9.0)]), _run("host", [_record(800, 800, 0.1)])],
    )
    out = tmp_path / "m.json"
    argv = [str(tmp_path / "a.json"), f"{tmp_path / 'b.json'}:host", "--out", str(out)]
    assert report.main(argv) == 0
    merged = json.loads(out.read_text())
    assert merged["configs"]["plain"]["summary"]["reuse_of_theoretical"] == 0.5  # a's, kept
    assert merged["configs"]["host"]["summary"]["reuse_of_theoretical"] == 1.0  # b's
    assert merged["merged_from"][1].endswith("b.json:host")
    with pytest.raises(SystemExit, match="no configuration mooncake"):
        report.main([f"{tmp_path / 'b.json'}:mooncake", "--out", str(out)])


def test_the_spread_of_repeated_runs_is_taken_over_each_runs_ratios() -> None:
    runs = [  # plain's TTFT moves 4x between runs; retention stays at half of it
        [summarize(_run("plain", [_record(400, 800, t)])),
         summarize(_run("retention", [_record(r, 800, t / 2)]))]
        for t, r in ((0.4, 600), (1.6, 640), (0.8, 700))
    ]  # fmt: skip
    absolute, relative = spreads(runs)
    assert absolute["plain"]["ttft_mean_s"] == Spread(0.8, 0.4, 1.6, 3)
    assert absolute["retention"]["reuse_of_theoretical"] == Spread(0.8, 0.75, 0.875, 3)
    mean = relative["retention / plain"]["ttft_mean_s"]
    assert mean is not None and (mean.low, mean.high, mean.n) == (0.5, 0.5, 3)
    reuse = relative["retention / plain"]["reuse_of_theoretical"]
    assert reuse is not None and reuse.median == pytest.approx(1.6)
    lines = format_spread(runs).splitlines()
    assert lines[0] == "3 runs: median (lowest-highest)"
    row = next(line for line in lines if line.startswith("retention / plain"))
    assert row.split()[3:5] == ["3", "1.60x"] and row.endswith("0.50x (0.50-0.50)")


def test_a_configuration_missing_from_some_runs_counts_only_where_it_ran() -> None:
    runs = [
        [summarize(_run("plain", [_record(400, 800, 0.4)]))],
        [summarize(_run("plain", [_record(400, 800, 0.2)])),
         summarize(_run("host", [_record(800, 800, 0.1)]))],
    ]  # fmt: skip
    absolute, relative = spreads(runs)
    assert list(absolute) == ["plain", "host"]
    assert absolute["host"]["ttft_mean_s"] == Spread(0.1, 0.1, 0.1, 1)
    host = relative["host / plain"]["ttft_mean_s"]
    assert host is not None and host.median == pytest.approx(0.5) and host.n == 1


def test_the_report_command_prints_and_writes_the_spread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i, t in enumerate((0.4, 0.8)):
        runs = [_run("plain", [_record(400, 800, t)]), _run("unlimited", [_record(800, 800, 0.1)])]
        write_json(tmp_path / f"r{i}.json", {"benchmark": "replay"}, runs)
    inputs = [str(tmp_path / "r0.json"), str(tmp_path / "r1.json")]
    assert report.main(["--spread", *inputs]) == 0
    assert "plain / unlimited" in capsys.readouterr().out
    out = tmp_path / "spread.json"
    assert report.main(["--spread", *inputs, "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["runs"] == 2 and written["spread_of"] == inputs
    assert written["ratios"]["plain / unlimited"]["ttft_mean_s"]["high"] == pytest.approx(8.0)
    with pytest.raises(SystemExit, match="--out is required"):
        report.main(inputs)


def test_calibration_leaves_out_waits_on_the_user() -> None:
    # The gap a request hints is for tool calls; after a response that ended the
    # turn the wait is on the user, hinted apart (tool_start user with its eta).
    first = _timed("t", "root", 0, 0.0, 1.0, 2.0)
    first.ends_turn = True
    records = [first, _timed("t", "root", 1, 60.0, 1.0, 2.0)]
    assert summarize(_run("retention", records))["calibration"] is None


def test_the_engine_prefill_ratio_counts_prefetch_warm_ups() -> None:
    engine = "vllm:request_prefill_kv_computed_tokens_sum"
    plain = summarize(_run("plain", [_record(400, 800, 0.4)], **{engine: 600.0}))
    prefetch = summarize(_run("prefetch", [_record(700, 800, 0.4)], **{engine: 900.0}))
    row = ratios([plain, prefetch])["prefetch / plain"]
    assert (row["prefill_tokens"], row["server_prefill_tokens"]) == (0.5, 1.5)
    assert "engine" in format_table([plain, prefetch])


def test_the_hint_free_baseline_divides_the_configurations_that_read_hints() -> None:
    names = ["plain", "hint-free", "extension", "plain-again", "unlimited"]
    summaries = [summarize(_run(n, [_record(400, 800, 0.4)])) for n in names]
    summaries[2] = summarize(_run("extension", [_record(600, 800, 0.2)]))
    found = ratios(summaries)
    assert list(found) == [
        "hint-free / plain", "extension / plain", "plain-again / plain",
        "extension / hint-free",
        *(f"{n} / unlimited" for n in names[:-1]),
    ]  # fmt: skip
    assert found["extension / hint-free"]["reuse_of_theoretical"] == pytest.approx(1.5)
    assert found["extension / hint-free"]["ttft_mean_s"] == pytest.approx(0.5)
    assert "extension / hint-free" in format_table(summaries)
    assert "hinted / hint-free" in ratios([summarize(_run(n, [])) for n in ("hint-free", "hinted")])


def _ceiling(lru: float, belady: float, served: str = "device") -> dict[str, Any]:
    return {
        "device": {"blocks": 256, "lru": lru, "belady": belady},
        "tiered": {"blocks": 8448, "lru": 1.0, "belady": 1.0},
        "served": served,
    }


def test_each_runs_ceiling_is_in_its_summary_table_and_json(tmp_path: Path) -> None:
    runs = [_run("plain", [_record(400, 800, 0.4)]), _run("hint-free", [_record(600, 800, 0.3)])]
    runs[0].ceiling = _ceiling(0.45, 0.7)
    runs[1].ceiling = _ceiling(0.45, 0.7, "tiered")
    summaries = [summarize(r) for r in runs]
    assert summaries[0]["ceiling"]["device"] == {"blocks": 256, "lru": 0.45, "belady": 0.7}
    lines = format_table(summaries).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("ceiling"))
    assert "send order" in lines[at - 1]
    plain, hint_free = (lines[at + 2 + i].split() for i in range(2))
    assert plain[:7] == ["plain", "50.0%", "45.0%", "70.0%", "100.0%", "100.0%", "71.4%"]
    assert hint_free[6] == "75.0%"  # of the tiered Belady: it ran with the tier
    write_json(tmp_path / "r.json", {}, runs)
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["configs"]["hint-free"]["summary"]["ceiling"]["tiered"]["belady"] == 1.0
    _, back = read_json(tmp_path / "r.json")
    assert [r.ceiling for r in back] == [r.ceiling for r in runs]
    assert "ceiling" not in format_table([summarize(_run("plain", [_record(1, 2, 0.1)]))])


def test_the_spread_shows_the_median_ceiling_of_each_configuration() -> None:
    runs = []
    for lru in (0.2, 0.4, 0.3):
        run = _run("plain", [_record(400, 800, 0.4)])
        run.ceiling = _ceiling(lru, 0.8)
        runs.append([summarize(run), summarize(_run("unlimited", [_record(800, 800, 0.1)]))])
    lines = format_spread(runs).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("ceiling"))
    assert lines[at - 1].endswith(": medians over the runs")
    assert lines[at + 2].split()[:4] == ["plain", "50.0%", "30.0%", "80.0%"]
    assert len(lines) == at + 3  # unlimited had none
    assert spread_json(runs)["ceilings"] == {"plain": _ceiling(0.3, 0.8)}
