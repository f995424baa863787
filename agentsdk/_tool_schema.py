"""A tool function's signature as a pydantic arguments model and its JSON schema.

The type hints give the schema (through a pydantic model, which also validates the
model's arguments) and the docstring (read by ``docstring_parser``) the descriptions: its
summary describes the tool, and Google, ReST, NumPy or Epydoc entries the parameters. A
first parameter annotated ``RunContext`` is the run's context, hidden from the model.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_origin, get_type_hints

import docstring_parser
from pydantic import BaseModel, ConfigDict, Field, PydanticUserError, create_model

from ._context import RunContext
from ._errors import ToolDefinitionError
from ._validated import JSON_TYPES, has_json_schema

__all__ = ["Signature", "json_schema", "read_signature"]


@dataclass(frozen=True)
class Signature:
    """What a tool takes: ``model`` validates the arguments, whose field ``p{i}`` is
    ``params[i]`` (by alias, its name); ``schema`` is what the model is shown."""

    model: type[BaseModel]
    schema: dict[str, Any]
    summary: str
    params: list[inspect.Parameter]
    takes_context: bool


def read_signature(
    fn: Callable[..., Any], tool_name: str, *, lenient: bool, strict: bool
) -> Signature:
    """``fn``'s signature, or a ``ToolDefinitionError`` naming the parameter to change."""
    if inspect.isclass(fn) or not callable(fn):
        what = f"class {fn.__name__}" if inspect.isclass(fn) else type(fn).__name__
        raise ToolDefinitionError(
            f"@tool takes a function (sync or async), got {what}: decorate a function,"
            " or a method of an instance"
        )
    try:
        hints = get_type_hints(fn)
    except Exception as err:  # unresolvable forward references, in the user's module
        raise ToolDefinitionError(f"tool {tool_name!r}: cannot resolve type hints: {err}") from err
    docstring = docstring_parser.parse(inspect.getdoc(fn) or "")
    summary = (docstring.description or "").strip()
    param_docs = {
        p.arg_name: " ".join(p.description.split()) for p in docstring.params if p.description
    }
    params = list(inspect.signature(fn).parameters.values())
    takes_context = bool(params) and _is_context(hints.get(params[0].name))
    if takes_context:
        params = params[1:]
    fields: dict[str, Any] = {}
    for index, param in enumerate(params):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(
                f"tool {tool_name!r}: *args/**kwargs parameter {param.name!r} has no schema"
            )
        if _is_context(hints.get(param.name)):
            raise ToolDefinitionError(f"tool {tool_name!r}: RunContext must be the first parameter")
        required = param.default is param.empty
        if lenient and required:
            raise ToolDefinitionError(
                f"tool {tool_name!r}: lenient tools need a default for {param.name!r}"
            )
        # Positional field names with aliases: any parameter name works, even ones that
        # shadow BaseModel attributes ("schema") or that pydantic treats as private ("_x").
        fields[f"p{index}"] = (
            hints.get(param.name, Any),
            Field(
                ... if required else param.default,
                alias=param.name,
                description=param_docs.get(param.name),
            ),
        )
    try:
        args_model: type[BaseModel] = create_model(
            f"{tool_name}_arguments",
            __config__=ConfigDict(extra="forbid" if strict else "ignore"),
            **fields,
        )
        schema = json_schema(args_model)
    except PydanticUserError:
        bad = [
            f"{p.name}: {hints.get(p.name)!r}"
            for p in params
            if not has_json_schema(hints.get(p.name, Any))
        ]
        raise ToolDefinitionError(
            f"tool {tool_name!r}: unsupported parameter type ({', '.join(bad)} has no JSON"
            f" schema): give each parameter a type with a JSON schema: {JSON_TYPES}"
        ) from None
    return Signature(args_model, schema, summary, params, takes_context)


def json_schema(args_model: type[BaseModel]) -> dict[str, Any]:
    """The parameters schema of ``args_model``, by alias, without pydantic's titles."""
    schema = args_model.model_json_schema(by_alias=True)
    _drop_titles(schema)
    return schema


def _drop_titles(schema: object) -> None:
    """Remove generated titles: prompt tokens that tell the model nothing.

    Only string-valued ``title`` keys go, so a parameter named ``title`` (whose value is
    a schema dict) survives.
    """
    if isinstance(schema, dict):
        if isinstance(schema.get("title"), str):
            del schema["title"]
        for value in schema.values():
            _drop_titles(value)
    elif isinstance(schema, list):
        for value in schema:
            _drop_titles(value)


def _is_context(hint: object) -> bool:
    """``RunContext`` or ``RunContext[Deps]``."""
    return hint is RunContext or get_origin(hint) is RunContext
