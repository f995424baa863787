"""Structured final output: ``Agent(output_type=...)``'s JSON schema and its validation.

The schema goes out as ``response_format`` (vLLM and OpenAI constrain the answer to it);
the answer comes back through pydantic. A type whose schema is not an object (``int``,
``list[str]``) travels wrapped as ``{"output": ...}``, as servers want an object.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from ._errors import OutputValidationError, UserError
from ._validated import JSON_TYPES, has_json_schema

__all__ = ["OutputSchema"]

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_WRAPPER_KEY = "output"


class OutputSchema:
    """How one ``output_type`` is asked for and checked."""

    def __init__(self, output_type: Any) -> None:
        self.output_type = output_type
        if not has_json_schema(output_type):
            raise UserError(f"output_type {output_type!r} has no JSON schema: use {JSON_TYPES}")
        adapter: TypeAdapter[Any] = TypeAdapter(output_type)
        schema = adapter.json_schema()
        self._wrapped = schema.get("type") != "object"
        if self._wrapped:
            schema = {
                "type": "object",
                "properties": {_WRAPPER_KEY: schema},
                "required": [_WRAPPER_KEY],
                **({"$defs": schema.pop("$defs")} if "$defs" in schema else {}),
            }
        self._adapter = adapter
        name = getattr(output_type, "__name__", None) or "output"
        self.response_format: dict[str, Any] = {
            "type": "json_schema",
            "json_schema": {"name": _NAME_UNSAFE.sub("_", name)[:64], "schema": schema},
        }

    def validate(self, text: str) -> Any:
        """The answer as ``output_type``; raises ``OutputValidationError``."""
        try:
            if self._wrapped:
                wrapper = TypeAdapter(dict[str, Any]).validate_json(text)
                if _WRAPPER_KEY not in wrapper:
                    raise OutputValidationError(
                        f'final output has no "{_WRAPPER_KEY}" key: {text!r:.200}', text
                    )
                return self._adapter.validate_python(wrapper[_WRAPPER_KEY])
            return self._adapter.validate_json(text)
        except ValidationError as err:
            raise OutputValidationError(
                f"final output is not a valid {_type_name(self.output_type)}: "
                f"{err.error_count()} error(s), first: {err.errors()[0]['msg']}; "
                f"output was {text!r:.200}",
                text,
            ) from err


def _type_name(output_type: Any) -> str:
    if isinstance(output_type, type) and issubclass(output_type, BaseModel):
        return output_type.__name__
    return repr(output_type)
