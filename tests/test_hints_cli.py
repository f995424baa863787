"""``python -m hints_spec``: exit codes, output, and no traceback for any input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def _run(*args: str | bytes) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hints_spec", *args],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=60,
        check=False,
    )


def test_parse_header_prints_the_normalized_hint() -> None:
    done = _run("parse-header", 'v=1, sid="sess-42", gap=12.5, end')
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "v": 1,
        "sid": "sess-42",
        "br": None,
        "pbr": None,
        "gap": 12.5,
        "ttl": None,
        "end": True,
        "prio": 3,
    }


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ("v=2", "unsupported_version"),
        ("sid=token", "wrong_type"),
        ("v=1,", "syntax"),
        ("x" * 5000, "too_long"),
        ('sid="caf\u00e9"', "syntax"),
        (b"sid=\xff\xfe", "syntax"),  # not UTF-8: reaches Python as lone surrogates
        ("\t", "syntax"),
    ],
)
def test_parse_header_rejects_with_exit_2_and_no_traceback(value: str | bytes, code: str) -> None:
    done = _run("parse-header", value)
    assert done.returncode == 2
    assert done.stderr.startswith(f"{code}: ")
    assert "Traceback" not in done.stdout + done.stderr


def test_vectors_pass() -> None:
    done = _run("vectors")
    assert done.returncode == 0, done.stdout
    assert ", 0 failed," in done.stdout


def test_vectors_report_failures_and_bad_paths(tmp_path: Path) -> None:
    case = {"name": "wrong", "input": "v=1", "error": "syntax"}
    (tmp_path / "bad.json").write_text(json.dumps({"kind": "header", "cases": [case]}))
    failed = _run("vectors", str(tmp_path))
    assert failed.returncode == 1
    assert "FAIL bad.json::wrong" in failed.stdout
    missing = _run("vectors", str(tmp_path / "missing"))
    assert missing.returncode == 2
    assert "Traceback" not in missing.stdout + missing.stderr


def test_bench_prints_microseconds_per_call() -> None:
    done = _run("bench", "--n", "200")
    assert done.returncode == 0, done.stderr
    assert " us/call " in done.stdout


@pytest.mark.parametrize("args", [(), ("bench", "--n", "0"), ("bench", "--n", "x"), ("nope",)])
def test_usage_errors_exit_2(args: tuple[str, ...]) -> None:
    done = _run(*args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
