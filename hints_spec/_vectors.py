"""Runs the language-neutral conformance vectors (see vectors/README.md) against this codec."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._body import parse_body
from ._control import parse_control
from ._envelope import SessionAction, find_session_action, from_kv_hints_action, to_kv_hints_action
from ._errors import HintError, HintErrorCode
from ._header import parse_header, serialize_header
from ._resolve import resolve_hints

VECTORS_DIR = Path(__file__).with_name("vectors")
KINDS = ("header", "body", "serialize", "control", "interop", "kv_hints")
_KV_HINTS_FORMS = ("hints", "action", "envelope")  # a kv_hints input has exactly one
_CODES = frozenset(code.value for code in HintErrorCode)


@dataclass(frozen=True)
class Case:
    file: str
    kind: str
    name: str
    input: Any
    expected: Any = None
    error: str | None = None
    ignored: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.file}::{self.name}"


class VectorFormatError(ValueError):
    """A vector file that does not follow vectors/README.md."""


def load_cases(path: Path = VECTORS_DIR) -> list[Case]:
    """Every case of a vector file, or of every ``*.json`` in a directory, in file order."""
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files:
        raise VectorFormatError(f"no vector files in {path}")
    return [case for file in files for case in _load_file(file)]


def _load_file(file: Path) -> list[Case]:
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VectorFormatError(f"{file.name}: {exc}") from None
    kind = document.get("kind") if isinstance(document, dict) else None
    cases = document.get("cases") if isinstance(document, dict) else None
    if kind not in KINDS or not isinstance(cases, list):
        raise VectorFormatError(f"{file.name}: needs a known 'kind' and a 'cases' array")
    return [_case(file.name, kind, raw) for raw in cases]


def _case(file: str, kind: str, raw: object) -> Case:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or "input" not in raw:
        raise VectorFormatError(f"{file}: every case needs a 'name' and an 'input'")
    has_error = "error" in raw
    if has_error == ("expected" in raw) or (has_error and raw["error"] not in _CODES):
        raise VectorFormatError(f"{file}: {raw['name']}: needs 'expected' or a known 'error'")
    ignored = raw.get("ignored", [])
    if kind == "header" and not isinstance(raw["input"], str):
        raise VectorFormatError(f"{file}: {raw['name']}: a header input is a string")
    if kind == "interop" and not (
        isinstance(raw["input"], dict)
        and all(isinstance(raw["input"].get(part, {}), dict) for part in ("headers", "body"))
        and isinstance(ignored, list)
    ):
        raise VectorFormatError(
            f"{file}: {raw['name']}: needs input {{headers, body}} objects and an 'ignored' array"
        )
    if kind == "kv_hints" and not (
        isinstance(raw["input"], dict)
        and sum(form in raw["input"] for form in _KV_HINTS_FORMS) == 1
    ):
        raise VectorFormatError(
            f"{file}: {raw['name']}: needs an input object with one of hints, action, envelope"
        )
    return Case(
        file, kind, raw["name"], raw["input"], raw.get("expected"), raw.get("error"), tuple(ignored)
    )


def _outcome(case: Case) -> tuple[Any, tuple[str, ...]]:
    """The normalized result of a case's input and the sources it ignored."""
    if case.kind == "header":
        return parse_header(case.input).normalized(), ()
    if case.kind == "body":
        return parse_body(case.input).normalized(), ()
    if case.kind == "serialize":
        hints = parse_body(case.input)
        text = serialize_header(hints)
        if parse_header(text) != hints:
            return {"round_trip_failed": text}, ()
        return text, ()
    if case.kind == "control":
        sid, events = parse_control(case.input)
        return {
            "sid": sid,
            "events": [
                {"error": event.code.value} if isinstance(event, HintError) else event.model_dump()
                for event in events
            ],
        }, ()
    if case.kind == "kv_hints":
        return _kv_hints(case.input), ()
    merged, errors = resolve_hints(case.input.get("headers", {}), case.input.get("body", {}))
    ignored = [source for source, _ in errors]
    return (None if merged is None else merged.normalized()), tuple(ignored)


def _kv_hints(given: dict[str, Any]) -> Any:
    """Encode a body-form hint to its action, or decode an action or an envelope."""
    if "hints" in given:
        hints = parse_body(given["hints"])
        return to_kv_hints_action(hints, tenant=given.get("tenant"), tool=given.get("tool"))
    if "action" in given:
        return _session(from_kv_hints_action(given["action"]))
    found = find_session_action(given["envelope"])
    return None if found is None else _session(found)


def _session(action: SessionAction) -> dict[str, object]:
    return {"hints": action.hints.normalized(), "tenant": action.tenant, "tool": action.tool}


def check_case(case: Case) -> str | None:
    """None when the codec agrees with the case, else what it did instead."""
    try:
        actual, ignored = _outcome(case)
    except HintError as error:
        if case.error == error.code.value:
            return None
        return f"raised {error.code.value} ({error.message}), expected {_want(case)}"
    except Exception as exc:  # the codec promises HintError only: anything else is a failure
        return f"crashed with {type(exc).__name__}: {exc}"
    if case.error is not None:
        return f"returned {json.dumps(actual)}, expected error {case.error}"
    if not same_json(actual, case.expected):
        return f"returned {json.dumps(actual)}, expected {json.dumps(case.expected)}"
    if ignored != case.ignored:
        return f"ignored {list(ignored)}, expected {list(case.ignored)}"
    return None


def _want(case: Case) -> str:
    return f"error {case.error}" if case.error is not None else json.dumps(case.expected)


def same_json(a: object, b: object) -> bool:
    """JSON equality: numbers compare by value (12 == 12.0), booleans are not numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
