"""The single exception type of the codec and its stable, language-neutral codes."""

from __future__ import annotations

from enum import StrEnum


class HintErrorCode(StrEnum):
    """Why a hint was rejected; the values are the wire names used in vectors and outcomes."""

    SYNTAX = "syntax"
    TOO_LONG = "too_long"
    TOO_MANY_MEMBERS = "too_many_members"
    WRONG_TYPE = "wrong_type"
    OUT_OF_RANGE = "out_of_range"
    BAD_ID = "bad_id"
    UNSUPPORTED_VERSION = "unsupported_version"
    INVALID_COMBINATION = "invalid_combination"
    INVALID_EVENT = "invalid_event"


class HintError(ValueError):
    """Raised for every invalid input, so callers can ignore-and-count with one except clause."""

    code: HintErrorCode
    message: str

    def __init__(self, code: HintErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[type[HintError], tuple[HintErrorCode, str]]:
        # ValueError pickles its args (the formatted text); rebuild from the fields instead.
        return (HintError, (self.code, self.message))
