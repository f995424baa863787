"""The hint as an action of vLLM's KvHintsEnvelope (SPEC.md section 5.2)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_hints_properties import agent_hints, ids

import hints_spec
from hints_spec import (
    KV_HINTS_ACTION_TYPE,
    KV_HINTS_ACTION_VERSION,
    KV_HINTS_PROTOCOL_VERSION,
    AgentHints,
    HintError,
    HintErrorCode,
    SessionAction,
    find_session_action,
    from_kv_hints_action,
    parse_body,
    to_kv_hints_action,
    to_kv_hints_envelope,
)
from hints_spec._vectors import VectorFormatError, load_cases

PACKAGE = Path(hints_spec.__file__).parent
VECTORS = PACKAGE / "vectors" / "kv_hints.json"

tenants = st.none() | st.text(min_size=1, max_size=256)
tools = st.none() | ids
HINTS = AgentHints(sid="sess-42", br="sub-1", pbr="root", gap=12.5, ttl=600, prio=1)
OTHER = {"action_id": "pin", "action_type": "kvcr.pin", "action_version": "3", "payload": {"b": 1}}


def test_the_action_names_its_type_and_versions() -> None:
    # (the public names are in test_hints_codec's contract)
    assert (KV_HINTS_PROTOCOL_VERSION, KV_HINTS_ACTION_TYPE, KV_HINTS_ACTION_VERSION) == (
        "1",
        "agent-hints.session",
        "1",
    )


def test_action_and_envelope_shape() -> None:
    action = to_kv_hints_action(HINTS, tenant="key:ab", tool="web_search")
    assert action == {
        "action_id": "agent-hints",
        "action_type": "agent-hints.session",
        "action_version": "1",
        "payload": {**HINTS.normalized(), "tenant": "key:ab", "tool": "web_search"},
    }
    assert to_kv_hints_action(HINTS, action_id="a7")["action_id"] == "a7"
    envelope = to_kv_hints_envelope(HINTS, message_id="req-1", tenant="key:ab", tool="web_search")
    assert envelope == {"protocol_version": "1", "message_id": "req-1", "actions": [action]}
    assert json.loads(json.dumps(envelope)) == envelope  # JSON-compatible, as vLLM requires


@given(agent_hints(), tenants, tools)
def test_round_trip(hints: AgentHints, tenant: str | None, tool: str | None) -> None:
    expected = SessionAction(hints, tenant, tool)
    action = to_kv_hints_action(hints, tenant=tenant, tool=tool)
    assert from_kv_hints_action(action) == expected
    assert from_kv_hints_action(json.loads(json.dumps(action))) == expected
    envelope = to_kv_hints_envelope(hints, message_id="m", tenant=tenant, tool=tool)
    assert find_session_action(json.loads(json.dumps(envelope))) == expected


@given(agent_hints())
def test_payload_hint_is_the_body_form(hints: AgentHints) -> None:
    payload = to_kv_hints_action(hints)["payload"]
    assert isinstance(payload, dict)
    assert parse_body(payload) == hints  # tenant and tool are unknown keys to the body form


def test_appended_action_keeps_the_other_actions() -> None:
    # What a server does to a request that already has an envelope (SPEC 5.2).
    first = {"action_id": "x", "action_type": "vendor.x", "action_version": "9", "payload": "?"}
    envelope: dict[str, Any] = {"protocol_version": "1", "message_id": "r", "actions": [first]}
    envelope["actions"].append(OTHER)
    before = json.loads(json.dumps(envelope))
    envelope["actions"].append(to_kv_hints_action(HINTS, tenant="t"))
    assert envelope["actions"][:2] == before["actions"]
    assert find_session_action(envelope) == SessionAction(HINTS, "t", None)
    assert envelope["actions"][:2] == before["actions"]  # read, never changed


def test_find_session_action_skips_others_and_takes_the_first() -> None:
    ours = to_kv_hints_action(HINTS, tenant="t1")
    later = to_kv_hints_action(AgentHints(sid="later"), tenant="t2")
    unreadable = {"action_type": "vendor.x", "payload": object()}  # never looked at
    envelope = {"actions": [OTHER, unreadable, ours, later]}
    assert find_session_action(envelope) == SessionAction(HINTS, "t1", None)
    assert find_session_action({"actions": (OTHER, later)}) == SessionAction(
        AgentHints(sid="later"), "t2", None
    )
    assert find_session_action({"actions": [OTHER]}) is None
    assert find_session_action({"actions": []}) is None
    assert find_session_action(None) is None


def test_a_malformed_action_of_ours_is_reported_even_after_others() -> None:
    bad = {**to_kv_hints_action(HINTS), "action_version": "2"}
    with pytest.raises(HintError) as caught:
        find_session_action({"actions": [OTHER, bad, to_kv_hints_action(HINTS)]})
    assert caught.value.code is HintErrorCode.UNSUPPORTED_VERSION


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"action_type": "vendor.x"}, HintErrorCode.INVALID_EVENT),
        ({"action_type": None}, HintErrorCode.INVALID_EVENT),
        ({"action_version": "2.0"}, HintErrorCode.UNSUPPORTED_VERSION),
        ({"action_version": "1.x"}, HintErrorCode.UNSUPPORTED_VERSION),
        ({"action_version": ""}, HintErrorCode.UNSUPPORTED_VERSION),
        ({"action_version": 1}, HintErrorCode.WRONG_TYPE),
        ({"payload": []}, HintErrorCode.WRONG_TYPE),
        ({"payload": {"sid": "a b"}}, HintErrorCode.BAD_ID),
        ({"payload": {"gap": 86401}}, HintErrorCode.OUT_OF_RANGE),
        ({"payload": {"tool": "a b"}}, HintErrorCode.BAD_ID),
        ({"payload": {"tool": ["bash"]}}, HintErrorCode.WRONG_TYPE),
        ({"payload": {"tenant": b"t"}}, HintErrorCode.WRONG_TYPE),
        ({"payload": {"tenant": "t" * 257}}, HintErrorCode.OUT_OF_RANGE),
        ({"payload": {str(i): i for i in range(33)}}, HintErrorCode.TOO_MANY_MEMBERS),
    ],
)
def test_malformed_actions(changes: dict[str, object], code: HintErrorCode) -> None:
    action = {**to_kv_hints_action(HINTS), **changes}
    with pytest.raises(HintError) as caught:
        from_kv_hints_action(action)
    assert caught.value.code is code
    if action["action_type"] == KV_HINTS_ACTION_TYPE:  # in an envelope: the same verdict
        with pytest.raises(HintError) as caught:
            find_session_action({"actions": [OTHER, action]})
        assert caught.value.code is code


def test_minor_versions_and_unread_members_are_accepted() -> None:
    action = to_kv_hints_action(HINTS, tool="bash")
    payload = {**action["payload"], "future": {"x": [1]}}  # type: ignore[dict-item]
    for version in ("1", "1.0", "1.12"):
        found = from_kv_hints_action({**action, "action_version": version, "payload": payload})
        assert found == SessionAction(HINTS, None, "bash")
    del action["action_id"]
    assert from_kv_hints_action(action).hints == HINTS


@pytest.mark.parametrize(
    "envelope",
    ["kv", [], {"actions": None}, {"actions": {"a": 1}}, {"actions": ["x"]}, {"actions": [{}]}],
)
def test_malformed_envelopes(envelope: object) -> None:
    with pytest.raises(HintError) as caught:
        find_session_action(envelope)
    assert caught.value.code is HintErrorCode.WRONG_TYPE


@pytest.mark.parametrize(
    ("tenant", "tool", "code"),
    [
        ("", None, HintErrorCode.OUT_OF_RANGE),
        ("t" * 257, None, HintErrorCode.OUT_OF_RANGE),
        (None, "web search", HintErrorCode.BAD_ID),
        (None, "", HintErrorCode.BAD_ID),
    ],
)
def test_encoding_never_emits_what_readers_reject(
    tenant: str | None, tool: str | None, code: HintErrorCode
) -> None:
    with pytest.raises(HintError) as caught:
        to_kv_hints_action(HINTS, tenant=tenant, tool=tool)
    assert caught.value.code is code
    with pytest.raises(HintError):
        to_kv_hints_envelope(HINTS, message_id="m", tenant=tenant, tool=tool)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
members = st.sampled_from(
    ("action_type", "action_version", "payload", *AgentHints.model_fields, "tenant", "tool")
)


@st.composite
def mutated_actions(draw: st.DrawFn) -> dict[str, Any]:
    """A valid action with one member, of the action or of its payload, set to any JSON."""
    action: dict[str, Any] = to_kv_hints_action(draw(agent_hints()), tenant="t", tool="bash")
    member, value = draw(members), draw(json_values)
    if member.startswith("action") or member == "payload":
        action[member] = value
    else:
        action["payload"][member] = value
    return action


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(json_values, mutated_actions()))
def test_parsers_raise_hint_error_only(value: object) -> None:
    with contextlib.suppress(HintError):
        from_kv_hints_action(value)
    with contextlib.suppress(HintError):
        find_session_action(value)
    with contextlib.suppress(HintError):
        find_session_action({"actions": [OTHER, value]})


def test_vectors_cover_the_brief() -> None:
    cases = load_cases(VECTORS)
    assert len(cases) >= 12
    forms = ("hints", "action", "envelope")
    assert {next(form for form in forms if form in case.input) for case in cases} == set(forms)
    assert {case.error for case in cases} >= {
        "wrong_type",
        "bad_id",
        "out_of_range",
        "unsupported_version",
        "invalid_event",
        "invalid_combination",
        "too_many_members",
        None,
    }


@pytest.mark.parametrize(
    "case",
    [
        {"name": "a", "input": [], "expected": None},
        {"name": "a", "input": {}, "expected": None},
        {"name": "a", "input": {"action": {}, "envelope": None}, "expected": None},
        {"name": "a", "input": {"tenant": "t"}, "expected": None},
    ],
)
def test_malformed_kv_hints_vectors_are_reported(tmp_path: Path, case: object) -> None:
    path = tmp_path / "kv.json"
    path.write_text(json.dumps({"kind": "kv_hints", "cases": [case]}))
    with pytest.raises(VectorFormatError):
        load_cases(path)


def _schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((PACKAGE / "schema" / name).read_text())
    return loaded


# Where JSON Schema cannot state the rule (the schema's description says so), it disagrees.
_NOT_IN_SCHEMA = {
    "decode gap four decimals",
    "decode tenant and tool not counted as members",
}


def test_action_schema_agrees_with_the_vectors() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    referencing = pytest.importorskip("referencing")
    schema = _schema("kv-hints-action.schema.json")
    registry = referencing.Registry().with_resources(
        (name, referencing.Resource.from_contents(_schema(name)))
        for name in ("agent-hints.schema.json", "kv-hints-action.schema.json")
    )
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    checked = 0
    for case in load_cases(VECTORS):
        if "action" in case.input:
            valid = validator.is_valid(case.input["action"])
            assert valid == ((case.error is None) != (case.name in _NOT_IN_SCHEMA)), case.name
            checked += 1
        elif "hints" in case.input and case.error is None:
            assert validator.is_valid(case.expected), case.name
            checked += 1
    assert checked >= 30
    props = schema["properties"]
    assert props["action_type"]["const"] == KV_HINTS_ACTION_TYPE
    assert props["payload"]["properties"]["tenant"]["maxLength"] == 2 * hints_spec.MAX_ID_LENGTH


def test_vllm_structs_carry_the_dicts() -> None:
    """The dict form is exactly what vLLM's msgspec structs convert from and to."""
    msgspec = pytest.importorskip("msgspec")
    kv_hints = pytest.importorskip("vllm.v1.kv_hints")
    envelope = to_kv_hints_envelope(HINTS, message_id="req-1", tenant="key:ab", tool="bash")
    envelope["actions"].insert(0, OTHER)  # type: ignore[attr-defined]
    struct = msgspec.convert(envelope, kv_hints.KvHintsEnvelope)
    assert struct.actions[1].action_type == KV_HINTS_ACTION_TYPE
    assert msgspec.to_builtins(struct) == envelope
    assert find_session_action(msgspec.to_builtins(struct)) == SessionAction(
        HINTS, "key:ab", "bash"
    )
