"""``python -m benchmarks.report``: the table and plots of saved replay results.

Reads one or more JSON files written by ``python -m benchmarks.replay`` (a later
file's configuration replaces an earlier one of the same name), prints the
comparison table, and writes the merged JSON with its TTFT CDF and
reuse-over-time plots beside it. Use it to re-render a run, or to join a
configuration re-run on its own (the header keeps every source file)::

    python -m benchmarks.report results/matrix.json results/unlimited.json \\
        --out results/matrix-all.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ._plots import write_plots
from ._report import ConfigRun, format_table, read_json, summarize, write_json


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    p.add_argument("inputs", nargs="+", type=Path, help="JSON files of benchmarks.replay")
    p.add_argument("--out", type=Path, required=True, help="merged JSON (plots go beside it)")
    args = p.parse_args(argv)
    missing = [str(path) for path in args.inputs if not path.is_file()]
    if missing:
        sys.exit(f"error: no such file: {', '.join(missing)}")
    header, _ = read_json(args.inputs[0])
    runs: dict[str, ConfigRun] = {}
    for path in args.inputs:
        for run in read_json(path)[1]:
            runs[run.name] = run
    header["merged_from"] = [str(path) for path in args.inputs]
    merged = list(runs.values())
    print(format_table([summarize(r) for r in merged]))
    write_json(args.out, header, merged)
    plots = write_plots(merged, args.out.parent, args.out.stem)
    print(f"\nwrote {args.out}" + "".join(f"\n      {p}" for p in plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
