"""The replay benchmark's two plots (PNG), beside its JSON.

The table gives TTFT quantiles and total reuse; the plots show what they hide:
the whole TTFT distribution (a policy can move the tail, not the median), and
when in the run reuse was gained or lost (e.g. once the KV cache fills up).
Figures are drawn on the Agg canvas directly, without pyplot's global state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from hints_spec import USER_TOOL

from ._report import ConfigRun, returns

__all__ = ["write_calibration_plot", "write_plots", "write_ratio_plot", "write_sweep_plot"]

_FLOOR_S = 1e-3
"""Waits and ETAs below this are drawn at it: a log axis has no 0."""


def _ttft_cdf(run: ConfigRun) -> tuple[list[float], list[float]]:
    ttft = sorted(r.ttft_s for r in run.records if r.error is None and r.ttft_s)
    return ttft, [(i + 1) / len(ttft) for i in range(len(ttft))]


def _reuse_over_time(run: ConfigRun) -> tuple[list[float], list[float]]:
    """Cumulative reused / cumulative theoretical tokens, at the time each
    request's usage arrived; points before any reuse was possible are left out."""
    done = sorted(
        (r.sent_at + r.latency_s, r.cached_tokens, r.theoretical_cached)
        for r in run.records
        if r.error is None and r.cached_tokens is not None and r.latency_s is not None
    )
    cached = accumulate(c for _, c, _ in done)
    theory = accumulate(t for _, _, t in done)
    points = [(t, c / m) for (t, _, _), c, m in zip(done, cached, theory, strict=True) if m]
    return [t for t, _ in points], [f for _, f in points]


