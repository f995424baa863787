"""Property tests: round trips, fuzzing (HintError only), and agreement with http_sf."""

from __future__ import annotations

import contextlib
import json

import http_sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hints_spec import (
    AgentHints,
    ControlRequest,
    End,
    Fork,
    HintError,
    ToolEnd,
    ToolStart,
    from_interop,
    parse_body,
    parse_control,
    parse_header,
    serialize_header,
)
from hints_spec._header import _fast_members

ids = st.from_regex(r"[A-Za-z0-9._:~/-]{1,128}", fullmatch=True)
seconds = st.integers(0, 86_400_000).map(lambda ms: ms / 1000)


@st.composite
def agent_hints(draw: st.DrawFn) -> AgentHints:
    br = draw(st.none() | ids)
    pbr = None
    if br is not None and br != "root":
        pbr = draw(st.none() | ids.filter(lambda parent: parent != br))
    return AgentHints(
        sid=draw(st.none() | ids),
        br=br,
        pbr=pbr,
        gap=draw(st.none() | seconds),
        ttl=draw(st.none() | st.integers(0, 86_400)),
        end=draw(st.booleans()),
        prio=draw(st.integers(0, 7)),
    )


@given(agent_hints())
def test_header_round_trip(hints: AgentHints) -> None:
    text = serialize_header(hints)
    assert text.startswith("v=1")
    assert parse_header(text) == hints
    assert parse_header(text.encode("ascii")) == hints


@given(agent_hints())
def test_body_round_trip(hints: AgentHints) -> None:
    assert parse_body(hints.normalized()) == hints
    assert parse_body(json.loads(json.dumps(hints.normalized()))) == hints


short_ids = st.from_regex(r"[a-z0-9._-]{1,12}", fullmatch=True).filter(lambda i: i != "root")


@st.composite
def forks(draw: st.DrawFn) -> Fork:
    children = draw(st.lists(short_ids, min_size=1, max_size=4, unique=True))
    parent = draw(st.none() | short_ids.filter(lambda parent: parent not in children))
    return Fork(parent=parent, children=children)


events = st.one_of(
    st.builds(ToolStart, br=st.none() | short_ids, tool=short_ids, eta=st.none() | seconds),
    st.builds(ToolEnd, br=st.none() | short_ids, tool=st.none() | short_ids),
    st.builds(End, br=st.none() | short_ids),
    forks(),
)


@settings(max_examples=50)
@given(short_ids, st.lists(events, min_size=1, max_size=6))
def test_control_round_trip(sid: str, sent: list[ToolStart | ToolEnd | Fork | End]) -> None:
    request = ControlRequest(sid=sid, events=[event.model_dump() for event in sent])
    assert parse_control(json.loads(request.model_dump_json())) == (sid, sent)


# Characters that matter to RFC 9651 Dictionary parsing, so that fuzzing gets past the
# first byte: delimiters, item starts, escapes, whitespace, a few letters and digits.
SF_ALPHABET = ' \t,;=?"\\()*-.:/%@_0123456789abcdevsigrptlonAZ\x7f\x00\u00e9'


def _sf_members(value: bytes) -> dict[str, object] | None:
    """http_sf's Dictionary as bare values (parameters dropped), None when it rejects."""
    try:
        parsed = http_sf.parse(value, tltype="dictionary")
    except Exception:
        return None
    assert isinstance(parsed, dict)
    return {
        key: member[0] if isinstance(member, tuple) else member for key, member in parsed.items()
    }


def _rejects(value: str | bytes) -> bool:
    """Parse; only HintError may escape the codec."""
    try:
        assert isinstance(parse_header(value), AgentHints)
    except HintError:
        return True
    return False


@settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=160))
def test_parse_header_raises_only_hint_error(data: bytes) -> None:
    # One draw, four inputs (one hypothesis example costs far more than four parses): the
    # bytes, two str decodings (non-ASCII, lone surrogates), and the bytes mapped onto
    # SF_ALPHABET, which gets past the first byte often and is also checked against http_sf.
    _rejects(data)
    _rejects(data.decode("latin-1"))
    _rejects(data.decode("utf-8", "surrogateescape"))
    near_valid = "".join(SF_ALPHABET[byte % len(SF_ALPHABET)] for byte in data)
    if not _rejects(near_valid):
        assert _sf_members(near_valid.encode("utf-8")) is not None, near_valid


