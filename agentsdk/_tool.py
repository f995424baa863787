"""``@tool``: a Python function becomes a tool with a JSON schema the model sees.

The schema and the arguments model come from the signature (``_tool_schema``). Every
way a definition can be wrong is raised at decoration time; every way a *call* can be wrong
(garbage JSON, wrong types, a tool that raises or hangs) becomes a message to the model.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar, overload

import anyio.to_thread
import pydantic_core
from pydantic import BaseModel, ValidationError

from hints_spec import USER_TOOL

from ._context import RunContext
from ._errors import ToolDefinitionError
from ._tool_schema import read_signature

__all__ = [
    "Tool",
    "ToolArgumentsError",
    "parse_arguments",
    "tool",
    "tool_output",
]

logger = logging.getLogger(__name__)

MAX_ABANDONED_CALLS = 4
"""Calls of one sync tool that may still run in their threads after a timeout
(a thread cannot be stopped); while that many do, a new call fails at once."""

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI-compatible servers accept
_ERROR_ARGS_SHOWN = 200  # how much of a bad argument string the model is shown back

F = TypeVar("F", bound=Callable[..., Any])
ToolFunction = Callable[[RunContext[Any], BaseModel], Awaitable[object]]


class ToolArgumentsError(ValueError):
    """The model's arguments for a call cannot be used; the message is for the model."""


@dataclass(frozen=True, eq=False)
class Tool:
    """A function the model can call.

    ``parameters`` is the JSON schema sent to the model; ``args_model`` validates what
    comes back. ``timeout`` bounds one call (None: the run's default). ``expected_seconds``
    is the latency prior until the tool has run. ``lenient`` tools drop invalid arguments
    and run with their defaults instead of failing: for models (or random weights) that
    write garbage arguments. ``strict`` asks the server to constrain the arguments to the
    schema (OpenAI's ``strict`` flag; vLLM enforces it with guided decoding) and rejects
    unknown keys.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    args_model: type[BaseModel]
    function: ToolFunction
    timeout: float | None = None
    expected_seconds: float | None = None
    lenient: bool = False
    strict: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ToolDefinitionError(f"tool name {self.name!r} must match {_NAME.pattern}")
        if not (isinstance(self.args_model, type) and issubclass(self.args_model, BaseModel)):
            raise ToolDefinitionError(
                f"tool {self.name!r}: args_model must be a pydantic model class,"
                f" got {self.args_model!r:.60}"
            )
        if not callable(self.function) or not isinstance(self.description, str):
            raise ToolDefinitionError(
                f"tool {self.name!r}: function must be an async callable and description a str"
            )
        if self.name == USER_TOOL:  # its latencies and tool_start events would be the user's
            raise ToolDefinitionError(
                f"tool name {USER_TOOL!r} is reserved for the human wait (SPEC §6.3): "
                "give the tool another name (name=...)"
            )
        for label, flag in (("lenient", self.lenient), ("strict", self.strict)):
            if not isinstance(flag, bool):  # "yes" would be truthy, "false" too
                raise ToolDefinitionError(
                    f"tool {self.name!r}: {label} must be True or False, got {flag!r}"
                )
        for label, value in (
            ("timeout", self.timeout),
            ("expected_seconds", self.expected_seconds),
        ):
            if value is not None and not (
                isinstance(value, int | float) and not isinstance(value, bool) and value > 0
            ):
                raise ToolDefinitionError(
                    f"tool {self.name!r}: {label} must be a number of seconds > 0, got {value!r}"
                )

    def definition(self) -> dict[str, Any]:
        """The entry of the request's ``tools`` list."""
        function: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
        }
        if self.strict:
            function["strict"] = True
        return {"type": "function", "function": function}

    def validate_arguments(self, arguments: str) -> BaseModel:
        """Parse and validate a call's raw arguments; raises ``ToolArgumentsError``."""
        parsed = parse_arguments(arguments)
        if parsed is None:
            if not self.lenient:
                shown = arguments[:_ERROR_ARGS_SHOWN]
                raise ToolArgumentsError(f"arguments must be a JSON object, got {shown!r}")
            parsed = {}
        try:
            return self.args_model.model_validate(parsed)
        except ValidationError as err:
            if not self.lenient:
                raise ToolArgumentsError(_summarize(err)) from err
            bad = {str(e["loc"][0]) for e in err.errors() if e["loc"]}
            kept = {key: value for key, value in parsed.items() if key not in bad}
            return self.args_model.model_validate(kept)  # defaults cover every dropped key

    async def call(self, context: RunContext[Any], arguments: BaseModel) -> str:
        """Run the tool; anything but a string result is sent as JSON."""
        return tool_output(await self.function(context, arguments))


