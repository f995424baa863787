"""``python -m benchmarks.suite``: does the extension, with its defaults, ever lose to plain vLLM?

Every family of workloads (``benchmarks._suite.FAMILIES``: the development
matrix, dense and sparse traffic, more sessions than fit, the SDK's client
style, half the traffic unhinted) runs plain vLLM, the hint-free baseline
(``hint-free``: vLLM's own KV offloading with the bytes of the extension's
tier and vLLM's LRU, no hint read), the extension exactly as ``python -m
server_ext serve MODEL`` starts it, and the unlimited bound, each on a fresh
server with the same KV, ``--repeats`` times, on a quiet machine and beside a
busy neighbour (one process keeping a core busy through the whole family). It
prints, per family and condition, the median and range over the repeats of
each ratio against plain and against hint-free, each configuration's ceiling
(the reuse LRU and Belady's policy reach in its own send order, at the
device's KV and with the tier's: ``benchmarks._ceiling``), a pass/fail verdict
(reuse at least plain's, TTFT mean and p90 at most 1.05x plain's, no failed
request, no more preemptions than plain; in mixed traffic the unhinted
sessions' TTFT too; the extension's reuse and TTFT against hint-free beside
them, shown but not counted), and writes the JSON (``--out``: each run's
``summary.ceiling``) and a plot of the ratios beside it. With
``--configs plain,extension,plain-again`` each repeat runs plain twice, and each
verdict line shows plain's ratio against itself (the test bed's noise) beside the
extension's. ``--quick``: one
repeat of two families, about 15 minutes on 2 cores. Results are saved after
every run; ``--resume`` skips the runs a previous invocation saved.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from server_ext import LocalServer, make_test_model

from . import agent_replay
from ._agent_replay import agent_replay as agent_run
from ._plots import write_ratio_plot
from ._replay import ReplaySettings, RequestRecord, replay
from ._report import summarize
from ._run import OnDone, Replay, machine, run_config
from ._server import ServerPlan, extension_tier_bytes, sigterm_as_exit
from ._spread import format_spread, spread_json
from ._suite import (
    CONDITIONS,
    DEFAULT_CONFIGS,
    FAMILIES,
    NOISE_CONFIG,
    QUICK_FAMILIES,
    SUITE_CONFIGS,
    TTFT_BOUND,
    Check,
    Family,
    busy_neighbour,
    checks,
    group_summary,
    rotated,
)
from ._traces import (
    default_traces_dir,
    request_prompts,
    select_traces,
    trace_info,
    trace_requests,
    unlimited_blocks,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
_NEIGHBOUR_LIMIT_S = 4 * 3600.0
"""A neighbour outlives no family: it stops itself after this at the latest."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.suite", description=__doc__)
    p.add_argument("--traces", type=Path, help="default: $AGENT_HINTS_TRACES or ../shared/traces")
    p.add_argument(
        "--claude-code",
        type=Path,
        help="Claude Code transcripts for the claude-code family (default: "
        "$AGENT_HINTS_CLAUDE_CODE or ../shared/traces-claude-code)",
    )
    p.add_argument(
        "--quick", action="store_true", help=f"one repeat of {', '.join(QUICK_FAMILIES)}"
    )
    p.add_argument("--repeats", type=int, help="runs of each configuration (default 3; quick: 1)")
    p.add_argument("--families", help="comma-separated, of: " + ", ".join(FAMILIES))
    p.add_argument(
        "--conditions",
        default=",".join(CONDITIONS),
        help="comma-separated, of: quiet, noisy (default: both)",
    )
    p.add_argument(
        "--configs",
        default=",".join(DEFAULT_CONFIGS),
        help=f"of: {','.join(SUITE_CONFIGS)} (default: {','.join(DEFAULT_CONFIGS)}); "
        f"{NOISE_CONFIG} runs plain twice per repeat, and the verdict shows plain's "
        "ratios against itself beside the extension's",
    )
    p.add_argument(
        "--extension-config",
        default="{}",
        help="JSON kv_connector_extra_config (default: none, the extension's defaults)",
    )
    p.add_argument("--sessions", type=int, help="override each family's number of sessions")
    p.add_argument("--max-requests", type=int, help="override each family's requests per session")
    p.add_argument("--scale-k", type=int, default=4, help="token ids per 64-token hash block")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--max-out", type=int, default=32)
    p.add_argument("--model", help="checkpoint directory (default: the generated test model)")
    p.add_argument("--out", type=Path, default=Path("results/suite.json"))
    p.add_argument("--resume", action="store_true", help="keep the runs --out already holds")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    return p


