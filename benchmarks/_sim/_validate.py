"""The simulator against the test bed: a suite run replayed in simulation.

``--preset testbed --validate RUN.json`` reads a ``benchmarks.suite`` JSON,
configures the simulator as that run's bed (the generated tiny model's KV
bytes, the family's device blocks, the run's tier bytes, the CPU build's
scheduler limits, and step costs from the run's own measurements), replays
each trace family's sessions as the suite's client sent them, and sets the
simulated reuse and mean TTFT of plain, hint-free and the extension beside
the measured ones (medians over the repeats of the quiet condition, else the
noisy one). It holds where reuse is within 5 points and mean TTFT within 25%.

Step costs (``Measured``) from the runs: each configuration's engine-side
prefill time per request (``server_prefill_time_mean_s``) against the tokens
it prefilled per request (``server_prefill_tokens`` over ``requests``); a
line through those points gives seconds per prefilled token (its slope) and
a step's fixed cost (its intercept). A request's prefill time holds the
whole steps it shared with others, so where the run's vLLM logs lie beside
its JSON (``<name>-logs/``, as the suite writes them) the step cost is
instead the engine's saturated prompt throughput there
(``logged_token_s``), per token, with no fixed part. Several suite files of one family (e.g. one per
configuration) are merged.
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from server_ext import make_test_model

from .._ceiling import kv_block_bytes
from .._server import extension_tier_bytes
from .._suite import FAMILIES, Family
from .._traces import default_traces_dir, select_traces
from ._cluster import RunSpec, run
from ._model import MEMCPY, Measured, Preset
from ._summary import summarize
from ._workload import Pacing, from_trace

__all__ = ["REUSE_POINTS", "TESTBED", "TTFT_SHARE", "testbed_preset", "validate"]

TESTBED = "testbed"
REUSE_POINTS = 0.05
TTFT_SHARE = 0.25
_CONFIGS = ("plain", "hint-free", "extension")
_CPU_BATCHED_TOKENS = 2048
"""vLLM's CPU default ``max_num_batched_tokens`` for the API server (arg_utils)."""
_CPU_MAX_SEQS = 128


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _measured(repeats: Mapping[str, Any], config: str, key: str) -> float | None:
    return _median([r[config]["summary"].get(key) for r in repeats.values() if config in r])


_THROUGHPUT = re.compile(
    r"Avg prompt throughput: ([\d.]+) tokens/s.*Waiting: (\d+) reqs.*"
    r"Prefix cache hit rate: ([\d.]+)%.*External prefix cache hit rate: ([\d.]+)%"
)


def logged_token_s(logs: Sequence[Path]) -> float | None:
    """Seconds per prefilled token from the run's vLLM logs: the median
    prompt throughput over the intervals the engine was saturated through
    (requests waited at the interval's start and at its end: the line before
    and its own line show some), before any prefix-cache hit (vLLM's prompt
    throughput counts cached tokens too). A log's first interval never
    counts: it holds the idle server before the first request, and the
    throughput over it is the engine's speed times the share it was busy."""
    rates = []
    for log in logs:
        busy = False  # requests waited at the interval's start
        for line in log.read_text(errors="replace").splitlines():
            m = _THROUGHPUT.search(line)
            if m is None:
                continue
            rate, waiting, local, external = (float(g) for g in m.groups())
            if local > 0 or external > 0:
                break  # from here on the throughput counts hits
            if busy and waiting > 0 and rate > 0:
                rates.append(rate)
            busy = waiting > 0
    return 1.0 / statistics.median(rates) if rates else None


def step_costs(repeats: Mapping[str, Any], logs: Sequence[Path] = ()) -> Measured:
    """The bed's step costs from a family's runs (module doc): a line through
    each run's engine-side prefill time against its prefill tokens per
    request (least squares; through the origin with one point)."""
    points = []
    for r in repeats.values():
        for config_run in r.values():
            s = config_run["summary"]
            time_s, tokens, n = (
                s.get("server_prefill_time_mean_s"),
                s.get("server_prefill_tokens"),
                s.get("requests"),
            )
            if time_s is not None and tokens and n:
                points.append((tokens / n, time_s))
    logged = logged_token_s(logs)
    if logged is not None:
        # The logs' throughput is the whole step's: no separate fixed cost.
        return Measured(0.0, logged, 0.0)
    if not points:
        raise SystemExit("error: the run has no server_prefill_time_mean_s to take step costs from")
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    if len(points) > 1 and max(xs) > min(xs):
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
        if slope > 0:
            return Measured(max(my - slope * mx, 0.0), slope, 0.0)
    return Measured(0.0, sum(ys) / sum(xs), 0.0)


def testbed_preset(
    args: Mapping[str, Any], family: Family, tier_bytes: int, cost: Measured
) -> Preset:
    block = int(args.get("block_size", 64))
    with tempfile.TemporaryDirectory(prefix="sim-model-") as tmp:
        block_bytes = kv_block_bytes(make_test_model(tmp), block)
    return Preset(
        name=TESTBED,
        cost=cost,
        block_tokens=block,
        device_blocks=family.kv_blocks,
        kv_block_bytes=block_bytes,
        host_tier_bytes=tier_bytes,
        pcie=MEMCPY,
        pool_link=MEMCPY,
        max_batched_tokens=_CPU_BATCHED_TOKENS,
        max_seqs=_CPU_MAX_SEQS,
        token_scale=int(args.get("scale_k", 4)) / 64,
        max_out=int(args.get("max_out", 32)),
        max_model_len=int(args.get("max_model_len", 8192)),
        description="the CPU test bed (generated tiny model)",
    )


