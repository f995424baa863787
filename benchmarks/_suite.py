"""The workload suite: families of trace replays, each run plain vs the extension
(its defaults) vs the unlimited bound, repeated, quiet and beside a busy neighbour.

A family fixes what is replayed (which traces, how dense, which client style,
how much of the traffic is hinted); a condition fixes the machine (``quiet``, or
``noisy``: one other process keeps a core busy through every configuration of
the run, as production engines share their hosts). Within a repeat the
configurations run one after the other on fresh servers, in an order that
rotates with the repeat, so a drift of the machine does not always land on the
same configuration. The spread is taken over each repeat's ratios against plain.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._replay import ControlStyle
from ._report import ConfigRun, summarize
from ._server import CONFIGS, Config
from ._spread import Spread

__all__ = [
    "CONDITIONS",
    "FAMILIES",
    "QUICK_FAMILIES",
    "SUITE_CONFIGS",
    "TTFT_BOUND",
    "Check",
    "Condition",
    "Family",
    "busy_neighbour",
    "checks",
    "group_summary",
    "rotated",
]

Condition = Literal["quiet", "noisy"]
CONDITIONS: tuple[Condition, ...] = ("quiet", "noisy")

SUITE_CONFIGS: dict[str, Config] = {
    "plain": CONFIGS["plain"],
    "extension": Config("extension", "the agent-hints extension, defaults", extension=True),
    "unlimited": CONFIGS["unlimited"],
}
"""What each family runs: vLLM as shipped, the extension as ``python -m
server_ext serve MODEL`` starts it (no knobs), and the bound."""


@dataclass(frozen=True, slots=True)
class Family:
    """One workload of the suite, replayed from the anonymized traces.

    Args:
        name: Short id (the CLI's ``--families``).
        description: What it stands for, for the table.
        n_traces: Sessions: the first ones by id that fit whole.
        time_scale: Think times are divided by this...
        max_think_s: ...and capped at this (dense traffic: small).
        max_requests: Root requests kept per session (None: all).
        kv_blocks: Device KV of every configuration but the bound.
        control: The hinted client's control events (``ControlStyle``).
        unhinted_share: Share of the sessions (every other one by id at 0.5)
            whose client sends no hints, in every configuration.
        source: ``traces`` (the anonymized traces, ``benchmarks._replay``) or
            ``claude-code`` (Claude Code sessions through the SDK's own agent
            loop, ``benchmarks.agent_replay``: its KV plan, a third of the
            live working set; ``kv_blocks``, ``max_requests``, ``control``
            and ``unhinted_share`` do not apply).
    """

    name: str
    description: str
    n_traces: int = 8
    time_scale: float = 10.0
    max_think_s: float = 30.0
    max_requests: int | None = 20
    kv_blocks: int = 256
    control: ControlStyle = "turns"
    unhinted_share: float = 0.0
    source: Literal["traces", "claude-code"] = "traces"

    def unhinted(self, trace_ids: Sequence[str]) -> frozenset[str]:
        """The sessions among ``trace_ids`` (in id order) that send no hints."""
        if self.unhinted_share <= 0:
            return frozenset()
        every = max(round(1 / self.unhinted_share), 1)
        return frozenset(t for i, t in enumerate(sorted(trace_ids)) if i % every == every - 1)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "matrix",
            "the development matrix as it is (make bench's workload)",
            max_requests=None,
        ),
        Family(
            "dense",
            "dense traffic: think cap 5 s, header hints only",
            max_think_s=5.0,
            control="none",
        ),
        Family("sparse", "sparse traffic: think cap 60 s", max_think_s=60.0, max_requests=12),
        Family("crowded", "16 sessions in the same KV", n_traces=16),
        Family(
            "sdk-client",
            "the SDK's control events around every tool wait",
            max_think_s=5.0,
            control="tools",
        ),
        Family(
            "mixed",
            "half the sessions unhinted (they must not get slower)",
            max_think_s=5.0,
            unhinted_share=0.5,
        ),
        Family(
            "claude-code",
            "Claude Code sessions through the SDK's agent loop (tool-aware hints)",
            time_scale=20.0,
            source="claude-code",
        ),
    )
}
"""The suite's families, in run order."""

QUICK_FAMILIES = ("dense", "mixed")
"""``--quick``: the two families with the most at stake (dense traffic and
sessions that send nothing), one repeat."""


def rotated(configs: Sequence[Config], repeat: int) -> list[Config]:
    """``configs`` in the order repeat ``repeat`` runs them."""
    shift = repeat % len(configs) if configs else 0
    return [*configs[shift:], *configs[:shift]]


@contextlib.contextmanager
def busy_neighbour(active: bool, limit_s: float) -> Iterator[None]:
    """While the block runs (if ``active``), one process keeps a core busy; it
    stops when the block exits, and by itself after ``limit_s`` at the latest
    or as soon as this process is gone (killed before it could stop it)."""
    if not active:
        yield
        return
    code = (
        "import os, time\n"
        f"parent, end = {os.getpid()}, time.monotonic() + {limit_s}\n"
        "while time.monotonic() < end and os.getppid() == parent: pass"
    )
    process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        yield
    finally:
        process.kill()
        process.wait()


_GROUP_KEYS = ("requests", "reuse_of_theoretical", "ttft_p50_s", "ttft_p90_s", "ttft_mean_s")


def group_summary(run: ConfigRun, trace_ids: frozenset[str]) -> dict[str, Any]:
    """The client-side numbers of ``run`` over the sessions in ``trace_ids``."""
    records = [r for r in run.records if r.trace_id in trace_ids]
    summary = summarize(dataclasses.replace(run, records=records, samples=[]))
    return {key: summary[key] for key in _GROUP_KEYS}


@dataclass(frozen=True, slots=True)
class Check:
    """One pass/fail line of the suite's verdict: a ratio's median over the
    repeats against its bound."""

    family: str
    condition: str
    what: str
    value: float | None
    bound: float
    at_most: bool

    @property
    def passed(self) -> bool:
        if self.value is None:
            return False
        return self.value <= self.bound if self.at_most else self.value >= self.bound


def _median_ratio(
    repeats: Sequence[Mapping[str, Mapping[str, Any]]],
    key: str,
    of: Callable[[Mapping[str, Mapping[str, Any]]], tuple[Any, Any]],
) -> float | None:
    ratios = []
    for runs in repeats:
        a, b = of(runs)
        if isinstance(a, int | float) and isinstance(b, int | float) and b:
            ratios.append(a / b)
    spread = Spread.of(ratios)
    return None if spread is None else spread.median


TTFT_BOUND = 1.05
"""The most the extension's TTFT (mean, p90) may be, as a multiple of plain's."""


def checks(
    family: str,
    condition: str,
    repeats: Sequence[Mapping[str, Mapping[str, Any]]],
    groups: Sequence[Mapping[str, Mapping[str, Any]]] = (),
) -> list[Check]:
    """The verdict on one family and condition: medians over ``repeats`` (each
    config name -> summary) of the extension against plain, and with
    ``groups`` (the unhinted sessions' numbers of each repeat), theirs too."""

    def ratio(key: str, rows: Sequence[Mapping[str, Mapping[str, Any]]]) -> float | None:
        return _median_ratio(rows, key, lambda r: (r["extension"][key], r["plain"][key]))

    def worst(key: str) -> float:
        return max((float(r["extension"][key]) for r in repeats), default=0.0)

    found = [
        Check(
            family,
            condition,
            "reuse / plain",
            ratio("reuse_of_theoretical", repeats),
            1.0,
            at_most=False,
        ),
        Check(
            family,
            condition,
            "TTFT mean / plain",
            ratio("ttft_mean_s", repeats),
            TTFT_BOUND,
            at_most=True,
        ),
        Check(
            family,
            condition,
            "TTFT p90 / plain",
            ratio("ttft_p90_s", repeats),
            TTFT_BOUND,
            at_most=True,
        ),
        Check(family, condition, "failed requests", worst("failed"), 0.0, at_most=True),
        Check(
            family,
            condition,
            "real preemptions over plain's",
            statistics.median(
                float(r["extension"]["real_preemptions"]) - float(r["plain"]["real_preemptions"])
                for r in repeats
            )
            if repeats
            else None,
            0.0,
            at_most=True,
        ),
    ]
    if groups:
        found.append(
            Check(
                family,
                condition,
                "unhinted sessions' TTFT mean / plain",
                ratio("ttft_mean_s", groups),
                TTFT_BOUND,
                at_most=True,
            )
        )
    return found
