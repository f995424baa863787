"""``python -m benchmarks.agent_replay``: Claude Code sessions through the SDK's own agent loop.

Reads Claude Code transcripts (``~/.claude/projects/*/*.jsonl``, or
``../shared/traces-claude-code``; or, with ``--traces``, the anonymized traces,
or, with ``--generated``, sessions drawn from the figures the repository
carries) and replays each session as a run of ``agentsdk``'s agent loop against
a fresh vLLM server per configuration, all sessions concurrently, same KV
capacity:

- ``plain``: vLLM as shipped, the plain ``openai`` client;
- ``hint-free``: vLLM's own KV offloading with the bytes of the extension's
  tier (``--tier-bytes``) and vLLM's LRU, reading no hint, the plain client:
  what vLLM gives an agent without this project;
- ``hinted``: the agent-hints extension with its defaults (a host-memory KV
  tier of ``--tier-bytes`` included), the SDK's hinted client (its ``gap``,
  ``tool_start``/``tool_end`` with tool names and ETAs, forks, ends);
- ``device-only``: the same with ``--tier none`` (retention on the device only);
- ``prefetch``, ``host``, ``mooncake``: plus warm-ups, a host tier, a
  Mooncake Store tier, as in ``benchmarks.replay``;
- ``unlimited``: plain vLLM with room for every distinct block: the bound.

Each tool call sleeps for its recorded duration divided by ``--time-scale``
(capped at ``--max-think``) and returns a result of the recorded size; each 64
prompt tokens become ``--scale-k`` token ids (4: 1/16 scale); outputs are
forced to their recorded length at the same scale, at most ``--max-out``.
Sessions: the first ``--sessions`` by path (or drawn) with a tool call whose
every prompt fits ``--max-model-len`` minus ``--max-out``; the servers get the
context the longest of them needs. ``--kv-blocks`` defaults to a third of their
live working set (each session's largest prompt, for the sessions in flight at
once). ``--history N``: the agent has run N other sessions of the source
before (their recorded waits, scaled, in ``RunConfig.shared_latency``), as a
deployed agent has; by default it starts from nothing.

Prints a progress bar, the comparison table (ratios against plain, hint-free
and the bound; then each run's ceiling: the reuse LRU and exact future
knowledge, Belady, would reach in its send order at its device KV and with the
tier's blocks added, ``benchmarks._ceiling``) and the calibration table (per
kind of wait: how often the SDK's ETA and the server's prediction were within
2x); writes the JSON (``summary.<config>``, its ``ceiling.device`` and
``ceiling.tiered`` ``lru`` and ``belady``, ``calibration.<kind>``, every
request) and, beside it, a TTFT CDF, a reuse-over-time plot and the
calibration scatter (PNG).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server_ext import LocalServer, make_test_model

from ._agent_replay import AgentRun, agent_replay, learned_latencies
from ._claude_code import PromptMapper, Session, replayed_calls
from ._plots import write_calibration_plot, write_plots
from ._replay import ReplaySettings, RequestRecord
from ._report import (
    ConfigRun,
    format_calibration,
    format_table,
    summarize,
    wait_calibration,
    write_json,
)
from ._run import OnDone, machine, run_config, runnable
from ._server import CONFIGS, Config, ServerPlan, extension_tier_bytes, sigterm_as_exit
from ._sessions import SessionSource, find_source, load_history, load_sessions
from ._traces import PrefixIndex

REPO_ROOT = Path(__file__).resolve().parents[1]

AGENT_CONFIGS: dict[str, Config] = {
    c.name: c
    for c in (
        CONFIGS["plain"],
        CONFIGS["hint-free"],
        Config("hinted", "+ agent-hints extension, defaults (host-memory KV tier)", extension=True),
        Config(
            "device-only",
            "+ agent-hints extension, defaults but device KV only (--tier none)",
            extension=True,
            tier="none",
        ),
        CONFIGS["prefetch"],
        CONFIGS["host"],
        CONFIGS["mooncake"],
        CONFIGS["unlimited"],
    )
}
"""The configurations, in table order."""

DEFAULT_CONFIGS = "plain,hint-free,hinted,unlimited"


def parser(
    prog: str = "python -m benchmarks.agent_replay", description: str | None = __doc__
) -> argparse.ArgumentParser:
    """The command's arguments (the demo reuses them with its own defaults)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--claude-code",
        type=Path,
        help="transcript directory, searched recursively (default: $AGENT_HINTS_CLAUDE_CODE "
        "or ../shared/traces-claude-code; your own: ~/.claude/projects)",
    )
    source.add_argument(
        "--traces",
        type=Path,
        help="anonymized trace directory instead (default: $AGENT_HINTS_TRACES or "
        "../shared/traces; no tool names: every wait is on one tool)",
    )
    source.add_argument(
        "--generated",
        action="store_true",
        help="sessions generated from the figures the repository carries "
        "(benchmarks/workload_figures.json) instead",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --generated sessions")
    p.add_argument("--sessions", type=int, default=8, help="sessions replayed (default 8)")
    p.add_argument("--concurrency", type=int, help="sessions in flight at once (default: all)")
    p.add_argument(
        "--history",
        type=int,
        default=0,
        help="sessions of the source not replayed whose tool and user waits the agent "
        "learned before (RunConfig.shared_latency: its earlier sessions; default 0)",
    )
    p.add_argument("--time-scale", type=float, default=20.0, help="divide recorded waits by this")
    p.add_argument("--max-think", type=float, default=30.0, help="cap on one scaled wait, s")
    p.add_argument(
        "--scale-k", type=int, default=4, help="token ids per 64 prompt tokens (4 = 1/16 scale)"
    )
    p.add_argument("--max-out", type=int, default=32, help="cap on max_tokens per request")
    p.add_argument(
        "--kv-blocks", type=int, help="device KV blocks (default: a third of the working set)"
    )
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument(
        "--max-model-len",
        type=int,
        default=8192,
        help="longest context a session may need (the servers get just what the longest needs)",
    )
    p.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help=f"comma-separated, of: {', '.join(AGENT_CONFIGS)} (default {DEFAULT_CONFIGS})",
    )
    p.add_argument(
        "--extension-config",
        default="{}",
        help="JSON kv_connector_extra_config for the extension (default: its defaults)",
    )
    p.add_argument(
        "--tier-bytes",
        type=int,
        help="host tier budget of the extension (its default tier included) and of "
        "hint-free's offloading, and Mooncake segment size, bytes (default: the "
        "extension's tier_bytes: --extension-config's, else its default, 1 GiB)",
    )
    p.add_argument("--server-args", default="", help="more vLLM flags for every configuration")
    p.add_argument("--model", help="checkpoint directory (default: the generated test model)")
    p.add_argument("--out", type=Path, default=Path("results/agent-replay.json"))
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--sample-period", type=float, default=1.0, help="s between /metrics samples")
    return p


