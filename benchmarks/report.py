"""``python -m benchmarks.report``: the table and plots of saved replay results.

Reads one or more JSON files written by ``python -m benchmarks.replay`` (a later
file's configuration replaces an earlier one of the same name), prints the
comparison table, and writes the merged JSON with its TTFT CDF and
reuse-over-time plots beside it. Use it to re-render a run, or to join a
configuration re-run on its own (the header keeps every source file)::

    python -m benchmarks.report results/matrix.json results/unlimited.json \\
        --out results/matrix-all.json

``FILE:NAME,NAME`` takes only the named configurations of ``FILE``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from ._plots import write_plots
from ._report import ConfigRun, format_table, read_json, summarize, write_json


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
    p.add_argument("--out", type=Path, required=True, help="merged JSON (plots go beside it)")
    args = p.parse_args(argv)
    missing = [str(i.path) for i in args.inputs if not i.path.is_file()]
    if missing:
        sys.exit(f"error: no such file: {', '.join(missing)}")
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


if __name__ == "__main__":
    sys.exit(main())
