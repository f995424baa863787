"""``python -m benchmarks.workload_figures``: measure the figures the generated sessions draw from.

Reads the Claude Code transcripts (``--claude-code``, default
``$AGENT_HINTS_CLAUDE_CODE`` or ``../shared/traces-claude-code``) and the
anonymized traces (``--traces``, default ``$AGENT_HINTS_TRACES`` or
``../shared/traces``), measures each statistic of a session on the sets that
have it (``_synthetic.measure``) and writes them, with which data, when and how,
to ``benchmarks/workload_figures.json``: the file the demo's generated
sessions are drawn from, so that a clone needs nothing beside it.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ._claude_code import default_claude_code_dir, read_session
from ._sessions import session_from_trace
from ._synthetic import FIGURES_PATH, QUANTILE_POINTS, TRACES, TRANSCRIPTS, measure
from ._traces import default_traces_dir, load_trace

REPO_ROOT = Path(__file__).resolve().parents[1]

EXCLUDED = ("all_images_local__*",)
"""Transcripts left out by default: the development set's sessions of a local
model, whose Bash waits carry a ~7 s floor of their harness, not of the tools."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.workload_figures", description=__doc__)
    p.add_argument("--claude-code", type=Path, help="Claude Code transcript directory")
    p.add_argument("--traces", type=Path, help="anonymized trace directory")
    p.add_argument(
        "--exclude",
        action="append",
        help=f"transcript file names (glob) to leave out (default: {', '.join(EXCLUDED)})",
    )
    p.add_argument("--out", type=Path, default=FIGURES_PATH)
    return p


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is beside or in it."""
    try:
        return os.path.relpath(path.resolve(), REPO_ROOT)
    except ValueError:
        return str(path)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    transcripts_dir: Path = args.claude_code or default_claude_code_dir(REPO_ROOT)
    traces_dir: Path = args.traces or default_traces_dir(REPO_ROOT)
    for path, flag in ((transcripts_dir, "--claude-code"), (traces_dir, "--traces")):
        if not path.is_dir():
            sys.exit(f"error: {path} not found: pass {flag} DIR")
    excluded: list[str] = args.exclude if args.exclude is not None else list(EXCLUDED)
    paths = sorted(transcripts_dir.rglob("*.jsonl"))
    kept = [p for p in paths if not any(fnmatch.fnmatch(p.name, g) for g in excluded)]
    transcripts = [read_session(p) for p in kept]
    traces = [session_from_trace(load_trace(p)) for p in sorted(traces_dir.glob("*.json"))]
    if not transcripts or not traces:
        sys.exit(f"error: no sessions in {transcripts_dir} or {traces_dir}")
    provenance = {
        "written_by": "python -m benchmarks.workload_figures",
        "created": datetime.date.today().isoformat(),
        "sets": {
            TRANSCRIPTS: {
                "path": _shown(transcripts_dir),
                "sessions": len(transcripts),
                "left_out": {"patterns": excluded, "sessions": len(paths) - len(kept)},
            },
            TRACES: {"path": _shown(traces_dir), "sessions": len(traces)},
        },
        "distributions": (
            f"quantiles: {QUANTILE_POINTS} evenly spaced (minimum, 5%, ..., maximum), "
            "draws interpolate between neighbours; counts: how often each value was seen. "
            "Tokens at full scale, waits in seconds as recorded."
        ),
    }
    figures = measure(transcripts, traces, provenance)
    figures.write(args.out)
    print(
        f"wrote {args.out}: {len(transcripts)} transcripts ({len(paths) - len(kept)} left out), "
        f"{len(traces)} traces"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