def session_info(
    sessions: Sequence[Session], k: int, block_size: int
) -> tuple[list[dict[str, Any]], int]:
    """Per-session facts, and the distinct prompt blocks of the whole run."""
    index = PrefixIndex(block_size)
    info = []
    for session in sessions:
        mapper = PromptMapper(session, k)
        prompts = [mapper.prompt(branch, call) for branch, call in replayed_calls(session)]
        info.append(
            {
                "id": session.session_id,
                "model": session.model,
                "requests": len(prompts),
                "sub_agents": sum(1 for _ in session.branches()) - 1,
                "tool_calls": session.num_tool_calls,
                "prompt_tokens": sum(len(p) for p in prompts),
                "largest_prompt": max(len(p) for p in prompts),
                "theoretical_cached_tokens": sum(index.add(p) for p in prompts),
                "skipped_lines": session.skipped_lines,
                "dropped_calls": session.dropped_calls,
            }
        )
    return info, index.blocks


def context_length(info: Sequence[Mapping[str, Any]], args: argparse.Namespace) -> int:
    """The servers' context: the longest prompt plus ``--max-out``, in whole blocks, at
    most ``--max-model-len``. No longer, since vLLM's KV must hold one full-length
    request: a longer context would set a floor on ``--kv-blocks``."""
    longest: int = max(i["largest_prompt"] for i in info) + args.max_out
    size: int = args.block_size
    return min(int(args.max_model_len), math.ceil(longest / size) * size)


