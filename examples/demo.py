"""The README's main job: agents on vLLM, the plain client vs the hinted SDK, side by side.

Runs agent sessions through the project's own agent loop (``Agent``, ``Runner``,
a real ``@tool`` per tool kind, sub-agents by ``Runner.fan_out``: the agent
replay of ``benchmarks.agent_replay``) against a local vLLM CPU server (the
generated tiny model, random weights) three times, all at the same KV capacity
(a third of the sessions' live working set): as shipped with the plain
``openai`` client; hint-free, vLLM's own KV offloading with as many host bytes
as the extension's tier and vLLM's LRU, reading no hint, with the plain client
again; then with the agent-hints extension at its defaults (its host tier at
those same bytes, passed to both) and the SDK's hinted client. Prints the
comparison (ratios against plain and against hint-free, and each run's
ceiling: the reuse LRU and exact future knowledge would reach in its send
order, at the device's KV and with the tier's), and where the JSON and the
plots went, and stops its servers. About 6 minutes on 2 cores.

The sessions are the real sets where they are found (``--claude-code DIR`` or
``--traces DIR``, ``$AGENT_HINTS_CLAUDE_CODE`` or ``$AGENT_HINTS_TRACES``, or
``../shared`` beside the repository); on a clone alone, sessions generated from
the figures measured on those sets, which the repository carries
(``benchmarks/workload_figures.json``; ``--generated`` picks them anyway).

    python -m examples.demo [--sessions N] [--generated] [any benchmarks.agent_replay flag]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks import agent_replay
from benchmarks._claude_code import Session
from benchmarks._report import format_table
from benchmarks._sessions import SessionSource

DEFAULTS = {
    "sessions": 24,
    "concurrency": 8,
    "configs": "plain,hint-free,hinted",
    "out": Path("results/demo.json"),
}
"""What the demo changes of ``benchmarks.agent_replay``'s defaults: sized to finish
in a few minutes on 2 cores (server starts included), 8 sessions in flight; the
tier's bytes stay the extension's own (``--tier-bytes`` unset), for hint-free too."""


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = agent_replay.parser("python -m examples.demo", __doc__)
    parser.set_defaults(**DEFAULTS)
    return parser.parse_args(argv)


def workload(args: argparse.Namespace) -> tuple[SessionSource, list[Session]]:
    """The demo's sessions: the real sets where found, else the generated ones."""
    return agent_replay.load(args, fallback=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(argv)
    source, sessions = workload(args)
    print(
        f"agent-hints demo: {len(sessions)} agent sessions ({source.describe()}) through "
        "agentsdk's Agent and Runner: plain vLLM and the openai client, vLLM's own KV "
        "offloading (hint-free, same bytes as the tier), then vLLM + agent-hints and the "
        "hinted client"
    )
    replayed = agent_replay.replay_sessions(sessions, args, source)
    report = replayed.report
    print()
    print(format_table(list(report["summary"].values())))
    waits = report["calibration"].get("all")
    if waits is not None and waits["client_within_2x"] is not None:
        recorded = waits["client_within_2x_recorded"]
        print(
            f"\nthe SDK's ETAs ({report['calibration_config']} run): within 2x of the wait for "
            f"{100 * waits['client_within_2x']:.0f}% of {waits['waits']} waits on tools and users"
            + (f" ({100 * recorded:.0f}% of the recorded waits)" if recorded is not None else "")
        )
    print(f"\nwrote {args.out}" + "".join(f"\n      {p}" for p in replayed.plots))
    return 0 if replayed.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
