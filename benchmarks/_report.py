"""Summaries, the comparison table and the JSON file of a replay benchmark."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from hints_spec import USER_TOOL, HintError, parse_header

from ._ceiling import format_ceilings
from ._replay import RequestRecord
from ._server import MetricsSample

__all__ = [
    "ConfigRun",
    "Return",
    "format_calibration",
    "format_table",
    "hinted_gap",
    "log2_error",
    "read_json",
    "returns",
    "summarize",
    "wait_calibration",
    "write_json",
]

_HINT_PREFIX = "agent_hints_"
_BASELINES = ("plain", "hint-free", "unlimited")
_HINT_FREE = "hint-free"
_TIER_MOVED = "agent_hints_tier_moved_bytes_total"
"""Bytes the extension's own tier (Mooncake) moved."""
_OFFLOADED = "vllm:kv_offload_total_bytes_total"
"""Bytes vLLM's offloading (the host tier, and the hint-free baseline) moved."""
_PREFETCH = "agent_hints_prefetch_total"
_ORDER_ENFORCED = "agent_hints_order_enforced"
_LABELLED = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)\{\w+="([^"]*)"\}')
_MIN_GAP_S = 0.01
"""Gaps are floored here before their log ratio: 0 s and 5 ms are both "at once"."""


@dataclass(slots=True)
class ConfigRun:
    """Everything one configuration produced."""

    name: str
    server_log: str
    kv_blocks: int
    wall_s: float
    records: list[RequestRecord]
    metrics_before: dict[str, float]
    metrics_after: dict[str, float]
    samples: list[MetricsSample] = field(default_factory=list)
    load_avg: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Machine load (1, 5, 15 min) when the replay ended: the machine is shared,
    so TTFT and wall time are only comparable between runs under similar load."""
    ceiling: dict[str, Any] | None = None
    """LRU and Belady reuse in the run's send order (``benchmarks._ceiling``)."""


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def _delta(run: ConfigRun, name: str) -> float:
    return run.metrics_after.get(name, 0.0) - run.metrics_before.get(name, 0.0)


def _by_label(run: ConfigRun, counter: str) -> dict[str, float]:
    """Deltas of ``counter``'s series with one label, by the label's value."""
    found = (_LABELLED.fullmatch(name) for name in run.metrics_after)
    return {m[2]: _delta(run, m[0]) for m in found if m is not None and m[1] == counter}


def _mean_of(run: ConfigRun, histogram: str) -> float | None:
    count = _delta(run, histogram + "_count")
    return _delta(run, histogram + "_sum") / count if count else None


def hinted_gap(hint: str | None) -> float | None:
    """The ``gap`` of a recorded ``Agent-Hints`` header, if it has a valid one."""
    if hint is None:
        return None
    try:
        return parse_header(hint).gap
    except HintError:
        return None


class Return(NamedTuple):
    """A request of a branch whose previous request completed: the branch was
    away for ``wait_s``, from that response's end to this request."""

    previous: RequestRecord
    record: RequestRecord
    wait_s: float


def returns(records: Iterable[RequestRecord]) -> Iterator[Return]:
    """Every return in ``records`` (a branch's first request is none)."""
    last: dict[tuple[str, str], RequestRecord] = {}
    for r in sorted(records, key=lambda r: r.sent_at):
        key = (r.trace_id, r.branch)
        prev = last.get(key)
        last[key] = r
        if prev is not None and prev.latency_s is not None and r.seq == prev.seq + 1:
            yield Return(prev, r, max(r.sent_at - (prev.sent_at + prev.latency_s), 0.0))


def log2_error(predicted: float, actual: float) -> float:
    """|log2(actual / predicted)| of a predicted wait, both floored at 10 ms: at
    most 1.0 is "within 2x"."""
    return abs(math.log2(max(actual, _MIN_GAP_S) / max(predicted, _MIN_GAP_S)))


def _share_within_2x(pairs: Iterable[tuple[float | None, float]]) -> float | None:
    """Share of (predicted, actual) pairs within 2x; pairs without a prediction do
    not count; None when no pair has one."""
    errors = [log2_error(p, a) for p, a in pairs if p is not None]
    return sum(e <= 1.0 for e in errors) / len(errors) if errors else None