def kv_plan(
    info: Sequence[Mapping[str, Any]],
    distinct_blocks: int,
    max_model_len: int,
    args: argparse.Namespace,
) -> tuple[int, int, int]:
    """(live working set, device, unlimited) KV blocks.

    The live working set is what keeping the largest prompt of every session in
    flight at once takes; the device default is a third of it (at least one
    full-length request and vLLM's null block); the unlimited run has room for
    every distinct prompt block, a decode block per request and a full-length
    request per session."""
    size = args.block_size
    peaks = sorted((math.ceil(i["largest_prompt"] / size) for i in info), reverse=True)
    working_set = sum(peaks[: args.concurrency or len(peaks)])
    per_request = math.ceil(max_model_len / size)
    device = args.kv_blocks or max(math.ceil(working_set / 3), per_request + 1)
    requests = sum(i["requests"] for i in info)
    unlimited = max(device, distinct_blocks + requests + len(info) * per_request)
    return working_set, device, unlimited


def _calibrated(runs: Sequence[ConfigRun]) -> ConfigRun | None:
    """The run whose waits the calibration scores: the first with hints."""
    return next((r for r in runs if AGENT_CONFIGS[r.name].hints), None)


def _report(
    header: Mapping[str, Any],
    runs: Sequence[ConfigRun],
    errors: Mapping[str, Mapping[str, str]],
) -> dict[str, Any]:
    """The header plus what the runs so far add: summaries (each with its
    ceiling), calibration, failed sessions."""
    scored = _calibrated(runs)
    return {
        **header,
        "summary": {r.name: summarize(r) for r in runs},
        "calibration": wait_calibration(scored.records) if scored is not None else {},
        "calibration_config": scored.name if scored is not None else None,
        "session_errors": {name: dict(e) for name, e in errors.items() if e},
    }


def _run(
    config: Config,
    plan: ServerPlan,
    sessions: Sequence[Session],
    history: Sequence[Session],
    total: int,
    args: argparse.Namespace,
) -> tuple[ConfigRun, AgentRun]:
    replayed = AgentRun()

    async def replay_on(server: LocalServer, on_done: OnDone) -> list[RequestRecord]:
        nonlocal replayed
        settings = ReplaySettings(
            base_url=server.root_url,
            model=server.model,
            k=args.scale_k,
            time_scale=args.time_scale,
            max_think_s=args.max_think,
            max_out=args.max_out,
            hints=config.hints,
            block_size=args.block_size,
            concurrency=args.concurrency,
        )
        learned = learned_latencies(history, settings) if history else None
        replayed = await agent_replay(sessions, settings, history=learned, on_done=on_done)
        return replayed.records

    run = run_config(config, plan, args.out.parent, total, replay_on, args.sample_period)
    theoretical = sum(r.theoretical_cached for r in run.records)
    run.ceiling = plan.ceiling_of(config, replayed.prompts, theoretical)
    for sid, error in replayed.errors.items():
        print(f"[{config.name}] session {sid} failed: {error}", file=sys.stderr)
    return run, replayed


def _configs(names: str) -> list[Config]:
    wanted = [c.strip() for c in names.split(",") if c.strip()]
    unknown = sorted(set(wanted) - set(AGENT_CONFIGS))
    if unknown or not wanted:
        sys.exit(f"error: unknown configs {unknown}; choose from {', '.join(AGENT_CONFIGS)}")
    return runnable([AGENT_CONFIGS[n] for n in wanted])


@dataclass(frozen=True, slots=True)
class Replayed:
    """What ``replay_sessions`` produced: the JSON's content, the runs, the plots."""

    report: dict[str, Any]
    runs: list[ConfigRun]
    plots: list[Path]

    @property
    def ok(self) -> bool:
        """No request and no session failed."""
        summaries = self.report["summary"].values()
        return all(s["failed"] == 0 for s in summaries) and not self.report["session_errors"]


def _extension_config(text: str) -> dict[str, Any]:
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        sys.exit(f"error: --extension-config is not JSON ({e})")
    if not isinstance(config, dict):
        sys.exit("error: --extension-config must be a JSON object")
    return config


