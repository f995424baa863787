"""Command line: ``python -m hints_spec {parse-header,vectors,bench}``.

Exit codes: 0 success, 1 conformance failures, 2 invalid input or usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import timeit
from pathlib import Path

from ._errors import HintError
from ._header import parse_header
from ._vectors import VECTORS_DIR, VectorFormatError, check_case, load_cases

TYPICAL_HEADER = 'v=1, sid="sess-42", br="root", gap=12.5, ttl=600'


def _parse_header(value: str) -> int:
    try:
        hints = parse_header(value)
    except HintError as error:
        print(f"{error.code.value}: {error.message}", file=sys.stderr)
        return 2
    print(json.dumps(hints.normalized()))
    return 0


def _vectors(path: Path) -> int:
    try:
        cases = load_cases(path)
    except VectorFormatError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    failures = [(case, problem) for case in cases if (problem := check_case(case)) is not None]
    for case, problem in failures:
        print(f"FAIL {case.id}: {problem}")
    print(f"{len(cases) - len(failures)} passed, {len(failures)} failed, {len(cases)} vectors")
    return 1 if failures else 0


def _bench(n: int) -> int:
    # The best of several runs of CPU time: the cost of the code, not of its neighbours.
    runs = timeit.repeat(
        lambda: parse_header(TYPICAL_HEADER), number=n, repeat=5, timer=time.process_time
    )
    print(f"parse_header+validate: {min(runs) / n * 1e6:.2f} us/call (n={n}, best of 5)")
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hints_spec", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    parse = commands.add_parser("parse-header", help="print a header value's normalized hint")
    parse.add_argument("value", help="the Agent-Hints field value")
    vectors = commands.add_parser("vectors", help="run the conformance vectors")
    vectors.add_argument(
        "path",
        nargs="?",
        type=Path,
        default=VECTORS_DIR,
        help="a vector file or directory (default: the packaged vectors)",
    )
    bench = commands.add_parser("bench", help="time parse+validate of a typical header")
    bench.add_argument("--n", type=_positive, default=20_000, help="calls per run")
    args = parser.parse_args(argv)
    if args.command == "parse-header":
        return _parse_header(args.value)
    if args.command == "vectors":
        return _vectors(args.path)
    return _bench(args.n)


if __name__ == "__main__":
    sys.exit(main())