def _figure(
    path: Path,
    runs: Sequence[ConfigRun],
    series: Callable[[ConfigRun], tuple[list[float], list[float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    log_x: bool = False,
) -> Path:
    fig = Figure(figsize=(7.0, 4.5), layout="tight")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    drawn = False
    for run in runs:
        x, y = series(run)
        if x:
            ax.step(x, y, where="post", label=f"{run.name} (n={len(x)})")
            drawn = True
    if drawn:
        ax.legend(loc="best", fontsize="small")
        if log_x:
            ax.set_xscale("log")
    else:
        ax.text(0.5, 0.5, "no usable records", ha="center", transform=ax.transAxes)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0.0)
    ax.grid(True, alpha=0.3)
    fig.savefig(path, dpi=120)
    return path


def write_plots(runs: Sequence[ConfigRun], out_dir: Path, stem: str) -> list[Path]:
    """Write ``<stem>-ttft-cdf.png`` and ``<stem>-reuse-over-time.png`` into
    ``out_dir``, one line per configuration (none for a run without usable
    records); returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        _figure(
            out_dir / f"{stem}-ttft-cdf.png",
            runs,
            _ttft_cdf,
            title="TTFT distribution per configuration",
            xlabel="TTFT (s, log scale)",
            ylabel="fraction of requests",
            log_x=True,
        ),
        _figure(
            out_dir / f"{stem}-reuse-over-time.png",
            runs,
            _reuse_over_time,
            title="Prefix reuse over the run",
            xlabel="time since run start (s)",
            ylabel="reused / theoretical max (cumulative)",
        ),
    ]


def write_calibration_plot(run: ConfigRun, out_dir: Path, stem: str) -> Path:
    """Write ``<stem>-calibration.png``: each wait after a response against the
    client's ETA for it, one colour per kind of wait (log-log; the band is 2x)."""
    points: dict[str, tuple[list[float], list[float]]] = {}
    for prev, _, wait_s in returns(run.records):
        kind = USER_TOOL if prev.ends_turn else prev.wait_kind
        if kind is not None and prev.eta_s is not None:
            eta, actual = points.setdefault(kind, ([], []))
            eta.append(max(prev.eta_s, _FLOOR_S))
            actual.append(max(wait_s, _FLOOR_S))
    fig = Figure(figsize=(7.0, 5.5), layout="tight")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if points:
        for kind, (eta, actual) in sorted(points.items(), key=lambda kv: -len(kv[1][0])):
            ax.scatter(eta, actual, s=10, alpha=0.6, label=f"{kind} (n={len(eta)})")
        low = min(min(min(e), min(a)) for e, a in points.values())
        high = max(max(max(e), max(a)) for e, a in points.values())
        line = [low, high]
        ax.plot(line, line, color="black", linewidth=0.8)
        ax.fill_between(line, [x / 2 for x in line], [x * 2 for x in line], alpha=0.1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(loc="best", fontsize="x-small")
    else:
        ax.text(0.5, 0.5, "no waits with an ETA", ha="center", transform=ax.transAxes)
    ax.set_title(f"Waits after each response vs the SDK's ETA ({run.name})")
    ax.set_xlabel("ETA from tool_start (s, log scale)")
    ax.set_ylabel("real wait (s, log scale)")
    ax.grid(True, alpha=0.3)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}-calibration.png"
    fig.savefig(path, dpi=120)
    return path


_RATIO_SERIES = (
    ("ttft_mean_s", "TTFT mean"),
    ("ttft_p90_s", "TTFT p90"),
    ("reuse_of_theoretical", "reuse"),
)


def write_ratio_plot(
    rows: Sequence[tuple[str, Mapping[str, Mapping[str, float] | None]]],
    path: Path,
    bound: float,
) -> Path:
    """Write the suite's ratios against plain: one row per family and
    condition, and one for plain against itself where the suite ran it twice
    (``rows``: label, ratio key -> median/low/high), a marker at the
    median and a bar over the range of the repeats, the 1.0 and ``bound`` lines."""
    fig = Figure(figsize=(8.0, 1.0 + 0.45 * max(len(rows), 1)), layout="tight")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for offset, (key, name) in zip((-0.2, 0.0, 0.2), _RATIO_SERIES, strict=True):
        ys, medians, lows, highs = [], [], [], []
        for i, (_, cells) in enumerate(rows):
            cell = cells.get(key)
            if cell is not None:
                ys.append(i + offset)
                medians.append(cell["median"])
                lows.append(cell["median"] - cell["low"])
                highs.append(cell["high"] - cell["median"])
        if ys:
            ax.errorbar(medians, ys, xerr=[lows, highs], fmt="o", capsize=3, label=name)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.axvline(bound, color="red", linewidth=0.8, linestyle="--", label=f"{bound}x")
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("against plain vLLM (median and range over the repeats)")
    ax.set_title("The extension with its defaults against plain vLLM, per workload")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def write_sweep_plot(
    sweep: Sequence[Mapping[str, Any]], path: Path, title: str, slo_s: float
) -> Path:
    """Write a simulation sweep (``benchmarks.simulate --rates``): per
    configuration, TTFT p90 and reuse against the session arrival rate, with
    the TTFT SLO as a line."""
    fig = Figure(figsize=(11.0, 4.5), layout="tight")
    FigureCanvasAgg(fig)
    ttft_ax, reuse_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    rates = [point["rate"] for point in sweep]
    configs = list(sweep[0]["summary"]) if sweep else []
    for config in configs:
        summaries = [point["summary"][config] for point in sweep]
        ttft_ax.plot(rates, [s["ttft_p90_s"] for s in summaries], marker="o", label=config)
        reuse = [100 * (s["reuse_of_theoretical"] or 0.0) for s in summaries]
        reuse_ax.plot(rates, reuse, marker="o", label=config)
    ttft_ax.axhline(slo_s, color="red", linewidth=0.8, linestyle="--", label=f"SLO {slo_s:g} s")
    ttft_ax.set_yscale("log")
    ttft_ax.set_xlabel("session arrivals per second")
    ttft_ax.set_ylabel("TTFT p90 (s, log scale)")
    reuse_ax.set_xlabel("session arrivals per second")
    reuse_ax.set_ylabel("reuse of the theoretical maximum (%)")
    for ax in (ttft_ax, reuse_ax):
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