def _merge(paths: Sequence[Path]) -> dict[str, Any]:
    """The runs of several suite files as one: each file's repeats kept apart."""
    merged: dict[str, Any] = {"runs": {}, "logs": []}
    for i, path in enumerate(paths):
        data = json.loads(path.read_text())
        merged.setdefault("args", data.get("args", {}))
        merged.setdefault("tier_bytes", data.get("tier_bytes"))
        merged["logs"] += sorted(path.with_name(f"{path.stem}-logs").glob("*.log"))
        for family, conditions in data.get("runs", {}).items():
            for condition, repeats in conditions.items():
                into = merged["runs"].setdefault(family, {}).setdefault(condition, {})
                for repeat, configs in repeats.items():
                    into[f"{i}:{repeat}"] = configs
    return merged


def validate(
    paths: Sequence[Path],
    repo_root: Path,
    traces_dir: Path | None,
    family_name: str | None = None,
) -> dict[str, Any]:
    """``families.<family>.<config>`` for every trace family of the runs (or
    ``family_name``'s only), and ``validation.<config>``: the first one's."""
    data = _merge(paths)
    args: dict[str, Any] = data["args"]
    tier_bytes = int(data["tier_bytes"] or extension_tier_bytes())
    directory = traces_dir or (Path(args["traces"]) if args.get("traces") else None)
    directory = directory or default_traces_dir(repo_root)
    out: dict[str, Any] = {}
    lines = [
        f"{'family':<10}{'config':<11}{'reuse meas.':>12}{'sim.':>8}{'TTFT mean meas.':>17}"
        f"{'sim.':>8}{'ratio':>7}  holds",
        "-" * 80,
    ]
    passed = True
    for name, conditions in data.get("runs", {}).items():
        family = FAMILIES.get(name)
        if family is None or family.source != "traces":
            continue
        if family_name is not None and name != family_name:
            continue
        condition = "quiet" if "quiet" in conditions else next(iter(conditions))
        repeats = conditions[condition]
        k = int(args.get("scale_k", 4))
        max_prompt = int(args.get("max_model_len", 8192)) - int(args.get("max_out", 32))
        traces = select_traces(
            directory,
            k,
            max_prompt,
            n_traces=args.get("sessions") or family.n_traces,
            max_requests=args.get("max_requests") or family.max_requests,
        )
        cost = step_costs(repeats, data["logs"])
        preset = testbed_preset(args, family, tier_bytes, cost)
        pacing = Pacing(
            time_scale=family.time_scale,
            max_wait_s=family.max_think_s,
            token_scale=preset.token_scale,
            block_tokens=preset.block_tokens,
            max_out=preset.max_out,
        )
        templates = [from_trace(t, pacing) for t in traces]
        spec = RunSpec(
            preset=preset,
            control=family.control,
            unhinted=family.unhinted([t.trace_id for t in traces]),
            prior_gap_s=pacing.wait(10.0),
            prior_user_wait_s=pacing.wait(60.0),
        )
        rows: dict[str, Any] = {
            "condition": condition,
            "step_costs": {
                "step_s_fixed": cost.step_s_fixed,
                "prefill_token_s": cost.prefill_token_s,
            },
        }
        for config in _CONFIGS:
            if not any(config in r for r in repeats.values()):
                continue
            records, cluster = run(spec, config, templates, hinted=True)
            sim = summarize(records, cluster, len(templates), slo_p90_s=float("inf"))
            m_reuse = _measured(repeats, config, "reuse_of_theoretical")
            m_ttft = _measured(repeats, config, "ttft_mean_s")
            s_reuse, s_ttft = sim["reuse_of_theoretical"], sim["ttft_mean_s"]
            holds = (
                m_reuse is not None
                and s_reuse is not None
                and abs(s_reuse - m_reuse) <= REUSE_POINTS
                and m_ttft is not None
                and s_ttft is not None
                and abs(s_ttft / m_ttft - 1) <= TTFT_SHARE
            )
            passed = passed and holds
            rows[config] = {
                "measured_reuse": m_reuse,
                "simulated_reuse": s_reuse,
                "measured_ttft_mean_s": m_ttft,
                "simulated_ttft_mean_s": s_ttft,
                "holds": holds,
            }
            ratio = s_ttft / m_ttft if m_ttft and s_ttft is not None else None
            lines.append(
                f"{name:<10}{config:<11}{_pct(m_reuse):>12}{_pct(s_reuse):>8}"
                f"{_num(m_ttft):>17}{_num(s_ttft):>8}{_num(ratio, '.2f'):>7}  "
                f"{'yes' if holds else 'NO'}"
            )
        out[name] = rows
    if not out:
        raise SystemExit(f"error: no run of a trace family {family_name or ''} in {paths}")
    first = next(iter(out.values()))
    validation = {c: first[c] for c in _CONFIGS if c in first}
    return {
        "validation": validation,
        "validated_family": next(iter(out)),
        "families": out,
        "passed": passed,
        "table": "\n".join(lines),
        "source": [str(p) for p in paths],
    }


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _num(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)
