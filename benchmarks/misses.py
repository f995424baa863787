"""``python -m benchmarks.misses``: where a saved run's lost reuse and TTFT go.

Every request of a run (the JSON of ``benchmarks.replay``) is a branch's first,
a hit (at most one block of the prefix an earlier prompt held was recomputed)
or a miss. Per configuration it prints

- the missed tokens by how long the branch was away before each return (its
  previous response's end to this request), how many of those waits followed
  an ended turn (a wait on the user, read from the traces), and before how
  many missed returns the engine idled at all (a gauge sample with no request
  running or waiting: a warm-up could have run);
- the TTFT summed by kind of request, beside the same requests' TTFT in a
  bound configuration of the run (``--bound``, default ``unlimited``), and how
  many were late (over ``LATE_S`` slower than there: a hit that waited behind a
  warm-up's or a miss's prefill shows up here).

Long waits that nothing foretold show up as misses that no eviction policy
can avoid; a kind whose TTFT far exceeds the bound's says where the mean goes::

    python -m benchmarks.misses results/matrix.json --configs retention,prefetch
"""

from __future__ import annotations

import argparse
import bisect
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ._replay import RequestRecord
from ._report import ConfigRun, read_json, returns
from ._server import MetricsSample
from ._traces import RequestKey, default_traces_dir, run_requests

REPO_ROOT = Path(__file__).resolve().parents[1]

WAIT_EDGES_S = (1.0, 2.0, 4.0, 8.0, 16.0)
"""Upper edges of the wait bins (scaled seconds); the last bin is open."""

_RUNNING, _WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"

Kind = Literal["first", "hit", "miss"]
KINDS: tuple[Kind, ...] = ("first", "hit", "miss")


def missed(record: RequestRecord) -> int:
    """Tokens an earlier prompt held that the server recomputed."""
    return max(record.theoretical_cached - (record.cached_tokens or 0), 0)


def is_miss(record: RequestRecord, block_size: int) -> bool:
    """More than one block of what an earlier prompt held was recomputed."""
    return missed(record) > block_size


@dataclass(slots=True)
class WaitBin:
    """Returns after waits in ``[low_s, high_s)``."""

    low_s: float
    high_s: float
    returns: int = 0
    missed_returns: int = 0
    missed_tokens: int = 0
    after_ended_turn: int = 0
    missed_after_idle: int = 0


def by_wait(
    records: Iterable[RequestRecord],
    block_size: int,
    ends_turn: Mapping[RequestKey, bool],
    samples: Sequence[MetricsSample] = (),
    edges: Sequence[float] = WAIT_EDGES_S,
) -> list[WaitBin]:
    """Completed returns binned by the wait before them (a miss: ``is_miss``);
    one followed an ended turn when its branch's previous request did
    (``ends_turn``, by record key; absent = no); the engine idled during the
    wait when one of ``samples`` in it shows no request running or waiting."""
    idle = sorted(s.t for s in samples if not s.values.get(_RUNNING) and not s.values.get(_WAITING))
    lows = (0.0, *edges)
    bins = [WaitBin(low, high) for low, high in zip(lows, (*edges, float("inf")), strict=True)]
    for previous, record, wait_s in returns(r for r in records if r.error is None):
        b = bins[sum(wait_s >= edge for edge in edges)]
        lost = is_miss(record, block_size)
        b.returns += 1
        b.missed_returns += lost
        b.missed_tokens += missed(record)
        b.after_ended_turn += ends_turn.get(_key(previous), False)
        i = bisect.bisect_left(idle, record.sent_at - wait_s)
        b.missed_after_idle += lost and i < len(idle) and idle[i] < record.sent_at
    return bins


def kinds(records: Iterable[RequestRecord], block_size: int) -> dict[RequestKey, Kind]:
    """Each completed request's kind: a branch's first request, or a return
    that hit or missed (``is_miss``)."""
    done = [r for r in records if r.error is None]
    found: dict[RequestKey, Kind] = {_key(r): "first" for r in done}
    for _, record, _ in returns(done):
        found[_key(record)] = "miss" if is_miss(record, block_size) else "hit"
    return found


LATE_S = 0.1
"""A request is late when its TTFT exceeds the same request's in the bound by more."""


@dataclass(slots=True)
class KindTTFT:
    """The TTFT of one kind of request, beside the same requests in the bound."""

    requests: int = 0
    sum_s: float = 0.0
    bound_sum_s: float = 0.0
    late: int = 0
    """Requests whose TTFT exceeds the bound's by more than ``LATE_S``: those that
    waited behind another prefill (or their own recompute)."""

    def add(self, ttft_s: float, bound_ttft_s: float) -> None:
        self.requests += 1
        self.sum_s += ttft_s
        self.bound_sum_s += bound_ttft_s
        self.late += ttft_s - bound_ttft_s > LATE_S

    def __add__(self, other: KindTTFT) -> KindTTFT:
        return KindTTFT(
            self.requests + other.requests,
            self.sum_s + other.sum_s,
            self.bound_sum_s + other.bound_sum_s,
            self.late + other.late,
        )


