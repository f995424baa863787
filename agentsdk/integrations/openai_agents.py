"""Tool lifecycle hints for runs of the OpenAI Agents SDK (``pip install openai-agents``).

Its model calls already carry hints when it uses a hinted client inside a ``hint_scope``
(``OpenAIChatCompletionsModel(openai_client=HintedAsyncOpenAI(...))``). What it cannot say
by itself is when a tool starts and how long it will take: ``HintsRunHooks`` adds that,
as ``tool_start`` (with an ETA from a ``LatencyEstimator``) and ``tool_end`` control
events. Importing this module imports ``agents``; ``agentsdk`` itself never does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agents import Agent, RunContextWrapper, RunHooks, Tool

from hints_spec import ToolEnd, ToolStart

from .._client import HintedAsyncOpenAI, HintedOpenAI
from .._control import ControlChannel
from .._latency import LatencyEstimator
from .._scope import current_hints

__all__ = ["HintsRunHooks"]


class HintsRunHooks(RunHooks[Any]):
    """``RunHooks`` that report tool starts (with ETA) and ends to the serving engine.

    Pass it as ``Runner.run(..., hooks=HintsRunHooks(client))`` and run inside
    ``hint_scope(session=...)`` (or give ``session_id``): the session and branch come from
    the scope, like the model calls'. Events are fire-and-forget; durations feed
    ``estimator``, so ETAs learn from the run (share one estimator across runs to keep
    learning).
    """

    def __init__(
        self,
        client: HintedAsyncOpenAI | HintedOpenAI,
        *,
        session_id: str | None = None,
        estimator: LatencyEstimator | None = None,
    ) -> None:
        self.estimator = estimator if estimator is not None else LatencyEstimator()
        self._channel = ControlChannel(client)
        self._session_id = session_id
        self._started: dict[str, float] = {}

    async def on_tool_start(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool
    ) -> None:
        self._started[_call_key(context, tool)] = time.monotonic()
        eta = self.estimator.estimate({tool.name: None})
        self._send(lambda br: ToolStart(br=br, tool=tool.name, eta=round(eta or 0.0, 3)))

    async def on_tool_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool, result: object
    ) -> None:
        started = self._started.pop(_call_key(context, tool), None)
        if started is not None:
            self.estimator.observe(tool.name, time.monotonic() - started)
        self._send(lambda br: ToolEnd(br=br, tool=tool.name))

    async def flush(self) -> None:
        """Wait for the events in flight (before closing the client or the loop)."""
        await self._channel.flush()

    def _send(self, event: Callable[[str | None], ToolStart | ToolEnd]) -> None:
        """Build the event for the scope's branch and submit it, if a session is known."""
        hints = current_hints()
        sid = self._session_id or (hints.sid if hints is not None else None)
        if sid is not None:
            self._channel.submit(sid, [event(hints.br if hints is not None else None)])


def _call_key(context: RunContextWrapper[Any], tool: Tool) -> str:
    """Function tools get a ``ToolContext`` with the call id; other tools share their name."""
    return str(getattr(context, "tool_call_id", None) or tool.name)