def _names(text: str, known: Mapping[str, object], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(known))
    if unknown or not names:
        sys.exit(f"error: unknown {what} {unknown}; choose from {', '.join(known)}")
    return names


class _Suite:
    """The runs of one invocation and what they add up to; saved after each run."""

    def __init__(self, args: argparse.Namespace, extension_config: dict[str, Any]) -> None:
        self.args = args
        self.extension_config = extension_config
        self.created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        # family -> condition -> repeat -> config -> {"summary", "unhinted"}
        self.results: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
        self.workloads: dict[str, Any] = {}
        if args.resume and args.out.is_file():
            saved = json.loads(args.out.read_text())
            if saved.get("extension_config") != extension_config:
                sys.exit("error: --resume with another --extension-config than the saved runs")
            self.results = saved.get("runs", {})
            self.workloads = saved.get("workloads", {})

    def done(self, family: str, condition: str, repeat: int, config: str) -> bool:
        return config in self.results.get(family, {}).get(condition, {}).get(str(repeat), {})

    def add(
        self, family: str, condition: str, repeat: int, config: str, run: dict[str, Any]
    ) -> None:
        by_repeat = self.results.setdefault(family, {}).setdefault(condition, {})
        by_repeat.setdefault(str(repeat), {})[config] = run
        self.save()

    def complete_repeats(self, family: str, condition: str) -> list[dict[str, Any]]:
        """The repeats of a family and condition that ran plain and the extension."""
        by_repeat = self.results.get(family, {}).get(condition, {})
        return [
            by_repeat[r]
            for r in sorted(by_repeat, key=int)
            if {"plain", "extension"} <= by_repeat[r].keys()
        ]

    def verdict(self) -> list[Check]:
        found: list[Check] = []
        for family, conditions in self.results.items():
            for condition in conditions:
                repeats = self.complete_repeats(family, condition)
                if not repeats:
                    continue
                summaries = [{c: run["summary"] for c, run in r.items()} for r in repeats]
                groups = [
                    {c: run["unhinted"] for c, run in r.items()}
                    for r in repeats
                    if all(run.get("unhinted") for run in r.values())
                ]
                found += checks(family, condition, summaries, groups)
        return found

    def spread(self, family: str, condition: str) -> dict[str, Any]:
        repeats = self.complete_repeats(family, condition)
        return spread_json([[run["summary"] for run in r.values()] for r in repeats])

    def save(self) -> None:
        verdict = self.verdict()
        payload = {
            "benchmark": "suite",
            "created": self.created,
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(self.args).items()},
            "machine": machine(),
            "extension_config": self.extension_config,
            # The extension's tier and hint-free's offloading, in every family.
            "tier_bytes": extension_tier_bytes(self.extension_config),
            "workloads": self.workloads,
            "runs": self.results,
            "spread": {
                family: {c: self.spread(family, c) for c in conditions}
                for family, conditions in self.results.items()
            },
            "verdict": [
                {**dataclasses.asdict(c), "passed": c.passed, "within_noise": c.within_noise}
                for c in verdict
            ],
            "passed": _passed(verdict),
        }
        self.args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload, indent=1))
        tmp.replace(self.args.out)


def _passed(verdict: Sequence[Check]) -> bool:
    """Whether every check the verdict counts passed (and there was one)."""
    counted = [c for c in verdict if c.counts]
    return bool(counted) and all(c.passed for c in counted)


@dataclass(frozen=True, slots=True)
class _Workload:
    """What a family replays, ready to run: the shared server plan, the number
    of requests (for the progress bar), the sessions that send no hints, the
    facts for the JSON, and how one configuration replays it (with hints or
    not), appending each prompt it sent, in send order, to the list given."""

    plan: ServerPlan
    total: int
    unhinted: frozenset[str]
    facts: dict[str, Any]
    replay: Callable[[bool, list[list[int]]], Replay]


