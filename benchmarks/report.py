"""``python -m benchmarks.report``: the table and plots of saved replay results.

Reads one or more JSON files written by ``python -m benchmarks.replay`` (a later
file's configuration replaces an earlier one of the same name), prints the
comparison table, and writes the merged JSON with its TTFT CDF and
reuse-over-time plots beside it. Use it to re-render a run, or to join a
configuration re-run on its own (the header keeps every source file)::

    python -m benchmarks.report results/matrix.json results/unlimited.json \\
        --out results/matrix-all.json

``FILE:NAME,NAME`` takes only the named configurations of ``FILE``.

With ``--spread`` the files are repeated runs of one matrix instead: it prints
the median and range, over the runs, of each configuration's reuse, prefill and
TTFT and of each ratio (each run's ratios compare configurations measured under
the same conditions), and writes them to ``--out`` if given::

    python -m benchmarks.report --spread results/run1.json results/run2.json results/run3.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from ._plots import write_plots
from ._report import ConfigRun, format_table, read_json, summarize, write_json
from ._spread import format_spread, spread_json


class _Input(NamedTuple):
    """One input: a results file, and which of its configurations to take."""

    path: Path
    names: frozenset[str] | None

    @classmethod
    def parse(cls, text: str) -> _Input:
        path, sep, names = text.rpartition(":")
        if not sep or Path(text).is_file():
            return cls(Path(text), None)
        return cls(Path(path), frozenset(n for n in names.split(",") if n))

    def __str__(self) -> str:
        return str(self.path) + (f":{','.join(sorted(self.names))}" if self.names else "")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    p.add_argument(
        "inputs",
        nargs="+",
        type=_Input.parse,
        help="JSON files of benchmarks.replay, each optionally FILE:NAME,NAME (only those)",
    )
    p.add_argument(
        "--out", type=Path, help="merged JSON (plots go beside it); with --spread, optional"
    )
    p.add_argument(
        "--spread",
        action="store_true",
        help="the inputs are repeated runs: print the median and range of every number and ratio",
    )
    args = p.parse_args(argv)
    missing = [str(i.path) for i in args.inputs if not i.path.is_file()]
    if missing:
        sys.exit(f"error: no such file: {', '.join(missing)}")
    if args.spread:
        return _spread(args.inputs, args.out)
    if args.out is None:
        sys.exit("error: --out is required to merge runs (or pass --spread)")
    header, _ = read_json(args.inputs[0].path)
    runs: dict[str, ConfigRun] = {}
    for source in args.inputs:
        found = read_json(source.path)[1]
        unknown = set(source.names or ()) - {run.name for run in found}
        if unknown:
            sys.exit(f"error: {source.path} has no configuration {', '.join(sorted(unknown))}")
        for run in found:
            if source.names is None or run.name in source.names:
                runs[run.name] = run
    header["merged_from"] = [str(i) for i in args.inputs]
    merged = list(runs.values())
    print(format_table([summarize(r) for r in merged]))
    write_json(args.out, header, merged)
    plots = write_plots(merged, args.out.parent, args.out.stem)
    print(f"\nwrote {args.out}" + "".join(f"\n      {p}" for p in plots))
    return 0


def _spread(inputs: Sequence[_Input], out: Path | None) -> int:
    runs = []
    for source in inputs:
        found = [
            r for r in read_json(source.path)[1] if source.names is None or r.name in source.names
        ]
        runs.append([summarize(r) for r in found])
    print(format_spread(runs))
    if out is not None:
        payload = {"spread_of": [str(i) for i in inputs], **spread_json(runs)}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(payload, indent=1) + "\n")
        print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
