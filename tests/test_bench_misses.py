"""Where a run's lost reuse and TTFT go (``benchmarks.misses``), on hand-made runs."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from benchmarks._replay import RequestRecord
from benchmarks._report import ConfigRun, write_json
from benchmarks._server import MetricsSample
from benchmarks._traces import run_requests, select_traces
from benchmarks.misses import KindTTFT, by_wait, kinds, main, ttft_by_kind


def _rec(
    branch: str, seq: int, sent: float, done: float, theory: int, cached: int,
    ttft: float = 0.1, trace_id: str = "t",
) -> RequestRecord:  # fmt: skip
    return RequestRecord(
        trace_id=trace_id, branch=branch, seq=seq, sent_at=sent, prompt_tokens=theory + 64,
        max_tokens=4, theoretical_cached=theory, cached_tokens=cached, ttft_s=ttft,
        latency_s=done - sent,
    )  # fmt: skip


# Branch a: back 0.5 s after its first response (hit), then 20 s after an ended
# turn (missed 640 tokens). Branch b: first request, then back 3 s later having
# lost one block only (a hit: at most one block recomputed).
RUN = [
    _rec("a", 0, 0.0, 1.0, 0, 0, ttft=2.0),
    _rec("b", 0, 0.0, 2.0, 0, 0, ttft=3.0),
    _rec("a", 1, 1.5, 2.0, 640, 640),
    _rec("b", 1, 5.0, 6.0, 640, 576),
    _rec("a", 2, 22.0, 23.0, 704, 64, ttft=4.0),
]


def test_returns_are_binned_by_the_wait_before_them() -> None:
    ended = {("t", "a", 1): True}  # the response before a's third request ended a turn
    bins = {(b.low_s, b.high_s): b for b in by_wait(RUN, 64, ended)}
    assert sum(b.returns for b in bins.values()) == 3
    short, mid, long = bins[(0.0, 1.0)], bins[(2.0, 4.0)], bins[(16.0, float("inf"))]
    assert (short.returns, short.missed_returns, short.missed_tokens) == (1, 0, 0)
    assert (mid.returns, mid.missed_returns, mid.missed_tokens) == (1, 0, 64)
    assert (long.returns, long.missed_returns, long.missed_tokens) == (1, 1, 640)
    assert long.after_ended_turn == 1 and short.after_ended_turn == 0
    assert long.missed_after_idle == 0  # no gauge samples: nothing known


def test_a_missed_return_after_an_idle_engine_is_counted() -> None:
    def sample(t: float, running: float, waiting: float) -> MetricsSample:
        values = {"vllm:num_requests_running": running, "vllm:num_requests_waiting": waiting}
        return MetricsSample(t, values)

    busy = [sample(t, 1.0, 0.0) for t in range(25)] + [sample(10.5, 0.0, 2.0)]
    [long] = [b for b in by_wait(RUN, 64, {}, busy) if b.missed_returns]
    assert long.missed_after_idle == 0  # queued work is not idle
    idle_before = [sample(1.8, 0.0, 0.0), sample(22.5, 0.0, 0.0)]  # outside a's wait
    [long] = [b for b in by_wait(RUN, 64, {}, busy + idle_before) if b.missed_returns]
    assert long.missed_after_idle == 0
    [long] = [b for b in by_wait(RUN, 64, {}, [*busy, sample(12.0, 0.0, 0.0)]) if b.missed_returns]
    assert long.missed_after_idle == 1


def test_ttft_by_kind_against_the_same_requests_in_the_bound() -> None:
    assert kinds(RUN, 64) == {
        ("t", "a", 0): "first", ("t", "b", 0): "first",
        ("t", "a", 1): "hit", ("t", "b", 1): "hit", ("t", "a", 2): "miss",
    }  # fmt: skip
    bound = [_rec(r.branch, r.seq, r.sent_at, r.sent_at + 1, 0, 0, ttft=0.5) for r in RUN]
    bound[3] = _rec("b", 1, 5.0, 6.0, 0, 0, ttft=0.05)  # b's hit: 0.05 s later in the run
    sums = ttft_by_kind(RUN, bound[:-1], 64)  # a's miss has no TTFT in the bound: left out
    first, hit, miss = (sums[k] for k in ("first", "hit", "miss"))
    assert (first.requests, first.late) == (2, 2)  # 2.0 and 3.0 s against 0.5 s
    assert (first.sum_s, first.bound_sum_s) == pytest.approx((5.0, 1.0))
    assert (hit.requests, hit.late) == (2, 0)  # faster than the bound, or 0.05 s slower
    assert (hit.sum_s, hit.bound_sum_s) == pytest.approx((0.2, 0.55))
    assert miss == KindTTFT()
    assert ttft_by_kind(RUN, bound, 64)["miss"] == KindTTFT(1, 4.0, 0.5, late=1)


def test_cli_reads_a_saved_run_and_its_traces(
    traces_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = {"traces": str(traces_dir), "trace_ids": None, "n_traces": 1, "scale_k": 4,
            "max_model_len": 8192, "max_out": 32, "kv_blocks": 64, "block_size": 64}  # fmt: skip
    [trace] = select_traces(traces_dir, 4, 8192 - 32, n_traces=1)
    seq: defaultdict[str, int] = defaultdict(int)
    records = []
    for i, (branch, _) in enumerate(trace.ordered()):
        n = seq[branch]
        records.append(_rec(branch, n, 10.0 * i, 10.0 * i + 1, 640, 0, trace_id=trace.trace_id))
        seq[branch] += 1
    assert set(run_requests(args, traces_dir)) == {(r.trace_id, r.branch, r.seq) for r in records}

    def run(name: str) -> ConfigRun:
        return ConfigRun(name, "x.log", 64, 1.0, records, {}, {})

    path = tmp_path / "run.json"
    write_json(path, {"args": args}, [run("retention"), run("unlimited")])
    assert main([str(path), "--configs", "retention"]) == 0
    out = capsys.readouterr().out
    returns = len(records) - len(seq)
    assert f"{640 * len(records):,} of {640 * len(records):,} tokens" in out
    assert out.count("\n  8-16 s") == 1 and "TTFT by kind" in out and "late > 0.1 s" in out
    long_row = next(line for line in out.splitlines() if line.strip().startswith(">= 16 s"))
    assert long_row.split()[3:5] == ["0", "0"]  # every wait was 9 s
    mid_row = next(line for line in out.splitlines() if line.strip().startswith("8-16 s"))
    assert mid_row.split()[2:4] == [str(returns), str(returns)]
    with pytest.raises(SystemExit, match="no configuration nope"):
        main([str(path), "--configs", "nope"])
