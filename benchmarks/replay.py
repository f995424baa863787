"""``python -m benchmarks.replay``: real agentic traces through vLLM, with and without hints.

Each configuration gets a fresh server (one at a time, same KV capacity) and
replays the same traces, all sessions concurrently. The matrix, each row adding
one mechanism to the one above:

- ``plain``: vLLM as shipped, ``--kv-blocks`` of KV;
- ``hint-free``: plus vLLM's own KV offloading at ``--tier-bytes`` with its
  LRU, reading no hint (clients send none): the baseline a tier must beat;
- ``retention``: plus the agent-hints extension, clients send hints;
- ``prefetch``: plus re-prefill warm-ups of idle branches before they return;
- ``host``: plus a host-memory KV tier below the device cache;
- ``mooncake``: the tier in a Mooncake Store instead (a local master is started);
- ``unlimited``: plain vLLM with room for every distinct prompt block: the bound.

Scaling: each 64-token trace block becomes ``--scale-k`` token ids (4: 1/16
scale), think times are divided by ``--time-scale`` and capped at
``--max-think`` s, ``max_tokens`` is the trace's output at the same scale, at
most ``--max-out``.

Trace choice: by default the first ``--n-traces`` traces by id whose every
prompt (sub-agents included) fits ``--max-model-len`` minus ``--max-out`` at
this scale, so none is cut short (with 8: trace_0075, 0100, 0138, 0150, 0173,
0272, 0274 (three sub-agents), 0283). ``--trace-ids`` replays named traces
instead, each cut before its first prompt that does not fit.

Reuse is reported against the theoretical maximum computed from the prompts in
issue order (``benchmarks._traces.PrefixIndex``), and beside each run its
ceiling: the reuse LRU and Belady's policy reach in its send order, at its
device KV and with the tier's blocks added (``benchmarks._ceiling``; JSON:
``configs.<config>.summary.ceiling``). Writes the JSON (``--out``) and, beside
it, a TTFT CDF and a reuse-over-time plot (PNG).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx2

from server_ext import LocalServer, make_test_model

from ._plots import write_plots
from ._replay import ReplaySettings, RequestRecord, replay
from ._report import ConfigRun, format_table, summarize, write_json
from ._run import OnDone, machine, run_config, runnable
from ._server import CONFIGS, Config, ServerPlan, sigterm_as_exit
from ._traces import (
    Trace,
    default_traces_dir,
    request_prompts,
    select_traces,
    trace_info,
    trace_requests,
    unlimited_blocks,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
_ORACLE_NOTE = "hints: ORACLE (the trace's true next waits): a diagnostic, not a result"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.replay", description=__doc__)
    p.add_argument(
        "--traces",
        type=Path,
        help="trace directory (default: $AGENT_HINTS_TRACES or ../shared/traces)",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--trace-ids", help="comma-separated trace ids (truncated to the requests that fit)"
    )
    which.add_argument(
        "--n-traces", type=int, default=8, help="first N traces by id that fit whole (default 8)"
    )
    p.add_argument(
        "--scale-k", type=int, default=4, help="token ids per 64-token hash block (4 = 1/16 scale)"
    )
    p.add_argument("--time-scale", type=float, default=20.0, help="divide think times by this")
    p.add_argument("--max-think", type=float, default=30.0, help="cap on one scaled wait, s")
    p.add_argument("--max-out", type=int, default=32, help="cap on max_tokens per request")
    p.add_argument(
        "--max-requests-per-trace",
        type=int,
        help="root requests kept per trace (and per sub-agent)",
    )
    p.add_argument("--concurrency", type=int, help="sessions in flight at once (default: all)")
    p.add_argument("--kv-blocks", type=int, default=256)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument(
        "--configs", default=",".join(CONFIGS), help="comma-separated, of: " + ", ".join(CONFIGS)
    )
    p.add_argument(
        "--extension-config", default="{}", help="JSON kv_connector_extra_config for the extension"
    )
    p.add_argument(
        "--tier-bytes",
        type=int,
        default=2 << 30,
        help="host tier budget (of hint-free's offloading too) and Mooncake segment size, "
        "bytes (default 2 GiB)",
    )
    p.add_argument(
        "--server-args",
        default="",
        help='more vLLM flags for every configuration, e.g. --server-args="--dtype float32"',
    )
    p.add_argument(
        "--tenant-per-trace",
        action="store_true",
        help="each trace sends its own API key (a tenant of its own for the extension's budgets)",
    )
    p.add_argument(
        "--oracle-gaps",
        action="store_true",
        help="diagnostic: hints carry each request's true next wait (the trace's future)",
    )
    p.add_argument("--model", help="checkpoint directory (default: the generated test model)")
    p.add_argument("--out", type=Path, default=Path("results/replay.json"))
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--sample-period", type=float, default=1.0, help="s between /metrics samples")
    return p


def _run_config(
    config: Config,
    plan: ServerPlan,
    traces: Sequence[Trace],
    args: argparse.Namespace,
) -> ConfigRun:
    async def replay_on(server: LocalServer, on_done: OnDone) -> list[RequestRecord]:
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
            tenant_per_trace=args.tenant_per_trace,
            oracle_gaps=args.oracle_gaps,
        )
        timeout = httpx2.Timeout(settings.request_timeout_s, connect=10.0)
        async with httpx2.AsyncClient(timeout=timeout) as client:
            return await replay(traces, settings, client, on_done=on_done)

    total = sum(t.num_requests for t in traces)
    run = run_config(config, plan, args.out.parent, total, replay_on, args.sample_period)
    prompts = request_prompts(trace_requests(traces), args.scale_k)
    sent = [prompts[(r.trace_id, r.branch, r.seq)] for r in run.records]
    run.ceiling = plan.ceiling_of(config, sent, sum(r.theoretical_cached for r in run.records))
    return run


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown or not names:
        sys.exit(f"error: unknown configs {unknown}; choose from {', '.join(CONFIGS)}")
    try:
        extension_config = json.loads(args.extension_config)
    except json.JSONDecodeError as e:
        sys.exit(f"error: --extension-config is not JSON ({e})")
    if not isinstance(extension_config, dict):
        sys.exit("error: --extension-config must be a JSON object")
    configs = runnable([CONFIGS[n] for n in names])
    traces_dir: Path = args.traces or default_traces_dir(REPO_ROOT)
    if not traces_dir.is_dir():
        sys.exit(
            f"error: trace directory {traces_dir} not found: pass --traces DIR or set "
            "AGENT_HINTS_TRACES (the traces live in ../shared/traces, outside the repository)"
        )
    traces = select_traces(
        traces_dir,
        args.scale_k,
        args.max_model_len - args.max_out,
        trace_ids=args.trace_ids.split(",") if args.trace_ids else None,
        n_traces=args.n_traces,
        max_requests=args.max_requests_per_trace,
    )
    if not traces:
        sys.exit("error: no trace fits --max-model-len at this --scale-k")
    info, distinct_blocks = trace_info(traces, args.scale_k, args.block_size)
    unlimited = unlimited_blocks(
        info, distinct_blocks, args.kv_blocks, args.max_model_len, args.block_size
    )
    if args.oracle_gaps:
        print(_ORACLE_NOTE)
    for i in info:
        print(
            f"{i['id']}: {i['requests']} requests, {i['branches']} branches, "
            f"{i['prompt_tokens']:,} prompt tokens"
        )

    header: dict[str, Any] = {
        "benchmark": "replay",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": machine(),
        "traces": info,
        "unlimited_kv_blocks": unlimited,
    }
    with sigterm_as_exit(), tempfile.TemporaryDirectory(prefix="replay-model-") as tmp:
        model = args.model or str(make_test_model(tmp))
        plan = ServerPlan(
            model=model,
            kv_blocks=args.kv_blocks,
            unlimited_blocks=unlimited,
            block_size=args.block_size,
            max_model_len=args.max_model_len,
            extra_config=extension_config,
            tier_bytes=args.tier_bytes,
            server_args=tuple(shlex.split(args.server_args)),
            startup_timeout_s=args.startup_timeout,
        )
        runs: list[ConfigRun] = []
        for config in configs:
            runs.append(_run_config(config, plan, traces, args))
            write_json(args.out, header, runs)  # partial results survive a later failure
            if len(runs) < len(configs):  # the table so far; the last one follows below
                print(format_table([summarize(r) for r in runs]), flush=True)

    summaries = [summarize(r) for r in runs]
    print()
    print(format_table(summaries))
    if args.oracle_gaps:
        print("\n" + _ORACLE_NOTE)
    plots = write_plots(runs, args.out.parent, args.out.stem)
    print(f"\nwrote {args.out}" + "".join(f"\n      {p}" for p in plots))
    return 0 if all(s["failed"] == 0 for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
