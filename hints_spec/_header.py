"""The ``Agent-Hints`` header: an RFC 9651 Dictionary, parsed by http_sf.

A header that uses only plain members (no parameters, inner lists, escapes, byte
sequences, dates or display strings) takes a regex fast path, because http_sf alone
costs more than the whole per-request budget. Everything else goes to http_sf, so
the fast path only has to agree with it on the subset it accepts (a test checks it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal

import http_sf

from ._errors import HintError, HintErrorCode
from ._model import AgentHints, build_hints
from .core import DEFAULT_PRIO, MAX_HEADER_BYTES

_KEY = r"[a-z*][a-z0-9_.*-]*"
_VALUE = (
    r'"[^"\\\x00-\x1f\x7f]*"'  # String without escapes (the text is ASCII by then)
    r"|-?[0-9]{1,12}\.[0-9]{1,3}"  # Decimal
    r"|-?[0-9]{1,15}"  # Integer
    r"|\?[01]"  # Boolean
    r"|[A-Za-z*][A-Za-z0-9:/!#$%&'*+.^_`|~-]*"  # Token
)
_MEMBER = f"{_KEY}(?:=(?:{_VALUE}))?"
_PLAIN_DICTIONARY = re.compile(f" *(?:{_MEMBER}(?:[ \t]*,[ \t]*{_MEMBER})*[ \t]*)?")
# Only applied to text that matched _PLAIN_DICTIONARY, where each member is delimited
# by characters that cannot start a key, so findall yields exactly the members.
_MEMBERS = re.compile(f"({_KEY})(?:=({_VALUE}))?")


def _fast_members(text: str) -> dict[str, object] | None:
    """Members of a plain Dictionary (ASCII text) as http_sf returns their values, else None."""
    if _PLAIN_DICTIONARY.fullmatch(text) is None:
        return None
    members: dict[str, object] = {}
    for key, raw in _MEMBERS.findall(text):
        value: object
        if not raw:
            value = True
        elif raw[0] == '"':
            value = raw[1:-1]
        elif raw[0] == "?":
            value = raw == "?1"
        elif raw[0] == "-" or raw[0].isdigit():
            value = Decimal(raw) if "." in raw else int(raw)
        else:
            value = http_sf.Token(raw)
        members[key] = value  # a later duplicate wins, as RFC 9651 says
    return members


def _sf_members(data: bytes) -> dict[str, object]:
    try:
        parsed = http_sf.parse(data, tltype="dictionary")
    except Exception as exc:  # the codec raises HintError only, whatever http_sf raises
        raise HintError(HintErrorCode.SYNTAX, f"not an RFC 9651 Dictionary ({exc})") from None
    assert isinstance(parsed, dict)
    # Each member is (bare item or inner list, parameters); parameters are ignored.
    return {
        key: member[0] if isinstance(member, tuple) else member for key, member in parsed.items()
    }


def combine_field_lines(lines: Iterable[tuple[str, str]]) -> dict[str, str]:
    """One field value per (lower-cased) name: repeated lines of a field joined
    with ", " in order (RFC 9110 Section 5.3), as SPEC Section 3 step 1 asks of
    ``Agent-Hints`` before it is parsed, so no line is silently dropped."""
    fields: dict[str, str] = {}
    for name, value in lines:
        key = name.lower()
        fields[key] = f"{fields[key]}, {value}" if key in fields else value
    return fields


def parse_header(value: str | bytes) -> AgentHints:
    """Parse and validate one (combined) ``Agent-Hints`` field value."""
    if not isinstance(value, str | bytes):
        raise HintError(HintErrorCode.WRONG_TYPE, "a field value is str or bytes")
    if len(value) > MAX_HEADER_BYTES:
        raise HintError(HintErrorCode.TOO_LONG, f"longer than {MAX_HEADER_BYTES} bytes")
    if isinstance(value, bytes):
        if not value.isascii():
            raise HintError(HintErrorCode.SYNTAX, "non-ASCII byte")
        text = value.decode("ascii")
    else:
        if not value.isascii():
            if len(value.encode("utf-8", "surrogatepass")) > MAX_HEADER_BYTES:
                raise HintError(HintErrorCode.TOO_LONG, f"longer than {MAX_HEADER_BYTES} bytes")
            raise HintError(HintErrorCode.SYNTAX, "non-ASCII character")
        text = value
    members = _fast_members(text)
    if members is None:
        members = _sf_members(text.encode("ascii"))
    return build_hints(members)


def serialize_header(hints: AgentHints) -> str:
    """The canonical field value: v first, table order, absent and default keys omitted."""
    members: http_sf.DictionaryType = {"v": hints.v}
    for key in ("sid", "br", "pbr", "gap", "ttl"):
        value = getattr(hints, key)
        if value is not None:
            members[key] = value
    if hints.end:
        members["end"] = True
    if hints.prio != DEFAULT_PRIO:
        members["prio"] = hints.prio
    return http_sf.ser(members)
