"""``ScriptedModel``: a test double for the model, shipped as public API.

It has the call surface the runner uses (``chat.completions.create``) and the control sink
of a hinted client, so tests exercise the real loop with no server. It records each request
with the hints in force, emulates a prefix cache (``cached_tokens``), and records control
events.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from openai.types.chat import ChatCompletion

from hints_spec import ROOT_BRANCH, AgentHints, ControlEvent, End, Fork, ToolEnd, ToolStart

from ._errors import UserError
from ._items import Message
from ._scope import current_hints

__all__ = ["ControlRecord", "ModelRequest", "Reply", "ScriptedCall", "ScriptedModel"]

_CHARS_PER_TOKEN = 4
E = TypeVar("E", ToolStart, ToolEnd, Fork, End)


@dataclass(frozen=True)
class ScriptedCall:
    """A tool call to reply with; ``arguments`` may be a dict or any raw string."""

    name: str
    arguments: str | Mapping[str, object] = "{}"
    id: str | None = None


Reply: TypeAlias = str | Sequence[ScriptedCall] | ChatCompletion | BaseException
"""Final text, tool calls, a ready completion, or an exception to raise."""


@dataclass(frozen=True)
class ModelRequest:
    """One recorded ``create`` call: its keyword arguments and the hints in force."""

    kwargs: dict[str, Any]
    hints: AgentHints | None
    prompt_tokens: int
    cached_tokens: int

    @property
    def messages(self) -> list[Message]:
        messages: list[Message] = self.kwargs["messages"]
        return messages

    @property
    def tools(self) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = self.kwargs.get("tools", [])
        return tools

    @property
    def branch(self) -> str:
        """The request's branch id (``"root"`` when the hints name none)."""
        if self.hints is None or self.hints.br is None:
            return ROOT_BRANCH
        return self.hints.br


@dataclass(frozen=True)
class ControlRecord:
    """One control event a run submitted, with its session id."""

    sid: str
    event: ControlEvent


class ScriptedModel:
    """Replies from a script instead of a model, recording what it was asked.

    ``script`` is a list of replies used in call order, or a function of the request
    (e.g. to reply per ``request.branch`` when sub-agents run concurrently). Token counts
    are characters / 4 of the rendered prompt (tools, then messages); ``cached_tokens``
    is the longest prefix shared with any earlier request, as a server's prefix cache
    would report it.
    """

    def __init__(self, script: Sequence[Reply] | Callable[[ModelRequest], Reply]) -> None:
        if not (callable(script) or isinstance(script, list | tuple)):
            raise UserError(
                "ScriptedModel: a list of replies or a function of the request expected,"
                f" got {type(script).__name__}"
            )
        self.requests: list[ModelRequest] = []
        self.control_events: list[ControlRecord] = []
        self.chat = _Chat(self)
        self._script = script if callable(script) else iter(list(script))
        self._prompts: list[str] = []
        self._ids = itertools.count()

    async def send(self, sid: str, events: Sequence[ControlEvent]) -> None:
        """Record control events, as ``ControlChannel.send`` would post them."""
        self.control_events.extend(ControlRecord(sid, event) for event in events)

    def events_of(self, kind: type[E]) -> list[E]:
        """The recorded control events of one type, in order."""
        return [record.event for record in self.control_events if isinstance(record.event, kind)]

    async def create(self, **kwargs: Any) -> ChatCompletion:
        kwargs = copy.deepcopy(kwargs)
        prompt = json.dumps(kwargs.get("tools", []), sort_keys=True) + "".join(
            json.dumps(message, sort_keys=True) for message in kwargs["messages"]
        )
        prompt_tokens = max(1, math.ceil(len(prompt) / _CHARS_PER_TOKEN))
        shared = max((_common_prefix(prompt, earlier) for earlier in self._prompts), default=0)
        cached = min(shared // _CHARS_PER_TOKEN, prompt_tokens - 1)
        self._prompts.append(prompt)
        request = ModelRequest(kwargs, current_hints(), prompt_tokens, cached)
        self.requests.append(request)
        if callable(self._script):
            reply = self._script(request)
        else:
            try:
                reply = next(self._script)
            except StopIteration:
                used = len(self.requests) - 1
                raise RuntimeError(
                    f"ScriptedModel: script exhausted after {used} replies"
                ) from None
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, ChatCompletion):
            return reply
        return self._completion(reply, request)

    def _completion(
        self, reply: str | Sequence[ScriptedCall], request: ModelRequest
    ) -> ChatCompletion:
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if isinstance(reply, str):
            message["content"] = reply
            finish_reason, written = "stop", reply
        else:
            message["tool_calls"] = [
                {
                    "id": call.id or f"call_{next(self._ids)}",
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": call.arguments
                        if isinstance(call.arguments, str)
                        else json.dumps(call.arguments),
                    },
                }
                for call in reply
            ]
            finish_reason, written = "tool_calls", json.dumps(message["tool_calls"])
        completion_tokens = max(1, math.ceil(len(written) / _CHARS_PER_TOKEN))
        return ChatCompletion.model_validate(
            {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": request.kwargs["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
                "usage": {
                    "prompt_tokens": request.prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": request.prompt_tokens + completion_tokens,
                    "prompt_tokens_details": {"cached_tokens": request.cached_tokens},
                },
            }
        )


class _Completions:
    def __init__(self, model: ScriptedModel) -> None:
        self.create = model.create


class _Chat:
    def __init__(self, model: ScriptedModel) -> None:
        self.completions = _Completions(model)


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