def wait_calibration(records: Iterable[RequestRecord]) -> dict[str, dict[str, Any]]:
    """Per kind of wait (the tool kind, or ``user`` after a turn's end), most
    waits first: how many, their share, their median and p90 (s, as replayed),
    and the share the client's ``eta`` and the server's own prediction put
    within 2x of the real wait (None where that side predicted none); and the
    share of the client's within 2x of the recorded wait as the replay scaled
    it (``client_within_2x_recorded``: the prediction alone, without the loop's
    own time that the replayed wait also holds). The key ``all`` pools every
    kind."""
    waits: dict[str, list[tuple[float, float | None, float | None, float | None]]] = {}
    for prev, _, wait_s in returns(records):
        kind = USER_TOOL if prev.ends_turn else prev.wait_kind
        if kind is not None:
            row = (wait_s, prev.eta_s, prev.server_gap_s, prev.recorded_wait_s)
            waits.setdefault(kind, []).append(row)
    total = sum(len(rows) for rows in waits.values())
    pooled = [row for rows in waits.values() for row in rows]
    table: dict[str, dict[str, Any]] = {}
    for kind, rows in [
        *sorted(waits.items(), key=lambda kv: (-len(kv[1]), kv[0])),
        ("all", pooled),
    ]:
        if not rows:
            continue
        actual = sorted(w for w, _, _, _ in rows)
        table[kind] = {
            "waits": len(rows),
            "share_of_waits": len(rows) / total,
            "median_wait_s": statistics.median(actual),
            "p90_wait_s": _quantile(actual, 0.9),
            "client_within_2x": _share_within_2x((c, w) for w, c, _, _ in rows),
            "server_within_2x": _share_within_2x((s, w) for w, _, s, _ in rows),
            "client_within_2x_recorded": _share_within_2x(
                (c, r) for _, c, _, r in rows if r is not None
            ),
        }
    return table


