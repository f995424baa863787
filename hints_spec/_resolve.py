"""What a server derives from one request: the precedence rule of SPEC.md."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ._body import parse_body
from ._errors import HintError
from ._header import parse_header
from ._interop import from_interop, merge_hints
from ._model import AgentHints
from .core import BODY_FIELD, HEADER_NAME

__all__ = ["resolve_hints"]


def resolve_hints(
    headers: Mapping[str, str], body: Mapping[str, object]
) -> tuple[AgentHints | None, list[tuple[str, HintError]]]:
    """The effective hint of a request: header > body > interop, key by key.

    Each source ("header", "body", "interop") that fails validation is ignored on
    its own and returned with its error, so a server can count it and go on.
    """
    errors: list[tuple[str, HintError]] = []

    def attempt(source: str, parse: Callable[[], AgentHints | None]) -> AgentHints | None:
        try:
            return parse()
        except HintError as error:
            errors.append((source, error))
            return None

    lowered = {name.lower(): value for name, value in headers.items()}
    header_value = lowered.get(HEADER_NAME.lower())
    header = None if header_value is None else attempt("header", lambda: parse_header(header_value))
    body_value = body.get(BODY_FIELD)
    in_body = None if body_value is None else attempt("body", lambda: parse_body(body_value))
    interop = attempt("interop", lambda: from_interop(lowered, body))
    return merge_hints(merge_hints(header, in_body), interop), errors