def _trace_workload(suite: _Suite, family: Family, model: str) -> _Workload:
    """A family of the anonymized traces, replayed by ``benchmarks._replay``."""
    args = suite.args
    traces = select_traces(
        args.traces or default_traces_dir(REPO_ROOT),
        args.scale_k,
        args.max_model_len - args.max_out,
        n_traces=args.sessions or family.n_traces,
        max_requests=args.max_requests or family.max_requests,
    )
    info, distinct = trace_info(traces, args.scale_k, args.block_size)
    unhinted = family.unhinted([t.trace_id for t in traces])
    plan = ServerPlan(
        model=model,
        kv_blocks=family.kv_blocks,
        unlimited_blocks=unlimited_blocks(
            info, distinct, family.kv_blocks, args.max_model_len, args.block_size
        ),
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        extra_config=suite.extension_config,
        tier_bytes=extension_tier_bytes(suite.extension_config),
        startup_timeout_s=args.startup_timeout,
    )
    prompts = request_prompts(trace_requests(traces), args.scale_k)

    def replay_with(hinted: bool, sent: list[list[int]]) -> Replay:
        async def replay_on(server: LocalServer, on_done: OnDone) -> list[RequestRecord]:
            settings = ReplaySettings(
                base_url=server.root_url,
                model=server.model,
                k=args.scale_k,
                time_scale=family.time_scale,
                max_think_s=family.max_think_s,
                max_out=args.max_out,
                hints=hinted,
                block_size=args.block_size,
                control=family.control,
                unhinted=unhinted,
            )
            timeout = httpx2.Timeout(settings.request_timeout_s, connect=10.0)
            async with httpx2.AsyncClient(timeout=timeout) as client:
                records = await replay(traces, settings, client, on_done=on_done)
            sent.extend(prompts[(r.trace_id, r.branch, r.seq)] for r in records)
            return records

        return replay_on

    total = sum(t.num_requests for t in traces)
    return _Workload(plan, total, unhinted, {"traces": info}, replay_with)


def _agent_workload(suite: _Suite, family: Family, model: str) -> _Workload:
    """A family of Claude Code sessions, replayed through the SDK's own agent
    loop (``benchmarks.agent_replay``: tool-aware hints, control events)."""
    args = suite.args
    options = [
        "--sessions", str(args.sessions or family.n_traces),
        "--time-scale", str(family.time_scale), "--max-think", str(family.max_think_s),
        "--scale-k", str(args.scale_k), "--max-out", str(args.max_out),
        "--block-size", str(args.block_size), "--max-model-len", str(args.max_model_len),
    ]  # fmt: skip
    if args.claude_code is not None:
        options += ["--claude-code", str(args.claude_code)]
    agent_args = agent_replay.parser().parse_args(options)
    source, sessions = agent_replay.load(agent_args)
    info, distinct = agent_replay.session_info(sessions, args.scale_k, args.block_size)
    max_model_len = agent_replay.context_length(info, agent_args)
    _, kv_blocks, unlimited = agent_replay.kv_plan(info, distinct, max_model_len, agent_args)
    plan = ServerPlan(
        model=model,
        kv_blocks=kv_blocks,
        unlimited_blocks=unlimited,
        block_size=args.block_size,
        max_model_len=max_model_len,
        extra_config=suite.extension_config,
        tier_bytes=extension_tier_bytes(suite.extension_config),
        startup_timeout_s=args.startup_timeout,
    )

    def replay_with(hinted: bool, sent: list[list[int]]) -> Replay:
        async def replay_on(server: LocalServer, on_done: OnDone) -> list[RequestRecord]:
            settings = ReplaySettings(
                base_url=server.root_url,
                model=server.model,
                k=args.scale_k,
                time_scale=family.time_scale,
                max_think_s=family.max_think_s,
                max_out=args.max_out,
                hints=hinted,
                block_size=args.block_size,
            )
            replayed = await agent_run(sessions, settings, on_done=on_done)
            sent.extend(replayed.prompts)
            return replayed.records

        return replay_on

    facts = {"source": source.describe(), "sessions": info}
    return _Workload(plan, sum(i["requests"] for i in info), frozenset(), facts, replay_with)


