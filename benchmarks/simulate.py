"""``python -m benchmarks.simulate``: what the hints are worth on a GPU fleet.

A trace-driven discrete-event simulation of vLLM instances serving agent
sessions (``benchmarks._sim``: continuous batching with chunked prefill, a
paged prefix cache, vLLM's host offloading, an optional shared pool, a
router), whose policies are the project's own code: the extension's
retention (``EngineRetention`` over ``RetentionPolicy``) and its tier policy
(``AgentHintsCachePolicy`` inside vLLM's ``CPUOffloadingManager``), on the
simulator's clock. Every configuration runs the same sessions: ``plain``
(vLLM's LRU, no tier), ``hint-free`` (vLLM's offloading with its LRU at the
same bytes), ``extension`` (its defaults, a hinted client), ``belady``
(Belady's rule over the device and tier blocks, loads free) and
``unlimited`` (room for everything).

Examples::

    python -m benchmarks.simulate --preset h100-70b --rate 0.05 --sessions 2000
    python -m benchmarks.simulate --preset h100-8b --rates 0.1,0.2,0.4 --generated
    python -m benchmarks.simulate --preset h100-70b --instances 8 --pool-gib 4096
    python -m benchmarks.simulate --preset testbed --validate results/suite.json

``docs/simulator.md`` states the engine model and where each number comes from.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from ._plots import write_sweep_plot
from ._sim._cluster import CONFIGS, RunSpec, run
from ._sim._model import GIB, PRESETS, Preset
from ._sim._sources import load_templates
from ._sim._summary import format_rows, summarize
from ._sim._validate import TESTBED, validate
from ._sim._workload import Pacing

REPO_ROOT = Path(__file__).resolve().parents[1]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.simulate", description=__doc__)
    p.add_argument(
        "--preset",
        default="h100-70b",
        help=f"engine: {', '.join([*PRESETS, TESTBED])} (testbed: with --validate)",
    )
    p.add_argument("--claude-code", type=Path, help="Claude Code transcripts directory")
    p.add_argument("--traces", type=Path, help="anonymized traces directory")
    p.add_argument("--generated", action="store_true", help="the demo's generated sessions")
    p.add_argument("--sessions", type=int, default=0, help="sessions to run (default: the set)")
    p.add_argument("--rate", type=float, default=0.0, help="session arrivals per second")
    p.add_argument("--rates", help="comma-separated rates: one run per rate (a sweep)")
    p.add_argument("--instances", type=int, default=1)
    p.add_argument("--router", choices=("sticky", "load"), default="sticky")
    p.add_argument("--pool-gib", type=float, default=0.0, help="shared pool, all instances")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"of: {','.join(CONFIGS)}")
    p.add_argument("--time-scale", type=float, default=1.0, help="waits divided by this")
    p.add_argument("--max-wait", type=float, default=0.0, help="cap on one wait, s (0: none)")
    p.add_argument("--control", choices=("none", "turns", "tools"), help="hinted client style")
    p.add_argument(
        "--block-tokens",
        type=int,
        help="tokens per tracked block (default: the preset's); larger runs faster, "
        "rounding each cached prefix down to it",
    )
    p.add_argument("--slo-p90", type=float, default=2.0, help="TTFT p90 SLO, s")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="configurations simulated at once, one process each (same results)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--validate",
        type=Path,
        nargs="+",
        help="benchmarks.suite JSON files, merged by family (--preset testbed)",
    )
    p.add_argument("--family", help="--validate: only this family of the run")
    p.add_argument("--out", type=Path, default=Path("results/simulate.json"))
    return p


def _configs(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown or not names:
        sys.exit(f"error: unknown configs {unknown}; choose from {', '.join(CONFIGS)}")
    return names


_COST_ORDER = ("extension", "hint-free", "belady", "plain", "unlimited")
"""The configurations, costliest first (so parallel jobs finish together)."""


def simulate(
    spec: RunSpec,
    configs: Sequence[str],
    templates: Sequence[Any],
    slo_p90_s: float,
    jobs: int = 1,
) -> dict[str, dict[str, Any]]:
    """Each configuration's summary over the same sessions; with ``jobs`` > 1,
    that many configurations at a time, each in a process of its own (forked:
    the runs share nothing, and each result is the one run alone gives)."""
    if jobs <= 1 or len(configs) <= 1:
        return {c: _simulate_one(spec, c, templates, slo_p90_s) for c in configs}
    ordered = sorted(configs, key=lambda c: _COST_ORDER.index(c) if c in _COST_ORDER else 0)
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(min(jobs, len(configs)), mp_context=context) as pool:
        futures = {c: pool.submit(_simulate_one, spec, c, templates, slo_p90_s) for c in ordered}
        return {c: futures[c].result() for c in configs}


def _simulate_one(
    spec: RunSpec, config: str, templates: Sequence[Any], slo_p90_s: float
) -> dict[str, Any]:
    started, cpu = time.monotonic(), time.process_time()
    records, cluster = run(spec, config, templates, hinted=True)
    summary = summarize(records, cluster, spec.sessions or len(templates), slo_p90_s)
    summary["wall_s"] = round(time.monotonic() - started, 2)
    summary["cpu_s"] = round(time.process_time() - cpu, 2)  # wall_s less other work's share
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configs = _configs(args.configs)
    if args.validate is not None:
        if args.preset != TESTBED:
            sys.exit("error: --validate replays the suite's runs on --preset testbed")
        report = validate(args.validate, REPO_ROOT, args.traces, args.family)
        payload: dict[str, Any] = {"benchmark": "simulate", "preset": TESTBED, **report}
        _write(args.out, payload)
        print(report["table"])
        print(f"\nwrote {args.out}")
        return 0 if report["passed"] else 1
    if args.preset not in PRESETS:
        sys.exit(f"error: --preset {args.preset!r}: one of {', '.join(PRESETS)} (or testbed)")
    preset: Preset = PRESETS[args.preset]
    if args.block_tokens:
        preset = preset.with_block_tokens(args.block_tokens)
    pacing = Pacing(
        time_scale=args.time_scale,
        max_wait_s=args.max_wait,
        token_scale=preset.token_scale,
        block_tokens=preset.block_tokens,
        max_out=preset.max_out,
        max_prompt=preset.max_model_len,
    )
    source, templates, control = load_templates(args, pacing, REPO_ROOT)
    rates = [float(r) for r in args.rates.split(",")] if args.rates else [args.rate]
    sweep: list[dict[str, Any]] = []
    for rate in rates:
        spec = RunSpec(
            preset=preset,
            instances=args.instances,
            router=args.router,
            pool_bytes=int(args.pool_gib * GIB),
            rate=rate,
            sessions=args.sessions,
            control=args.control or control,
            seed=args.seed,
            prior_gap_s=pacing.wait(10.0),
            prior_user_wait_s=pacing.wait(60.0),
        )
        summary = simulate(spec, configs, templates, args.slo_p90, args.jobs)
        print(f"\n{preset.description}: {args.instances} instance(s), {args.router} router, "
              f"pool {args.pool_gib:g} GiB, {rate:g} sessions/s, {source}")  # fmt: skip
        print(format_rows(summary))
        sweep.append({"rate": rate, "summary": summary})
    # The sweep's answer: the most sessions per GPU at any rate that met the SLO.
    best = {
        c: max(point["summary"][c]["sessions_per_gpu_at_slo"] for point in sweep) for c in configs
    }
    final = {c: {**s, "sessions_per_gpu_at_slo": best[c]} for c, s in sweep[-1]["summary"].items()}
    payload = {
        "benchmark": "simulate",
        "command": "python -m benchmarks.simulate " + " ".join(argv or sys.argv[1:]),
        "preset": args.preset,
        "description": preset.description,
        "source": source,
        "instances": args.instances,
        "router": args.router,
        "pool_gib": args.pool_gib,
        "slo_p90_s": args.slo_p90,
        "summary": final,
        "sweep": sweep,
    }
    _write(args.out, payload)
    plot = write_sweep_plot(sweep, args.out.with_suffix(".png"), preset.description, args.slo_p90)
    print(f"\nwrote {args.out}\n      {plot}")
    return 0


def _write(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    sys.exit(main())
