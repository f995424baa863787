"""A marker for "argument not given", so that ``None`` can keep its meaning of "clear this"."""

from __future__ import annotations

import enum
from typing import Final, Literal

__all__ = ["UNSET", "Unset"]


class _UnsetType(enum.Enum):
    """Single-member enum: mypy narrows ``x is UNSET`` the way it narrows ``x is None``."""

    UNSET = enum.auto()

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _UnsetType.UNSET
Unset = Literal[_UnsetType.UNSET]