def format_calibration(table: Mapping[str, Mapping[str, Any]]) -> str:
    """``wait_calibration``'s table, one row per kind of wait."""
    head = (
        f"{'wait on':<16}{'waits':>7}{'share':>8}{'median s':>10}{'p90 s':>9}"
        f"{'client 2x':>11}{'server 2x':>11}{'client 2x rec.':>16}"
    )
    lines = [head, "-" * len(head)]
    for kind, row in table.items():
        client, server = row["client_within_2x"], row["server_within_2x"]
        recorded = row["client_within_2x_recorded"]
        lines.append(
            f"{kind:<16}{row['waits']:>7}{100 * row['share_of_waits']:>7.1f}%"
            f"{row['median_wait_s']:>10.3f}{_fmt(row['p90_wait_s'], '.3f'):>9}"
            f"{_percent(client):>11}{_percent(server):>11}{_percent(recorded):>16}"
        )
    return "\n".join(lines)


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def _calibration(records: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """How well each hinted ``gap`` predicted the real one (this response to the
    next request of the branch): retention and prefetch act on the prediction,
    so a poor one explains a poor result. A response that ended the agent's
    turn is left out: its wait is on the user, hinted apart (``tool_start``
    ``user`` with its ``eta``). None without a single pair."""
    predicted: list[float] = []
    actual: list[float] = []
    for prev, _, wait_s in returns(records):
        gap = hinted_gap(prev.hint)
        if gap is not None and not prev.ends_turn:
            predicted.append(gap)
            actual.append(wait_s)
    if not predicted:
        return None
    errors = [log2_error(p, a) for p, a in zip(predicted, actual, strict=True)]
    return {
        "pairs": len(errors),
        "predicted_median_s": statistics.median(predicted),
        "actual_median_s": statistics.median(actual),
        "median_abs_log2_error": statistics.median(errors),
        "within_2x": sum(e <= 1.0 for e in errors) / len(errors),
    }


def _server_calibration(run: ConfigRun, hints: Mapping[str, float]) -> dict[str, Any] | None:
    """The server's predicted vs actual return of branches (its gap estimator,
    the client's ``gap`` as prior, learned per session and tool), from the
    extension's counters and its histogram of errors. None when the server
    predicted no return."""
    n = hints.get("predicted_returns", 0.0)
    if not n:
        return None
    return {
        "returns": int(n),
        "mean_abs_log2_error": _delta(run, "agent_hints_return_log2_error_sum") / n,
        "within_2x": hints.get("returns_within_2x", 0.0) / n,
    }


def summarize(run: ConfigRun) -> dict[str, Any]:
    """The headline numbers of one configuration (JSON-ready)."""
    ok = [r for r in run.records if r.error is None]
    ttft = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    theory = sum(r.theoretical_cached for r in ok)
    hints = {
        name[len(_HINT_PREFIX) :].removesuffix("_total"): _delta(run, name)
        for name in sorted(run.metrics_after)
        if name.startswith(_HINT_PREFIX) and name.endswith("_total")
    }
    preemptions = _delta(run, "vllm:num_preemptions_total")
    held = [
        s.values[f"{_HINT_PREFIX}held_blocks"]
        for s in run.samples
        if f"{_HINT_PREFIX}held_blocks" in s.values
    ]
    usage = [
        s.values["vllm:kv_cache_usage_perc"]
        for s in run.samples
        if "vllm:kv_cache_usage_perc" in s.values
    ]
    enforced = [s.values[_ORDER_ENFORCED] for s in run.samples if _ORDER_ENFORCED in s.values]
    summary: dict[str, Any] = {
        "config": run.name,
        "kv_blocks": run.kv_blocks,
        "requests": len(run.records),
        "failed": len(run.records) - len(ok),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "theoretical_cached_tokens": theory,
        "reuse_of_theoretical": cached / theory if theory else None,
        "prefix_hit_rate": cached / prompt if prompt else None,
        "prefill_tokens": prompt - cached,
        # Engine-side, prefetch warm-ups included: what the GPU actually computed.
        "server_prefill_tokens": _delta(run, "vllm:request_prefill_kv_computed_tokens_sum"),
        "ttft_p50_s": _quantile(ttft, 0.5),
        "ttft_p90_s": _quantile(ttft, 0.9),
        "ttft_mean_s": statistics.fmean(ttft) if ttft else None,
        "wall_s": run.wall_s,
        "preemptions": preemptions,
        # Warm-ups go first when vLLM must preempt: those cost a warm-up, not a request.
        "warmup_preemptions": hints.get("warmup_preemptions", 0.0),
        "real_preemptions": preemptions - hints.get("warmup_preemptions", 0.0),
        "server_prefix_cache_hits": _delta(run, "vllm:prefix_cache_hits_total"),
        "server_prefix_cache_queries": _delta(run, "vllm:prefix_cache_queries_total"),
        "server_queue_time_mean_s": _mean_of(run, "vllm:request_queue_time_seconds"),
        "server_prefill_time_mean_s": _mean_of(run, "vllm:request_prefill_time_seconds"),
        "kv_usage_mean": statistics.fmean(usage) if usage else None,
        "tier_bytes_moved": _delta(run, _TIER_MOVED) + _delta(run, _OFFLOADED),
        "prefetch": _by_label(run, _PREFETCH) if _PREFETCH in run.metrics_after else None,
        "calibration": _calibration(run.records),
        "server_calibration": _server_calibration(run, hints),
        "load_avg_at_end": list(run.load_avg),
        "ceiling": run.ceiling,
    }
    if hints:
        summary["agent_hints"] = hints
        summary["held_blocks_mean"] = statistics.fmean(held) if held else None
        summary["held_blocks_max"] = max(held) if held else None
        # Share of the run's samples in which retention's order was in force.
        summary["order_enforced_share"] = statistics.fmean(enforced) if enforced else None
    return summary


def _fmt(value: object, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ratio(a: object, b: object) -> float | None:
    if isinstance(a, int | float) and isinstance(b, int | float) and b:
        return a / b
    return None


RATIO_KEYS = (
    "reuse_of_theoretical",
    "prefill_tokens",
    "server_prefill_tokens",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_mean_s",
    "wall_s",
)
"""The numbers each ratio row divides, in its column order."""


def _divides(config: str, base: str) -> bool:
    """Whether ``config`` gets a ratio against ``base``: against the unlimited
    bound every other one; against plain all but the bound; against hint-free
    (vLLM's offloading at the same bytes) those that are no baseline and no
    plain vLLM run again (``plain-again``): the configurations that read hints."""
    if config == base:
        return False
    if base == _HINT_FREE:
        return config not in _BASELINES and not config.startswith("plain")
    return not (base == "plain" and config == "unlimited")


def ratios(summaries: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """``"config / baseline"`` -> that configuration's ``RATIO_KEYS`` over the
    baseline's, for every configuration against each baseline present (plain
    vLLM, the hint-free baseline, then the unlimited bound; ``_divides``)."""
    by_name = {s["config"]: s for s in summaries}
    return {
        f"{s['config']} / {base}": {key: _ratio(s[key], by_name[base][key]) for key in RATIO_KEYS}
        for base in _BASELINES
        if base in by_name
        for s in summaries
        if _divides(s["config"], base)
    }


def format_table(summaries: Sequence[Mapping[str, Any]]) -> str:
    """One row per configuration, then ratio rows against the baselines, then
    each run's ceiling where it has one."""
    head = (
        f"{'config':<24}{'req':>5}{'fail':>5}{'reuse%':>8}{'hit%':>7}{'prefill tok':>13}"
        f"{'TTFT p50':>10}{'p90':>8}{'mean':>8}{'wall s':>8}{'preempt':>8}{'tier MB':>9}"
        f"{'load5':>6}  retention"
    )
    lines = [head, "-" * len(head)]
    for s in summaries:
        reuse, hit = s["reuse_of_theoretical"], s["prefix_hit_rate"]
        tier_mb = s["tier_bytes_moved"] / 1e6 if s["tier_bytes_moved"] else None
        hints = s.get("agent_hints")
        retention = (
            f"holds {hints.get('holds', 0):.0f} pressure {hints.get('pressure_releases', 0):.0f} "
            f"expired {hints.get('expiries', 0):.0f} returned {hints.get('returns', 0):.0f}"
            if hints
            else ""
        )
        if hints and (warmed := hints.get("warmups_returned", 0) + hints.get("warmups_wasted", 0)):
            retention += f" warmed {warmed:.0f} (paid {hints.get('warmups_returned', 0):.0f})"
        if s["warmup_preemptions"]:
            retention += f" warm-ups preempted {s['warmup_preemptions']:.0f}"
        if hints and (share := s.get("order_enforced_share")) is not None:
            gained, cost = hints.get("order_gained_blocks", 0), hints.get("order_cost_blocks", 0)
            retention += f" order in force {100 * share:.0f}% (+{gained:.0f}/-{cost:.0f} blocks)"
        lines.append(
            f"{s['config']:<24}{s['requests']:>5}{s['failed']:>5}"
            f"{_fmt(None if reuse is None else 100 * reuse, '.1f'):>8}"
            f"{_fmt(None if hit is None else 100 * hit, '.1f'):>7}{s['prefill_tokens']:>13,}"
            f"{_fmt(s['ttft_p50_s'], '.3f'):>10}{_fmt(s['ttft_p90_s'], '.3f'):>8}"
            f"{_fmt(s['ttft_mean_s'], '.3f'):>8}{s['wall_s']:>8.1f}{s['real_preemptions']:>8.0f}"
            f"{_fmt(tier_mb, '.1f'):>9}{s['load_avg_at_end'][1]:>6.1f}"
            f"  {retention}"
        )
    table = ratios(summaries)
    if table:
        lines.append("")
        lines.append(
            f"{'ratio':<24}{'reuse':>8}{'prefill':>9}{'engine':>8}{'TTFT p50':>10}{'p90':>8}"
            f"{'mean':>8}{'wall':>8}   (engine: prefill with warm-ups; TTFT < 1: faster)"
        )
        widths = (8, 9, 8, 10, 8, 8, 8)
        for label, cells in table.items():
            lines.append(
                f"{label:<24}"
                + "".join(
                    f"{_fmt(cells[key], '.2f') + 'x' if cells[key] is not None else '-':>{w}}"
                    for key, w in zip(RATIO_KEYS, widths, strict=True)
                )
            )
    ceilings = format_ceilings(summaries)
    if ceilings:
        lines += ["", *ceilings]
    return "\n".join(lines)


def write_json(path: Path, header: Mapping[str, Any], runs: Sequence[ConfigRun]) -> None:
    """``header`` (args, machine, traces) plus every run: summary, server
    command, metric deltas, sampled gauges and the per-request records."""
    payload = dict(header)
    payload["configs"] = {
        run.name: {
            "summary": summarize(run),
            "server_log": run.server_log,
            "metrics_delta": {
                name: _delta(run, name)
                for name in sorted(run.metrics_after)
                if name.split("{")[0].endswith(("_total", "_sum", "_count")) and _delta(run, name)
            },
            "samples": [dataclasses.asdict(s) for s in run.samples],
            "records": [dataclasses.asdict(r) for r in run.records],
        }
        for run in runs
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")


def read_json(path: Path) -> tuple[dict[str, Any], list[ConfigRun]]:
    """The header and the runs of a file ``write_json`` wrote. Metrics come back
    as deltas (``metrics_before`` empty), which is all ``summarize`` needs."""
    payload = json.loads(path.read_text())
    configs: dict[str, Any] = payload.pop("configs")
    runs = [
        ConfigRun(
            name=name,
            server_log=c["server_log"],
            kv_blocks=c["summary"]["kv_blocks"],
            wall_s=c["summary"]["wall_s"],
            records=[RequestRecord(**r) for r in c["records"]],
            metrics_before={},
            metrics_after=dict(c["metrics_delta"]),
            samples=[MetricsSample(**s) for s in c["samples"]],
            load_avg=tuple(c["summary"]["load_avg_at_end"]),
            ceiling=c["summary"].get("ceiling"),
        )
        for name, c in configs.items()
    ]
    return payload, runs
