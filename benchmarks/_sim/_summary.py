"""A configuration's numbers from its records, and the table of them."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ._cluster import Cluster, Record

__all__ = ["SUMMARY_KEYS", "format_rows", "quantile", "summarize"]

SUMMARY_KEYS = (
    "sessions",
    "requests",
    "reuse_of_theoretical",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_mean_s",
    "loads_hidden",
    "bytes_loaded",
    "sessions_per_gpu_at_slo",
)


def quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile by the nearest rank (as ``benchmarks._report``)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def summarize(
    records: Sequence[Record], cluster: Cluster, sessions: int, slo_p90_s: float
) -> dict[str, Any]:
    """The JSON of one configuration's run. ``sessions_per_gpu_at_slo``: the
    sessions in flight on average per GPU when the TTFT p90 met the SLO,
    else 0 (the sweep over rates finds the largest)."""
    ttft = [r.ttft_s for r in records]
    cached = sum(r.cached_tokens for r in records)
    theory = sum(r.theoretical for r in records)
    p90 = quantile(ttft, 0.9)
    engines = cluster.engines
    span = max((r.done for r in records), default=0.0)
    live = sum(r.done - r.sent for r in records)
    gpus = cluster.spec.preset.gpus * len(engines)
    # Sessions in flight: a session is live from its first send to its last
    # response; approximated by its requests' spans plus their waits.
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for r in records:
        first.setdefault(r.session, r.sent)
        last[r.session] = max(last.get(r.session, 0.0), r.done)
    session_s = sum(last[s] - first[s] for s in first)
    concurrent = session_s / span if span > 0 else 0.0
    loads = sum(e.loads for e in engines)
    return {
        "sessions": sessions,
        "requests": len(records),
        "prompt_tokens": sum(r.prompt_tokens for r in records),
        "cached_tokens": cached,
        "theoretical_cached_tokens": theory,
        "reuse_of_theoretical": cached / theory if theory else None,
        "ttft_p50_s": quantile(ttft, 0.5),
        "ttft_p90_s": p90,
        "ttft_mean_s": statistics.fmean(ttft) if ttft else None,
        "loads": loads,
        "loads_hidden": sum(e.loads_hidden for e in engines),
        "load_wait_mean_s": sum(e.load_wait_s for e in engines) / loads if loads else 0.0,
        "bytes_loaded": {
            tier: sum(e.bytes_loaded[tier] for e in engines) for tier in ("host", "pool")
        },
        "bytes_stored": {
            tier: sum(e.bytes_stored[tier] for e in engines) for tier in ("host", "pool")
        },
        "device_evictions": sum(e.pool.evictions for e in engines),
        "engine_busy_share": (
            sum(e.busy_s for e in engines) / (span * len(engines)) if span > 0 else None
        ),
        "request_seconds": live,
        "sessions_in_flight_mean": concurrent,
        "sessions_per_gpu_at_slo": (
            concurrent / gpus if p90 is not None and p90 <= slo_p90_s else 0.0
        ),
        "simulated_s": span,
    }


def _fmt(v: object, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_rows(summary: Mapping[str, Mapping[str, Any]]) -> str:
    head = (
        f"{'config':<12}{'sess':>6}{'req':>8}{'reuse%':>8}{'TTFT p50':>10}{'p90':>9}"
        f"{'mean':>9}{'loads':>8}{'hidden':>8}{'GB host':>9}{'GB pool':>9}{'sess/GPU@SLO':>14}"
    )
    lines = [head, "-" * len(head)]
    for name, s in summary.items():
        reuse = s["reuse_of_theoretical"]
        lines.append(
            f"{name:<12}{s['sessions']:>6}{s['requests']:>8}"
            f"{_fmt(None if reuse is None else 100 * reuse, '.1f'):>8}"
            f"{_fmt(s['ttft_p50_s'], '.3f'):>10}{_fmt(s['ttft_p90_s'], '.3f'):>9}"
            f"{_fmt(s['ttft_mean_s'], '.3f'):>9}{s['loads']:>8}{s['loads_hidden']:>8}"
            f"{s['bytes_loaded']['host'] / 1e9:>9.1f}{s['bytes_loaded']['pool'] / 1e9:>9.1f}"
            f"{s['sessions_per_gpu_at_slo']:>14.2f}"
        )
    return "\n".join(lines)
