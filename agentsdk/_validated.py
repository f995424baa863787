"""The base of the SDK's validated value objects: a wrong argument is a ``UserError``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, PydanticUserError, TypeAdapter, ValidationError

from ._errors import invalid_arguments

__all__ = ["JSON_TYPES", "Validated", "has_json_schema"]

JSON_TYPES = (
    "str, int, float, bool, Literal, a list, dict or Optional of these, a pydantic model,"
    " a dataclass or a TypedDict"
)
"""What to use instead of a type that has no JSON schema."""


def has_json_schema(annotation: Any) -> bool:
    """Whether pydantic can describe ``annotation`` to a model as JSON schema."""
    try:
        TypeAdapter(annotation).json_schema()
    except (PydanticUserError, TypeError):
        return False
    return True


class Validated(BaseModel):
    """A frozen pydantic model whose constructor raises ``UserError``, not pydantic's
    ``ValidationError``: one exception family, and a message naming the class."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise invalid_arguments(f"{type(self).__name__}(...)", err) from None