keys = st.sampled_from(
    ["v", "sid", "br", "pbr", "gap", "ttl", "end", "prio", "x", "*k", "a-b", "K"]
)
bare_items = st.one_of(
    st.integers(-(10**16), 10**16).map(str),
    st.tuples(st.integers(-(10**13), 10**13), st.integers(0, 10**4)).map(
        lambda p: f"{p[0]}.{p[1]}"
    ),
    st.text(alphabet='ab-_:/\\" ,\u00e9', max_size=6).map(lambda s: f'"{s}"'),
    st.sampled_from(["tok", "*", "a/b", "?0", "?1", "?2", ":YQ==:", "@12", '%"a"', "", "1.", "-"]),
)
items = st.builds(
    lambda item, params: item + "".join(f";{k}={v}" if v else f";{k}" for k, v in params),
    bare_items,
    st.lists(st.tuples(keys, bare_items), max_size=2),
)
members = st.builds(
    lambda key, value: key if value is None else f"{key}={value}",
    keys,
    st.none() | items | st.lists(items, max_size=3).map(lambda xs: f"({' '.join(xs)})"),
)
separators = st.sampled_from([",", ", ", " , ", ",\t", "\t,", ",,", " ", ""])


@st.composite
def dictionaries(draw: st.DrawFn) -> str:
    """Near-valid Dictionaries: real members, every kind of item, sloppy separators."""
    parts = draw(st.lists(members, min_size=1, max_size=6))
    text = draw(st.sampled_from(["", " ", "\t"])) + parts[0]
    for part in parts[1:]:
        text += draw(separators) + part
    return text + draw(st.sampled_from(["", " ", "\t", ","]))


def _typed(members: dict[str, object]) -> list[tuple[str, type, object]]:
    return [(key, type(value), value) for key, value in members.items()]


@settings(max_examples=800, deadline=None)
@given(dictionaries())
def test_agrees_with_http_sf(value: str) -> None:
    reference = _sf_members(value.encode("utf-8"))
    if reference is None:
        assert _rejects(value), f"accepted {value!r}, which http_sf rejects"
    fast = _fast_members(value) if value.isascii() else None
    if fast is not None:
        assert reference is not None, value
        assert _typed(fast) == _typed(reference)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
hint_objects = st.dictionaries(
    st.sampled_from(["v", "sid", "br", "pbr", "gap", "ttl", "end", "prio", "x"]), json_values
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, hint_objects))
def test_parse_body_raises_only_hint_error(value: object) -> None:
    with contextlib.suppress(HintError):
        parse_body(value)


event_objects = st.dictionaries(
    st.sampled_from(["type", "br", "tool", "eta", "parent", "children"]),
    st.sampled_from(["tool_start", "tool_end", "fork", "end", "root"]) | json_values,
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        json_values,
        st.fixed_dictionaries(
            {
                "sid": st.sampled_from(["s1", ""]) | json_values,
                "events": st.lists(event_objects | json_values, max_size=5) | json_values,
            },
            optional={"v": st.just(1) | json_values},
        ),
    )
)
def test_parse_control_raises_only_hint_error(value: object) -> None:
    try:
        _, results = parse_control(value)
    except HintError:
        return
    assert all(
        isinstance(result, HintError | ToolStart | ToolEnd | Fork | End) for result in results
    )


interop_headers = st.dictionaries(
    st.sampled_from(
        [
            "X-Session-ID",
            "x-dynamo-session-id",
            "X-Dynamo-Parent-Session-ID",
            "X-Dynamo-Session-Final",
            "Other",
        ]
    ),
    st.text(max_size=10),
)
interop_bodies = st.dictionaries(
    st.sampled_from(
        ["session_id", "prompt_cache_key", "prompt_cache_retention", "cache_control", "model"]
    ),
    json_values | st.sampled_from(["24h", "in_memory", "5m", "1h", "90s"]),
)


@settings(max_examples=300, deadline=None)
@given(interop_headers, interop_bodies)
def test_from_interop_raises_only_hint_error(
    headers: dict[str, str], body: dict[str, object]
) -> None:
    with contextlib.suppress(HintError):
        from_interop(headers, body)