def tool_output(result: object) -> str:
    """What the model is told a call returned: the string itself, anything else as JSON."""
    if isinstance(result, str):
        return result
    return pydantic_core.to_json(result, fallback=str).decode()


def parse_arguments(arguments: str) -> dict[str, Any] | None:
    """The arguments as a JSON object, or None; NaN/Infinity are rejected, not parsed."""
    try:
        value = json.loads(arguments or "{}", parse_constant=_reject_constant)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _summarize(err: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}"
        for e in err.errors(include_url=False)
    )


@overload
def tool(function: F, /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    expected_seconds: float | None = None,
    lenient: bool = False,
    strict: bool = False,
) -> Callable[[F], Tool]: ...


def tool(
    function: F | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    expected_seconds: float | None = None,
    lenient: bool = False,
    strict: bool = False,
) -> Tool | Callable[[F], Tool]:
    """Turn a sync or async function into a ``Tool`` (bare ``@tool`` or ``@tool(...)``).

    A first parameter annotated ``RunContext`` receives the run's context and is hidden
    from the model. Sync functions run in a worker thread so they cannot stall the loop
    (and can be timed out, though the thread finishes on its own).
    """

    def decorate(fn: F) -> Tool:
        return _build(fn, name, description, timeout, expected_seconds, lenient, strict)

    return decorate if function is None else decorate(function)


def _build(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    timeout: float | None,
    expected_seconds: float | None,
    lenient: bool,
    strict: bool,
) -> Tool:
    tool_name = name or str(getattr(fn, "__name__", ""))
    arguments = read_signature(fn, tool_name, lenient=lenient, strict=strict)
    return Tool(
        name=tool_name,
        description=description if description is not None else arguments.summary,
        parameters=arguments.schema,
        args_model=arguments.model,
        function=_invoker(fn, arguments.params, arguments.takes_context, tool_name),
        timeout=timeout,
        expected_seconds=expected_seconds,
        lenient=lenient,
        strict=strict,
    )


class _Abandoned:
    """The calls of one sync tool still running in threads nobody waits for."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.running = 0

    async def run(self, call: Callable[[], object]) -> object:
        with self.lock:
            if self.running >= MAX_ABANDONED_CALLS:
                raise RuntimeError(
                    f"{self.running} earlier calls of tool {self.name!r} still run after "
                    "their timeout; not starting another"
                )
        started = time.monotonic()
        state = {"done": False, "abandoned": False}

        def work() -> object:
            try:
                return call()
            finally:
                with self.lock:
                    state["done"] = True
                    if state["abandoned"]:
                        self.running -= 1
                        logger.warning(
                            "agentsdk: abandoned call of tool %r returned after %.1f s",
                            self.name, time.monotonic() - started,
                        )  # fmt: skip

        try:
            return await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            with self.lock:
                if not state["done"]:
                    state["abandoned"] = True
                    self.running += 1
                    logger.warning(
                        "agentsdk: sync tool %r cancelled after %.1f s (timeout or run "
                        "cancelled); its thread cannot be stopped and runs on (%d such)",
                        self.name, time.monotonic() - started, self.running,
                    )  # fmt: skip
            raise


def _invoker(
    fn: Callable[..., Any], params: list[inspect.Parameter], takes_context: bool, name: str
) -> ToolFunction:
    is_async = inspect.iscoroutinefunction(fn)
    abandoned = _Abandoned(name)

    async def invoke(context: RunContext[Any], arguments: BaseModel) -> object:
        args: list[object] = [context] if takes_context else []
        kwargs: dict[str, object] = {}
        for index, param in enumerate(params):
            value = getattr(arguments, f"p{index}")
            if param.kind is param.POSITIONAL_ONLY:
                args.append(value)
            else:
                kwargs[param.name] = value
        if is_async:
            return await fn(*args, **kwargs)
        return await abandoned.run(partial(fn, *args, **kwargs))

    return invoke
