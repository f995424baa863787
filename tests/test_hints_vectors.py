"""Every conformance vector against the Python codec, and the vector runner's own checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hints_spec._vectors import (
    KINDS,
    Case,
    VectorFormatError,
    check_case,
    load_cases,
    same_json,
)

CASES = load_cases()


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_vector(case: Case) -> None:
    assert check_case(case) is None


def test_vector_suite_is_complete() -> None:
    assert len(CASES) >= 100
    assert len({case.id for case in CASES}) == len(CASES)
    assert {case.kind for case in CASES} == set(KINDS)


def test_same_json_compares_numbers_by_value_but_not_booleans() -> None:
    assert same_json({"a": [12, None]}, {"a": [12.0, None]})
    assert not same_json(True, 1)
    assert not same_json({"a": 1}, {"a": 1, "b": 2})
    assert not same_json([1], [1, 1])
    assert not same_json("1", 1)


def _write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "case.json"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize(
    "document",
    [
        [],
        {"kind": "nope", "cases": []},
        {"kind": "header", "cases": {}},
        {"kind": "header", "cases": [{"input": "v=1", "expected": None}]},
        {"kind": "header", "cases": [{"name": "a", "input": "v=1"}]},
        {"kind": "header", "cases": [{"name": "a", "input": "v=1", "error": "nope"}]},
        {"kind": "header", "cases": [{"name": "a", "input": "", "error": "syntax", "expected": 1}]},
        {"kind": "header", "cases": [{"name": "a", "input": 5, "error": "syntax"}]},
        {"kind": "interop", "cases": [{"name": "a", "input": [], "expected": None}]},
        {"kind": "interop", "cases": [{"name": "a", "input": {"headers": []}, "expected": None}]},
    ],
)
def test_malformed_vector_files_are_reported(tmp_path: Path, document: object) -> None:
    with pytest.raises(VectorFormatError):
        load_cases(_write(tmp_path, document))


def test_unreadable_and_empty_locations_are_reported(tmp_path: Path) -> None:
    with pytest.raises(VectorFormatError):
        load_cases(tmp_path)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(VectorFormatError):
        load_cases(tmp_path)


def test_a_wrong_expectation_fails() -> None:
    assert check_case(Case("f", "header", "n", "v=1", expected={"v": 1})) is not None
    assert check_case(Case("f", "header", "n", "v=2", expected=None)) is not None
    assert check_case(Case("f", "header", "n", "v=1", error="syntax")) is not None
    assert check_case(Case("f", "header", "n", "v=2", error="syntax")) is not None
    interop = Case("f", "interop", "n", {"headers": {"Agent-Hints": "v=2"}}, ignored=())
    assert check_case(interop) is not None