def ttft_by_kind(
    run: Sequence[RequestRecord], bound: Sequence[RequestRecord], block_size: int
) -> dict[Kind, KindTTFT]:
    """The TTFT of ``run``'s requests per kind, beside the same requests in
    ``bound``; requests without a TTFT in either are left out."""
    bound_ttft = {_key(r): r.ttft_s for r in bound if r.ttft_s is not None}
    ttft = {_key(r): r.ttft_s for r in run if r.ttft_s is not None}
    sums = {k: KindTTFT() for k in KINDS}
    for key, kind in kinds(run, block_size).items():
        if key in ttft and key in bound_ttft:
            sums[kind].add(ttft[key], bound_ttft[key])
    return sums


def _key(record: RequestRecord) -> RequestKey:
    return (record.trace_id, record.branch, record.seq)


def _wait_table(bins: Sequence[WaitBin], total_missed: int) -> list[str]:
    lines = [
        f"  {'wait before return':<20}{'returns':>8}{'missed':>8}{'missed tokens':>15}"
        f"{'share':>7}{'after ended turn':>18}{'missed after idle':>19}"
    ]
    for b in bins:
        label = f">= {b.low_s:g} s" if b.high_s == float("inf") else f"{b.low_s:g}-{b.high_s:g} s"
        share = b.missed_tokens / total_missed if total_missed else 0.0
        lines.append(
            f"  {label:<20}{b.returns:>8}{b.missed_returns:>8}{b.missed_tokens:>15,}"
            f"{share:>7.0%}{b.after_ended_turn:>18}{b.missed_after_idle:>19}"
        )
    return lines


def _ttft_table(sums: Mapping[Kind, KindTTFT], bound: str) -> list[str]:
    lines = [f"  {'TTFT by kind':<20}{'requests':>8}{'sum s':>10}{'mean s':>8}"
             f"{bound + ' sum s':>22}{'mean s':>8}{f'late > {LATE_S:g} s':>14}"]  # fmt: skip
    total = sum((sums[k] for k in KINDS), KindTTFT())
    for label, t in [*((k, sums[k]) for k in KINDS), ("all", total)]:
        n = t.requests
        mean, bound_mean = (t.sum_s / n, t.bound_sum_s / n) if n else (0.0, 0.0)
        lines.append(
            f"  {label:<20}{n:>8}{t.sum_s:>10.1f}{mean:>8.2f}{t.bound_sum_s:>22.1f}"
            f"{bound_mean:>8.2f}{t.late:>14}"
        )
    return lines


def report(
    runs: Mapping[str, ConfigRun],
    names: Sequence[str],
    block_size: int,
    ends_turn: Mapping[RequestKey, bool],
    bound: str,
) -> str:
    """The two tables of each configuration in ``names``."""
    out: list[str] = []
    for name in names:
        records = runs[name].records
        total = sum(missed(r) for r in records if r.error is None)
        theory = sum(r.theoretical_cached for r in records if r.error is None)
        out.append(
            f"{name}: {len(records)} requests; {total:,} of {theory:,} tokens an earlier "
            f"prompt held were recomputed"
        )
        out += _wait_table(by_wait(records, block_size, ends_turn, runs[name].samples), total)
        if bound in runs:
            out += _ttft_table(ttft_by_kind(records, runs[bound].records, block_size), bound)
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.misses", description=__doc__)
    p.add_argument("run", type=Path, help="JSON written by benchmarks.replay")
    p.add_argument("--configs", help="comma-separated configurations (default: all)")
    p.add_argument("--bound", default="unlimited", help="configuration to compare TTFT with")
    p.add_argument("--traces", type=Path, help="trace directory (default: the run's)")
    args = p.parse_args(argv)
    if not args.run.is_file():
        sys.exit(f"error: no such file: {args.run}")
    header, found = read_json(args.run)
    runs = {run.name: run for run in found}
    names = args.configs.split(",") if args.configs else list(runs)
    unknown = [n for n in names if n not in runs]
    if unknown:
        sys.exit(f"error: {args.run} has no configuration {', '.join(unknown)}")
    run_args = header["args"]
    traces_dir = args.traces or Path(run_args.get("traces") or default_traces_dir(REPO_ROOT))
    if not traces_dir.is_dir():
        sys.exit(f"error: no trace directory {traces_dir} (pass --traces)")
    ends_turn = {key: r.ends_turn for key, r in run_requests(run_args, traces_dir).items()}
    print(report(runs, names, run_args["block_size"], ends_turn, args.bound))
    return 0


if __name__ == "__main__":
    sys.exit(main())
