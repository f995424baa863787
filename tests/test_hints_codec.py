"""The codec's API surface and the rules the vectors cannot express (Python types, models)."""

from __future__ import annotations

import ast
import json
import pickle
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

import hints_spec
from hints_spec import (
    BODY_FIELD,
    CONTROL_PATH,
    HEADER_NAME,
    OTEL_CONVERSATION_ID,
    PROTOCOL_VERSION,
    SESSION_HEADER,
    AgentHints,
    ControlEvent,
    ControlRequest,
    ControlResponse,
    End,
    EventResult,
    Fork,
    HintError,
    HintErrorCode,
    Outcome,
    ToolEnd,
    ToolStart,
    from_interop,
    merge_hints,
    parse_body,
    parse_control,
    parse_header,
    serialize_header,
    to_event,
)
from hints_spec._header import _fast_members
from hints_spec._model import ID_PATTERN, build_hints
from hints_spec._vectors import load_cases
from hints_spec.core import (
    MAX_MEMBERS,
    MAX_SECONDS,
    EndEvent,
    ForkEvent,
    ToolEndEvent,
    ToolStartEvent,
)

PACKAGE = Path(hints_spec.__file__).parent
TYPICAL = 'v=1, sid="sess-42", br="root", gap=12.5, ttl=600'


def test_public_api_is_exactly_the_contract() -> None:
    assert sorted(hints_spec.__all__) == sorted(
        [
            "HEADER_NAME", "BODY_FIELD", "CONTROL_PATH", "PROTOCOL_VERSION", "USER_TOOL",
            "OTEL_CONVERSATION_ID", "SESSION_HEADER", "HintErrorCode", "HintError", "AgentHints",
            "parse_header", "serialize_header", "combine_field_lines", "parse_body", "Outcome",
            "ToolStart",
            "ToolEnd", "Fork", "End", "ControlEvent", "ControlRequest", "parse_control",
            "EventResult", "ControlResponse", "to_event", "from_interop",
            "merge_hints",
            "resolve_hints", "ROOT_BRANCH", "MAX_ID_LENGTH", "MAX_SECONDS", "MAX_EVENTS",
            "MAX_CHILDREN", "ID_PATTERN",
            # vLLM's hint envelope (SPEC 5.2)
            "KV_HINTS_ACTION_TYPE", "KV_HINTS_ACTION_VERSION", "KV_HINTS_PROTOCOL_VERSION",
            "SessionAction", "find_session_action", "from_kv_hints_action",
            "to_kv_hints_action", "to_kv_hints_envelope",
        ]
    )  # fmt: skip
    assert (HEADER_NAME, BODY_FIELD, CONTROL_PATH) == (
        "Agent-Hints",
        "agent_hints",
        "/v1/agent-hints/events",
    )
    assert (PROTOCOL_VERSION, OTEL_CONVERSATION_ID) == (1, "gen_ai.conversation.id")
    assert SESSION_HEADER == "X-Session-ID"
    limits = (
        hints_spec.ROOT_BRANCH,
        hints_spec.MAX_ID_LENGTH,
        hints_spec.MAX_SECONDS,
        hints_spec.MAX_EVENTS,
        hints_spec.MAX_CHILDREN,
    )
    assert limits == ("root", 128, 86400, 64, 64)


def test_the_core_imports_only_the_standard_library() -> None:
    """The policy, simulators and benchmarks read ``hints_spec.core``: no codec under it."""
    tree = ast.parse((PACKAGE / "core.py").read_text())
    modules = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert modules <= {"__future__", "dataclasses", "enum", "typing"}, modules


def test_a_parsed_event_lowers_to_its_plain_form() -> None:
    _, events = parse_control(
        {
            "sid": "s",
            "events": [
                {"type": "tool_start", "tool": "t", "br": "b", "eta": 2},
                {"type": "tool_end", "br": "b"},
                {"type": "fork", "children": ["c1", "c2"]},
                {"type": "end"},
            ],
        }
    )
    assert [to_event(e) for e in events if not isinstance(e, HintError)] == [
        ToolStartEvent(tool="t", br="b", eta=2.0),
        ToolEndEvent(br="b"),
        ForkEvent(children=("c1", "c2")),
        EndEvent(),
    ]


