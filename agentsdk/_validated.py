"""The base of the SDK's validated value objects: a wrong argument is a ``UserError``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ._errors import invalid_arguments

__all__ = ["Validated"]


class Validated(BaseModel):
    """A frozen pydantic model whose constructor raises ``UserError``, not pydantic's
    ``ValidationError``: one exception family, and a message naming the class."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise invalid_arguments(f"{type(self).__name__}(...)", err) from None
