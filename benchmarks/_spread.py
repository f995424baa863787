"""How much of a difference is noise: one matrix run several times.

On a shared 2-vCPU machine the same replay moves by tens of percent between runs
(the bound's own mean TTFT has ranged 0.047-0.080 s), more than some of the
differences a single table shows. Each run still compares its configurations
under the same conditions, so the spread is taken over each run's *ratios*, and
over each configuration's absolute numbers beside them.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ._ceiling import format_ceilings, median_ceiling
from ._report import RATIO_KEYS, ratios

__all__ = ["Spread", "format_spread", "spread_json", "spreads"]

_SHOWN = ("reuse_of_theoretical", "prefill_tokens", "ttft_p90_s", "ttft_mean_s")
"""The numbers the table shows (the JSON has every ratio)."""
_HEADINGS = ("reuse", "prefill", "TTFT p90", "TTFT mean")
_FORMATS = {  # spec, unit, scale
    "reuse_of_theoretical": (".1f", "%", 100.0),
    "prefill_tokens": (",.0f", "", 1.0),
    "ttft_p90_s": (".3f", " s", 1.0),
    "ttft_mean_s": (".3f", " s", 1.0),
}
_RATIO_FORMAT = (".2f", "x", 1.0)


@dataclass(frozen=True, slots=True)
class Spread:
    """One number across the runs that have it: median, lowest, highest, count."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread | None:
        known = sorted(v for v in values if v is not None)
        if not known:
            return None
        return cls(statistics.median(known), known[0], known[-1], len(known))

    def format(self, spec: str, unit: str = "", scale: float = 1.0) -> str:
        median, low, high = (scale * v for v in (self.median, self.low, self.high))
        return f"{median:{spec}}{unit} ({low:{spec}}-{high:{spec}})"


Table = dict[str, dict[str, Spread | None]]


def spreads(runs: Sequence[Sequence[Mapping[str, Any]]]) -> tuple[Table, Table]:
    """Per configuration and per ratio row (``"config / baseline"``), the spread
    of each number over ``runs`` (each a list of one run's summaries), in the
    order they first appear."""
    configs: dict[str, list[Mapping[str, Any]]] = {}
    rows: dict[str, list[Mapping[str, float | None]]] = {}
    for summaries in runs:
        for summary in summaries:
            configs.setdefault(summary["config"], []).append(summary)
        for label, cells in ratios(summaries).items():
            rows.setdefault(label, []).append(cells)
    absolute = {
        name: {key: Spread.of(s[key] for s in found) for key in _SHOWN}
        for name, found in configs.items()
    }
    relative = {
        label: {key: Spread.of(c[key] for c in found) for key in RATIO_KEYS}
        for label, found in rows.items()
    }
    return absolute, relative


def format_spread(runs: Sequence[Sequence[Mapping[str, Any]]]) -> str:
    """The median (lowest-highest) of each configuration's numbers and of each
    ratio over ``runs``."""
    absolute, relative = spreads(runs)
    width = 26
    lines = [f"{len(runs)} runs: median (lowest-highest)", ""]
    for title, table in (("config", absolute), ("ratio", relative)):
        lines.append(f"{title:<24}{'runs':>5}" + "".join(f"{h:>{width}}" for h in _HEADINGS))
        for row, cells in table.items():
            formats = [_RATIO_FORMAT if table is relative else _FORMATS[key] for key in _SHOWN]
            texts = [_cell(cells[key], fmt) for key, fmt in zip(_SHOWN, formats, strict=True)]
            n = max((s.n for s in cells.values() if s is not None), default=0)
            lines.append(f"{row:<24}{n:>5}" + "".join(f"{t:>{width}}" for t in texts))
        lines.append("")
    ceilings = format_ceilings(_median_ceilings(runs), ": medians over the runs")
    return "\n".join(lines + ceilings if ceilings else lines[:-1])


def _median_ceilings(runs: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Per configuration with a ceiling in some run: the medians of its reuse
    and of its ceiling's numbers over those runs, as one summary."""
    found: dict[str, list[Mapping[str, Any]]] = {}
    for summaries in runs:
        for s in summaries:
            if s.get("ceiling"):
                found.setdefault(s["config"], []).append(s)
    medians = []
    for name, rows in found.items():
        reuse = Spread.of(s["reuse_of_theoretical"] for s in rows)
        medians.append(
            {
                "config": name,
                "reuse_of_theoretical": None if reuse is None else reuse.median,
                "ceiling": median_ceiling([s["ceiling"] for s in rows]),
            }
        )
    return medians


def spread_json(runs: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """``format_spread``'s numbers, JSON-ready."""
    absolute, relative = spreads(runs)

    def plain(table: Table) -> dict[str, dict[str, dict[str, float] | None]]:
        return {
            row: {key: asdict(s) if s is not None else None for key, s in cells.items()}
            for row, cells in table.items()
        }

    return {
        "runs": len(runs),
        "configs": plain(absolute),
        "ratios": plain(relative),
        "ceilings": {s["config"]: s["ceiling"] for s in _median_ceilings(runs)},
    }


def _cell(spread: Spread | None, fmt: tuple[str, str, float]) -> str:
    return "-" if spread is None else spread.format(*fmt)