def test_hint_error_carries_code_and_message_and_pickles() -> None:
    with pytest.raises(HintError) as caught:
        parse_header("v=2")
    error = caught.value
    assert isinstance(error, ValueError)
    assert error.code is HintErrorCode.UNSUPPORTED_VERSION
    assert str(error) == f"unsupported_version: {error.message}"
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.code, copy.message) == (error.code, error.message)


def test_bytes_and_str_parse_alike() -> None:
    assert parse_header(TYPICAL.encode("ascii")) == parse_header(TYPICAL)


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (b'sid="caf\xc3\xa9"', HintErrorCode.SYNTAX),
        ("\u00e9" * 600, HintErrorCode.TOO_LONG),  # 1200 bytes once encoded
        ('sid="\udcff"', HintErrorCode.SYNTAX),
        (None, HintErrorCode.WRONG_TYPE),
        (12, HintErrorCode.WRONG_TYPE),
    ],
)
def test_field_value_encoding_and_type(value: Any, code: HintErrorCode) -> None:
    with pytest.raises(HintError) as caught:
        parse_header(value)
    assert caught.value.code is code


def test_typical_header_takes_the_fast_path() -> None:
    assert _fast_members(TYPICAL) is not None
    assert _fast_members('sid="s";p=1') is None  # parameters go to http_sf


def test_fast_construction_is_a_normal_model() -> None:
    fields: dict[str, Any] = {
        "sid": "s1", "br": "b", "pbr": "root", "gap": 1.5, "ttl": 9, "end": True, "prio": 0
    }  # fmt: skip
    fast = build_hints(fields)
    slow = AgentHints(**fields)
    assert fast == slow
    assert hash(fast) == hash(slow)
    assert fast.model_dump() == slow.model_dump() == fast.normalized()
    assert fast.model_copy(update={"ttl": 10}).ttl == 10
    assert pickle.loads(pickle.dumps(fast)) == fast
    with pytest.raises(ValidationError):
        fast.ttl = 5


def test_direct_construction_obeys_the_same_rules() -> None:
    assert AgentHints.model_validate({"gap": 12, "ttl": 600.0}) == parse_header("gap=12, ttl=600")
    bad: dict[str, Any]
    for bad in ({"sid": "a b"}, {"ttl": -1}, {"pbr": "x"}, {"v": 2}, {"end": 1}):
        with pytest.raises(ValidationError):
            AgentHints(**bad)
    assert list(AgentHints().normalized()) == ["v", "sid", "br", "pbr", "gap", "ttl", "end", "prio"]


def test_serialize_is_canonical_and_parses_back() -> None:
    hints = AgentHints(sid="s1", end=True, prio=3)
    assert serialize_header(hints) == 'v=1, sid="s1", end'
    assert parse_header(serialize_header(hints)) == hints


def test_body_null_and_unknown_members() -> None:
    assert parse_body({"sid": None, "zzz": object()}) == AgentHints()
    members = {f"k{i}": 1 for i in range(MAX_MEMBERS)}
    assert parse_body(members) == AgentHints()
    with pytest.raises(HintError) as caught:
        parse_body({**members, "one-more": 1})
    assert caught.value.code is HintErrorCode.TOO_MANY_MEMBERS


def test_gap_precision_in_body() -> None:
    assert parse_body({"gap": 0.3}).gap == 0.3
    with pytest.raises(HintError):
        parse_body({"gap": 0.1 + 0.2})  # 0.30000000000000004 is not a 3-decimal number
    with pytest.raises(HintError):
        parse_body({"gap": float("nan")})
    with pytest.raises(HintError):
        parse_body({"gap": float("inf")})


def test_decimal_seconds_keep_the_3_decimal_bound() -> None:
    # The header parser never yields such a Decimal; a Python caller can.
    assert parse_body({"gap": Decimal("1.250")}).gap == 1.25
    for bad in (Decimal("1.2345"), Decimal("1E-4"), Decimal("1E+30")):
        with pytest.raises(HintError) as caught:
            parse_body({"gap": bad})
        assert caught.value.code is HintErrorCode.OUT_OF_RANGE
    with pytest.raises(ValidationError):
        ToolStart(tool="t", eta=Decimal("0.0005"))  # type: ignore[arg-type]


