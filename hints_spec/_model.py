"""The hint object, its bounds, and the one validation shared by every wire form.

Header, body, control and interop inputs all end in the checks below, so a bound is
written once. The checks are plain Python (no pydantic pass) because they sit on the
request hot path; the models reuse them as ``before`` validators, so a model built
directly from Python values obeys exactly the same rules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, model_validator

from ._errors import HintError, HintErrorCode
from .core import (
    DEFAULT_PRIO,
    MAX_ID_LENGTH,
    MAX_MEMBERS,
    MAX_PRIO,
    MAX_SECONDS,
    PROTOCOL_VERSION,
    ROOT_BRANCH,
)

ID_PATTERN: Final = rf"[A-Za-z0-9._:~/-]{{1,{MAX_ID_LENGTH}}}"

_ID_MATCH = re.compile(ID_PATTERN).fullmatch


def check_id(name: str, value: object) -> str:
    """An id is an RFC 9651 String (never a Token) in a charset that needs no escaping."""
    if type(value) is not str:
        raise HintError(HintErrorCode.WRONG_TYPE, f"{name} must be a String")
    if _ID_MATCH(value) is None:
        raise HintError(HintErrorCode.BAD_ID, f"{name} must be 1-128 of A-Za-z0-9._:~/-")
    return value


def check_optional_id(name: str, value: object) -> str | None:
    return None if value is None else check_id(name, value)


def check_integer(name: str, value: object) -> int:
    """RFC 9651 Integer; a JSON number with a zero fraction counts, as JSON has one number type."""
    if type(value) is int:
        return value
    if type(value) is float and value.is_integer():
        return int(value)
    raise HintError(HintErrorCode.WRONG_TYPE, f"{name} must be an Integer")


def check_bounded(name: str, value: object, high: int) -> int:
    number = check_integer(name, value)
    if not 0 <= number <= high:
        raise HintError(HintErrorCode.OUT_OF_RANGE, f"{name} must be within 0..{high}")
    return number


def check_seconds(name: str, value: object) -> float:
    """Seconds as an RFC 9651 Decimal or Integer: 0..86400 with at most 3 fractional digits."""
    seconds: float | int | Decimal
    if type(value) is int or type(value) is float or (type(value) is Decimal and value.is_finite()):
        seconds = value
    else:
        raise HintError(HintErrorCode.WRONG_TYPE, f"{name} must be a Decimal or Integer")
    if not 0 <= seconds <= MAX_SECONDS:  # nan fails too; first, as huge numbers cannot be rounded
        raise HintError(HintErrorCode.OUT_OF_RANGE, f"{name} must be within 0..{MAX_SECONDS}")
    if type(seconds) is not int and round(seconds, 3) != seconds:  # float, or Decimal from Python
        raise HintError(HintErrorCode.OUT_OF_RANGE, f"{name} has more than 3 decimals")
    return float(seconds) + 0.0  # + 0.0 turns -0.0 into 0.0


def check_fields(members: Mapping[Any, object]) -> dict[str, Any]:
    """Validate the hint keys of a parsed Dictionary or JSON object; unknown keys are ignored.

    Keys are checked in table order (v first, as a v2 object must not be judged by v1
    rules) and the first failure decides the code. ``None`` means absent.
    """
    get = members.get
    v = get("v")
    if v is not None and check_integer("v", v) != PROTOCOL_VERSION:
        raise HintError(HintErrorCode.UNSUPPORTED_VERSION, "only v=1 is defined")
    sid = get("sid")
    br = get("br")
    pbr = get("pbr")
    gap = get("gap")
    ttl = get("ttl")
    end = get("end")
    prio = get("prio")
    if sid is not None:
        sid = check_id("sid", sid)
    if br is not None:
        br = check_id("br", br)
    if pbr is not None:
        pbr = check_id("pbr", pbr)
    if gap is not None:
        gap = check_seconds("gap", gap)
    if ttl is not None:
        ttl = check_bounded("ttl", ttl, MAX_SECONDS)
    if end is None:
        end = False
    elif type(end) is not bool:
        raise HintError(HintErrorCode.WRONG_TYPE, "end must be a Boolean")
    prio = DEFAULT_PRIO if prio is None else check_bounded("prio", prio, MAX_PRIO)
    if pbr is not None and (br is None or br == ROOT_BRANCH or pbr == br):
        raise HintError(HintErrorCode.INVALID_COMBINATION, "pbr needs a br other than root or pbr")
    return {
        "v": PROTOCOL_VERSION,
        "sid": sid,
        "br": br,
        "pbr": pbr,
        "gap": gap,
        "ttl": ttl,
        "end": end,
        "prio": prio,
    }


class AgentHints(BaseModel):
    """One request's hints (protocol v1); absent keys hold their defaults."""

    model_config = ConfigDict(frozen=True)

    v: int = PROTOCOL_VERSION
    sid: str | None = None
    br: str | None = None
    pbr: str | None = None
    gap: float | None = None
    ttl: int | None = None
    end: bool = False
    prio: int = DEFAULT_PRIO

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: object) -> object:
        return check_fields(data) if isinstance(data, Mapping) else data

    def normalized(self) -> dict[str, object]:
        """The full JSON object, every key present, ``None`` for absent (the vectors' form)."""
        return {
            "v": self.v,
            "sid": self.sid,
            "br": self.br,
            "pbr": self.pbr,
            "gap": self.gap,
            "ttl": self.ttl,
            "end": self.end,
            "prio": self.prio,
        }


def trusted_hints(fields: dict[str, Any]) -> AgentHints:
    """An AgentHints from a complete, already checked field dict, without a pydantic pass.

    This is what ``model_construct`` ends in (the same four attributes), minus its
    per-field loop, which alone cost more than parsing the header.
    """
    hints = _new(AgentHints)
    _setattr(hints, "__dict__", fields)
    _setattr(hints, "__pydantic_fields_set__", set(fields))
    _setattr(hints, "__pydantic_extra__", None)
    _setattr(hints, "__pydantic_private__", None)
    return hints


_new = object.__new__
_setattr = object.__setattr__


def build_hints(members: Mapping[Any, object]) -> AgentHints:
    """The hot path shared by every wire form: bound the member count, check once, build."""
    if len(members) > MAX_MEMBERS:
        raise HintError(HintErrorCode.TOO_MANY_MEMBERS, f"more than {MAX_MEMBERS} members")
    return trusted_hints(check_fields(members))