def load(
    args: argparse.Namespace, *, fallback: bool = False
) -> tuple[SessionSource, list[Session]]:
    """The source the arguments pick (``_sessions.find_source``) and its first
    ``--sessions`` sessions that have a tool call and fit the context; exits with
    the reason when there are none."""
    try:
        source = find_source(
            REPO_ROOT,
            claude_code=args.claude_code,
            traces=args.traces,
            generated=args.generated,
            fallback=fallback,
        )
    except FileNotFoundError as e:
        sys.exit(f"error: {e}")
    sessions = load_sessions(
        source, args.scale_k, args.max_model_len - args.max_out, args.sessions, args.seed
    )
    if not sessions:
        sys.exit(
            f"error: no session of the {source.describe()} has a tool call and fits "
            "--max-model-len at this --scale-k"
        )
    return source, sessions


def replay_sessions(
    sessions: Sequence[Session], args: argparse.Namespace, source: SessionSource
) -> Replayed:
    """Replay ``sessions`` in every configuration of ``args`` (a fresh server each,
    stopped after it), saying what they are and the KV plan; writes the JSON
    after each configuration and the plots at the end."""
    configs = _configs(args.configs)
    extension_config = _extension_config(args.extension_config)
    info, distinct = session_info(sessions, args.scale_k, args.block_size)
    max_model_len = context_length(info, args)
    working_set, kv_blocks, unlimited_blocks = kv_plan(info, distinct, max_model_len, args)
    for i in info:
        print(
            f"{i['id']}: {i['requests']} requests, {i['tool_calls']} tool calls, "
            f"{i['sub_agents']} sub-agents, {i['prompt_tokens']:,} prompt tokens"
        )
    tier_bytes = (
        args.tier_bytes if args.tier_bytes is not None else extension_tier_bytes(extension_config)
    )
    print(
        f"live working set {working_set} blocks: device KV {kv_blocks} blocks "
        f"({kv_blocks / working_set:.0%}), unlimited {unlimited_blocks}; "
        f"context {max_model_len} tokens; host tier {tier_bytes / 2**20:,.0f} MiB"
    )
    history = load_history(source, sessions, args.history, args.seed)
    if history:
        print(f"the agent learned its tools' waits from {len(history)} earlier sessions")
    header: dict[str, Any] = {
        "benchmark": "agent_replay",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "source": {"kind": source.kind, "path": str(source.path)},
        "machine": machine(),
        "sessions": info,
        "history_sessions": [h.session_id for h in history],
        "working_set_blocks": working_set,
        "kv_blocks": kv_blocks,
        "unlimited_kv_blocks": unlimited_blocks,
        "max_model_len": max_model_len,
        "tier_bytes": tier_bytes,
    }
    total = sum(i["requests"] for i in info)
    runs: list[ConfigRun] = []
    errors: dict[str, dict[str, str]] = {}
    with sigterm_as_exit(), tempfile.TemporaryDirectory(prefix="agent-replay-model-") as tmp:
        plan = ServerPlan(
            model=args.model or str(make_test_model(tmp)),
            kv_blocks=kv_blocks,
            unlimited_blocks=unlimited_blocks,
            block_size=args.block_size,
            max_model_len=max_model_len,
            extra_config=extension_config,
            tier_bytes=tier_bytes,
            server_args=tuple(shlex.split(args.server_args)),
            startup_timeout_s=args.startup_timeout,
        )
        for config in configs:
            run, replayed = _run(config, plan, sessions, history, total, args)
            runs.append(run)
            errors[run.name] = replayed.errors
            write_json(args.out, _report(header, runs, errors), runs)
            if len(runs) < len(configs):  # the table so far; the last one follows below
                print(format_table([summarize(r) for r in runs]), flush=True)

    report = _report(header, runs, errors)
    scored = _calibrated(runs)
    plots = write_plots(runs, args.out.parent, args.out.stem)
    if scored is not None:
        plots.append(write_calibration_plot(scored, args.out.parent, args.out.stem))
    return Replayed(report, runs, plots)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    _configs(args.configs)  # an unknown one fails before any session is read
    _extension_config(args.extension_config)
    source, sessions = load(args)
    replayed = replay_sessions(sessions, args, source)
    report = replayed.report
    print()
    print(format_table(list(report["summary"].values())))
    if report["calibration"]:
        print(f"\nwaits after each response ({report['calibration_config']} run):")
        print(format_calibration(report["calibration"]))
    print(f"\nwrote {args.out}" + "".join(f"\n      {p}" for p in replayed.plots))
    return 0 if replayed.ok else 1


if __name__ == "__main__":
    sys.exit(main())