def test_merge_rules() -> None:
    interop = AgentHints(sid="i", br="child", pbr="parent", ttl=60, end=True)
    assert merge_hints(None, None) is None
    assert merge_hints(None, interop) is interop
    assert merge_hints(interop, None) is interop
    merged = merge_hints(AgentHints(sid="h", br="b", prio=3), interop)
    assert merged == AgentHints(sid="h", br="b", ttl=60, end=True)
    assert merge_hints(AgentHints(gap=1.0), interop) == interop.model_copy(update={"gap": 1.0})


def _defaults() -> dict[str, object]:
    return AgentHints().normalized()


@pytest.mark.parametrize(
    ("headers", "body", "code"),
    [
        ({}, {"session_id": 5}, HintErrorCode.WRONG_TYPE),
        ({}, {"prompt_cache_retention": ["24h"]}, HintErrorCode.WRONG_TYPE),
        ({}, {"cache_control": "1h"}, HintErrorCode.WRONG_TYPE),
        ({}, {"cache_control": {"ttl": "25h"}}, HintErrorCode.OUT_OF_RANGE),
        ({"X-Dynamo-Session-Final": "1"}, {}, HintErrorCode.WRONG_TYPE),
        ({"X-Dynamo-Session-ID": "root", "X-Dynamo-Parent-Session-ID": "p"}, {},
         HintErrorCode.INVALID_COMBINATION),
    ],
)  # fmt: skip
def test_invalid_interop_fields(
    headers: dict[str, str], body: dict[str, object], code: HintErrorCode
) -> None:
    with pytest.raises(HintError) as caught:
        from_interop(headers, body)
    assert caught.value.code is code


def test_dynamo_parent_equal_to_session_is_no_fork() -> None:
    headers = {"X-Dynamo-Session-ID": "d", "X-Dynamo-Parent-Session-ID": "d"}
    assert from_interop(headers, {}) == AgentHints(sid="d")


def test_event_models_validate_like_parse_control() -> None:
    assert ToolStart(tool="bash", eta=3) == ToolStart(type="tool_start", tool="bash", eta=3.0)
    for build in (
        lambda: ToolStart(type="end", tool="x"),  # type: ignore[arg-type]
        lambda: ToolStart(tool="a b"),
        lambda: Fork(children=[]),
        lambda: Fork(parent="a", children=["a"]),
        lambda: End(br=""),
    ):
        with pytest.raises(ValidationError):
            build()
    adapter: TypeAdapter[ControlEvent] = TypeAdapter(ControlEvent)
    assert adapter.validate_python({"type": "fork", "children": ["a"]}) == Fork(children=["a"])
    with pytest.raises(ValidationError):
        adapter.validate_python({"type": "fork", "children": ["root"]})


def test_control_request_model() -> None:
    sent = [ToolStart(tool="bash", eta=1.5), ToolEnd(tool="bash"), End()]
    request = ControlRequest(sid="s1", events=[e.model_dump(exclude_none=True) for e in sent])
    assert request.events == [
        {"type": "tool_start", "tool": "bash", "eta": 1.5},
        {"type": "tool_end", "tool": "bash"},
        {"type": "end"},
    ]
    assert parse_control(request.model_dump()) == ("s1", sent)
    bad: dict[str, Any]
    for bad in ({"sid": "s1", "events": []}, {"sid": "a b", "events": [{}]}, {"events": [{}]}):
        with pytest.raises(ValidationError):
            ControlRequest.model_validate(bad)
    # A bad event is the server's per-slot business, not an envelope error.
    assert ControlRequest(sid="s1", events=[5]).events == [5]


def test_parse_control_keeps_event_slots() -> None:
    sid, events = parse_control({"sid": "s1", "events": [{"type": "end"}, {"type": "x"}]})
    assert sid == "s1"
    assert events[0] == End()
    assert isinstance(events[1], HintError)
    assert events[1].code is HintErrorCode.INVALID_EVENT


def test_control_response_model() -> None:
    response = ControlResponse(
        results=[
            EventResult(index=0, outcome=Outcome.ACCEPTED),
            EventResult(index=1, outcome=Outcome.REJECTED, reason="invalid_event"),
        ]
    )
    assert json.loads(response.model_dump_json(exclude_none=True)) == {
        "v": 1,
        "results": [
            {"index": 0, "outcome": "accepted"},
            {"index": 1, "outcome": "rejected", "reason": "invalid_event"},
        ],
    }


def _schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((PACKAGE / "schema" / name).read_text())
    return loaded