def _run_family(
    suite: _Suite,
    family: Family,
    condition: str,
    repeats: int,
    config_names: Sequence[str],
    model: str,
) -> None:
    args = suite.args
    configs = [SUITE_CONFIGS[n] for n in config_names]
    pending = [
        (r, c)
        for r in range(repeats)
        for c in rotated(configs, r)
        if not suite.done(family.name, condition, r, c.name)
    ]
    if not pending:
        return
    build = _agent_workload if family.source == "claude-code" else _trace_workload
    try:
        workload = build(suite, family, model)
    except SystemExit as e:  # the family's sessions are not on this machine
        print(f"skipping {family.name}: {e}", file=sys.stderr)
        return
    suite.workloads[family.name] = {
        "description": family.description,
        "family": dataclasses.asdict(family),
        "unhinted": sorted(workload.unhinted),
        **workload.facts,
    }
    with busy_neighbour(condition == "noisy", _NEIGHBOUR_LIMIT_S):
        for repeat, config in pending:
            print(f"== {family.name} / {condition} / repeat {repeat + 1} of {repeats}", flush=True)
            logs = args.out.with_name(f"{args.out.stem}-logs")
            sent: list[list[int]] = []
            run = run_config(
                config, workload.plan, logs, workload.total, workload.replay(config.hints, sent)
            )
            theoretical = sum(r.theoretical_cached for r in run.records)
            run.ceiling = workload.plan.ceiling_of(config, sent, theoretical)
            entry: dict[str, Any] = {"summary": summarize(run)}
            if workload.unhinted:
                entry["unhinted"] = group_summary(run, workload.unhinted)
            suite.add(family.name, condition, repeat, config.name, entry)


def _report(suite: _Suite) -> str:
    lines: list[str] = []
    for family, conditions in suite.results.items():
        for condition in conditions:
            repeats = suite.complete_repeats(family, condition)
            if repeats:
                lines += [
                    f"\n## {family} / {condition}",
                    format_spread([[run["summary"] for run in r.values()] for r in repeats]),
                ]
    verdict = suite.verdict()
    if verdict:
        lines.append("\nverdict (medians over the repeats; the extension with its defaults)")
        for c in verdict:
            value = "-" if c.value is None else f"{c.value:.3f}"
            sign = "<=" if c.at_most else ">="
            mark = ("pass" if c.passed else "FAIL") if c.counts else "info"
            noise = (
                ""
                if c.noise is None
                else f"   plain/plain {c.noise.low:.3f}-{c.noise.high:.3f}"
                + (" (within)" if c.within_noise else "")
            )
            lines.append(
                f"  {mark}  {c.family:<11} {c.condition:<6} {c.what:<38} {value:>7} {sign} "
                f"{c.bound}{noise}"
            )
        if not all(c.counts for c in verdict):
            lines.append(
                "  (info: against the hint-free baseline, vLLM's offloading at the same bytes; "
                "shown beside plain's, not counted)"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    families = _names(
        args.families or ",".join(QUICK_FAMILIES if args.quick else FAMILIES), FAMILIES, "families"
    )
    conditions = _names(args.conditions, dict.fromkeys(CONDITIONS), "conditions")
    configs = _names(args.configs, SUITE_CONFIGS, "configs")
    if not {"plain", "extension"} <= set(configs):
        sys.exit("error: the suite compares the extension with plain: --configs needs both")
    repeats = args.repeats or (1 if args.quick else 3)
    try:
        extension_config = json.loads(args.extension_config)
    except json.JSONDecodeError as e:
        sys.exit(f"error: --extension-config is not JSON ({e})")
    if not isinstance(extension_config, dict):
        sys.exit("error: --extension-config must be a JSON object")
    traces_dir: Path = args.traces or default_traces_dir(REPO_ROOT)
    if not traces_dir.is_dir() and any(FAMILIES[n].source == "traces" for n in families):
        sys.exit(
            f"error: trace directory {traces_dir} not found: pass --traces DIR or set "
            "AGENT_HINTS_TRACES"
        )
    suite = _Suite(args, extension_config)
    with sigterm_as_exit(), tempfile.TemporaryDirectory(prefix="suite-model-") as tmp:
        model = args.model or str(make_test_model(tmp))
        for condition in conditions:
            for name in families:
                _run_family(suite, FAMILIES[name], condition, repeats, configs, model)
    suite.save()
    print(_report(suite))
    rows = [
        (f"{family} / {condition}{suffix}", ratios.get(f"{config} / plain", {}))
        for family, conditions in suite.results.items()
        for condition in conditions
        if (ratios := suite.spread(family, condition)["ratios"])
        for config, suffix in (("extension", ""), (NOISE_CONFIG, ": plain again"))
        if f"{config} / plain" in ratios
    ]
    plot = write_ratio_plot(rows, args.out.with_name(args.out.stem + "-ratios.png"), TTFT_BOUND)
    print(f"\nwrote {args.out}\n      {plot}")
    return 0 if all(c.passed for c in suite.verdict() if c.counts) else 1


if __name__ == "__main__":
    sys.exit(main())
