"""The workload suite: families of trace replays, each run plain vs the hint-free
baseline (vLLM's own offloading at the same bytes) vs the extension (its
defaults) vs the unlimited bound, repeated, quiet and beside a busy neighbour.

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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._replay import ControlStyle
from ._report import ConfigRun, summarize
from ._server import CONFIGS, Config
from ._spread import Spread

__all__ = [
    "CONDITIONS",
    "DEFAULT_CONFIGS",
    "FAMILIES",
    "HINT_FREE",
    "NOISE_CONFIG",
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

NOISE_CONFIG = "plain-again"
"""Plain vLLM a second time in each repeat: its ratio against plain is the
test bed's run-to-run noise, the yardstick for the extension's."""

HINT_FREE = "hint-free"
"""vLLM's own KV offloading at the extension's tier bytes, its LRU, no hint read."""

SUITE_CONFIGS: dict[str, Config] = {
    "plain": CONFIGS["plain"],
    HINT_FREE: CONFIGS[HINT_FREE],
    "extension": Config("extension", "the agent-hints extension, defaults", extension=True),
    "unlimited": CONFIGS["unlimited"],
    NOISE_CONFIG: Config(NOISE_CONFIG, "vLLM as shipped, once more: plain against itself"),
}
"""What a family can run: vLLM as shipped, vLLM's offloading with the bytes of
the extension's tier (the hint-free baseline), the extension as ``python -m
server_ext serve MODEL`` starts it (no knobs), the bound, and plain again."""

DEFAULT_CONFIGS = ("plain", HINT_FREE, "extension", "unlimited")
"""What a family runs unless told (``NOISE_CONFIG`` adds a fifth of the time)."""


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
    repeats against its bound; ``noise``, where the repeats ran plain twice,
    is the same ratio of plain against itself (``NOISE_CONFIG``). ``counts``:
    whether the verdict depends on it (the ratios against the hint-free
    baseline are shown beside plain's, held to the same bounds, and do not)."""

    family: str
    condition: str
    what: str
    value: float | None
    bound: float
    at_most: bool
    noise: Spread | None = None
    counts: bool = True

    @property
    def passed(self) -> bool:
        if self.value is None:
            return False
        return self.value <= self.bound if self.at_most else self.value >= self.bound

    @property
    def within_noise(self) -> bool:
        """Whether the extension's ratio lies inside plain's own range against
        itself: a verdict the test bed's noise could have given either way."""
        noise, value = self.noise, self.value
        return noise is not None and value is not None and noise.low <= value <= noise.high


def _ratio_spread(
    repeats: Sequence[Mapping[str, Mapping[str, Any]]], key: str, config: str, base: str = "plain"
) -> Spread | None:
    """``config``'s ``key`` over ``base``'s, over the repeats that ran both."""
    ratios = []
    for runs in repeats:
        if config not in runs or base not in runs:
            continue
        a, b = runs[config][key], runs[base][key]
        if isinstance(a, int | float) and isinstance(b, int | float) and b:
            ratios.append(a / b)
    return Spread.of(ratios)


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
    ``groups`` (the unhinted sessions' numbers of each repeat), theirs too;
    where repeats ran the hint-free baseline, the extension's reuse and TTFT
    against it beside plain's (shown, not counted)."""

    def ratio(
        what: str,
        key: str,
        bound: float,
        at_most: bool,
        rows: Sequence[Mapping[str, Mapping[str, Any]]] = repeats,
    ) -> Check:
        spread = _ratio_spread(rows, key, "extension")
        return Check(
            family,
            condition,
            what,
            None if spread is None else spread.median,
            bound,
            at_most,
            noise=_ratio_spread(rows, key, NOISE_CONFIG),
        )

    def worst(key: str) -> float:
        return max((float(r["extension"][key]) for r in repeats), default=0.0)

    def against_hint_free(what: str, key: str, bound: float, at_most: bool) -> list[Check]:
        spread = _ratio_spread(repeats, key, "extension", HINT_FREE)
        if spread is None:
            return []
        value = spread.median
        return [Check(family, condition, what, value, bound, at_most, counts=False)]

    found = [
        ratio("reuse / plain", "reuse_of_theoretical", 1.0, at_most=False),
        *against_hint_free("reuse / hint-free", "reuse_of_theoretical", 1.0, at_most=False),
        ratio("TTFT mean / plain", "ttft_mean_s", TTFT_BOUND, at_most=True),
        *against_hint_free("TTFT mean / hint-free", "ttft_mean_s", TTFT_BOUND, at_most=True),
        ratio("TTFT p90 / plain", "ttft_p90_s", TTFT_BOUND, at_most=True),
        *against_hint_free("TTFT p90 / hint-free", "ttft_p90_s", TTFT_BOUND, at_most=True),
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
            ratio("unhinted sessions' TTFT mean / plain", "ttft_mean_s", TTFT_BOUND, True, groups)
        )
    return found