def test_documents_share_the_codec_bounds() -> None:
    hints = _schema("agent-hints.schema.json")
    assert hints["$defs"]["id"]["pattern"] == f"^{ID_PATTERN}$"
    assert hints["maxProperties"] == MAX_MEMBERS
    assert hints["properties"]["ttl"]["maximum"] == MAX_SECONDS
    assert hints["$defs"]["seconds"]["maximum"] == MAX_SECONDS
    assert set(hints["properties"]) == set(AgentHints.model_fields)
    spec = (PACKAGE / "SPEC.md").read_text()
    assert f"^{ID_PATTERN}$" in spec
    assert all(f"`{code.value}`" in spec for code in HintErrorCode)


def _validator(schema: dict[str, Any]) -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    referencing = pytest.importorskip("referencing")
    registry = referencing.Registry().with_resources(
        (name, referencing.Resource.from_contents(_schema(name)))
        for name in ("agent-hints.schema.json", "control-request.schema.json")
    )
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, registry=registry)


# Rules JSON Schema cannot state (SPEC.md section 4 says so); the codec enforces them.
_NOT_IN_SCHEMA = {"gap four decimals", "pbr equals br"}


def test_body_schema_agrees_with_body_vectors() -> None:
    validator = _validator(_schema("agent-hints.schema.json"))
    for case in load_cases(PACKAGE / "vectors" / "body.json"):
        valid = validator.is_valid(case.input)
        assert valid == (case.error is None or case.name in _NOT_IN_SCHEMA), case.name


def test_control_schema_agrees_with_control_vectors() -> None:
    validator = _validator(_schema("control-request.schema.json"))
    for case in load_cases(PACKAGE / "vectors" / "control.json"):
        every_event_valid = case.error is None and all(
            "error" not in event for event in case.expected["events"]
        )
        assert validator.is_valid(case.input) == every_event_valid, case.name


def test_openapi_matches_the_codec() -> None:
    yaml = pytest.importorskip("yaml")
    document = yaml.safe_load((PACKAGE / "openapi.yaml").read_text())
    assert document["openapi"].startswith("3.1")
    operation = document["paths"][CONTROL_PATH]["post"]
    request_ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert (PACKAGE / request_ref).is_file()
    schemas = document["components"]["schemas"]
    assert schemas["ErrorCode"]["enum"] == [code.value for code in HintErrorCode]
    assert schemas["Outcome"]["enum"] == [outcome.value for outcome in Outcome]
    jsonschema = pytest.importorskip("jsonschema")
    referencing = pytest.importorskip("referencing")
    registry = referencing.Registry().with_resource(
        "openapi.yaml",
        referencing.Resource.from_contents(
            document, default_specification=referencing.jsonschema.DRAFT202012
        ),
    )

    def validate(instance: object, component: str) -> None:
        ref = {"$ref": f"openapi.yaml#/components/schemas/{component}"}
        jsonschema.Draft202012Validator(ref, registry=registry).validate(instance)

    example = operation["responses"]["200"]["content"]["application/json"]["example"]
    validate(example, "ControlResponse")
    assert ControlResponse.model_validate(example).results[1].outcome is Outcome.CLIPPED
    validate(operation["responses"]["400"]["content"]["application/json"]["example"], "Error")
    request_example = operation["requestBody"]["content"]["application/json"]["example"]
    assert all(not isinstance(event, HintError) for event in parse_control(request_example)[1])


def test_error_messages_never_echo_the_value() -> None:
    secret = "s3cr3t-token-value"
    for value in (f'sid="{secret} x"', f"sid={secret}", f'sid="{secret}", pbr="{secret}"'):
        with pytest.raises(HintError) as caught:
            parse_header(value)
        assert not re.search(secret, str(caught.value))


def test_repeated_field_lines_are_combined_in_order() -> None:
    # SPEC section 3 step 1: RFC 9110 field combination before parsing.
    lines = [("Agent-Hints", 'v=1, sid="s"'), ("X-Other", "1"), ("agent-hints", 'gap=2, sid="t"')]
    fields = hints_spec.combine_field_lines(lines)
    assert fields == {"agent-hints": 'v=1, sid="s", gap=2, sid="t"', "x-other": "1"}
    assert hints_spec.parse_header(fields["agent-hints"]).sid == "t"  # a later duplicate wins
