"""Hints for LangChain and LangGraph (``pip install 'agent-hints[langchain]'``).

One line: ``config={"callbacks": [HintsCallbackHandler(client)], "configurable":
{"thread_id": ...}}`` on the graph's ``invoke`` / ``ainvoke`` / ``astream``. LangGraph's
``thread_id`` (LangChain's ``session_id`` / ``conversation_id`` metadata otherwise)
becomes the hint session; each chat-model call carries it and ``gap`` (the expected
wait on the tools bound to the model), each tool call is reported as ``tool_start``
(with an ETA) and ``tool_end``, and the end of a graph run as the wait on the user.

The chat model must use a hinted client: ``ChatOpenAI(model=..., **chat_openai_clients(
HintedAsyncOpenAI(...)))`` (LangChain replaces a lone ``root_async_client`` with its own
client, so all four client arguments are given); a model call that goes out without
hints warns once (``UnhintedClientWarning``). The handler runs inline
(``run_inline``): LangChain calls it in the task that makes the model request, so the
``hint_scope`` it opens in ``on_chat_model_start`` is the request's, and it closes in
``on_llm_end`` / ``on_llm_error``. Importing this module imports ``langchain_core``;
``agentsdk`` itself never does.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from openai import AsyncOpenAI, OpenAI

from hints_spec import ROOT_BRANCH, ControlEvent, End, Fork, ToolEnd, ToolStart

from .._client import HintedAsyncOpenAI, sync_twin
from .._config import DEFAULT_USER_WAIT_PRIOR
from .._control import ControlChannel
from .._errors import UnhintedClientWarning, UserError, warn_user
from .._latency import LatencyEstimator, user_wait
from .._scope import (
    SendWatch,
    branch_slug,
    child_branch,
    deliver_before_next_request,
    hint_scope,
    session_id_for,
)

__all__ = ["HintsCallbackHandler", "chat_openai_clients"]

_SESSION_KEYS = ("thread_id", "session_id", "conversation_id")
_NS_SEP = "|"  # LangGraph's checkpoint namespace separator (langgraph._internal._constants)
_UNHINTED = (
    "HintsCallbackHandler: a chat model call of session {sid!r} went out without hints,"
    " so the server cannot keep its cache: give the chat model hinted clients,"
    " ChatOpenAI(..., **chat_openai_clients(HintedAsyncOpenAI(...))) (shown once per handler)"
)


def chat_openai_clients(client: HintedAsyncOpenAI) -> dict[str, Any]:
    """``ChatOpenAI``'s four client arguments, all hinted: ``client`` and its sync twin."""
    if not isinstance(client, HintedAsyncOpenAI):
        raise UserError(
            f"chat_openai_clients: a HintedAsyncOpenAI expected, got {type(client).__name__}"
        )
    twin = sync_twin(client)
    return {
        "root_async_client": client,
        "async_client": client.chat.completions,
        "root_client": twin,
        "client": twin.chat.completions,
    }


class HintsCallbackHandler(BaseCallbackHandler):
    """A LangChain callback handler that tells the server a thread's session and tool waits.

    ``client`` posts the control events (the chat model's, or any client of the same
    server), from ``invoke`` and ``ainvoke`` alike. ``estimator`` learns tool durations
    across runs. A graph run ends with the wait on the thread's user, or with the
    session's ``end`` when ``end_session``.
    """

    run_inline = True  # the scope it opens must be the model request's (module docstring)

    def __init__(
        self,
        client: OpenAI | AsyncOpenAI,
        *,
        estimator: LatencyEstimator | None = None,
        end_session: bool = False,
    ) -> None:
        if not isinstance(client, OpenAI | AsyncOpenAI):
            raise UserError(
                f"HintsCallbackHandler: client must be an openai client, got"
                f" {type(client).__name__}"
            )
        self.estimator = estimator if estimator is not None else LatencyEstimator()
        self.end_session = end_session
        self._channel = ControlChannel(client)
        # Subgraphs (by checkpoint namespace) -> (session, branch); per parent branch and
        # name, how many children; the subgraph runs whose end ends their branch.
        self._branches: dict[str, tuple[str, str]] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._subgraph_runs: dict[UUID, str] = {}
        self._scopes: dict[UUID, tuple[str, hint_scope, SendWatch]] = {}
        self._warned = False
        # Tool runs -> (session, branch, tool, started).
        self._tools: dict[UUID, tuple[str, str | None, str, float]] = {}
        self._roots: dict[UUID, str] = {}  # graph runs -> sid

    # Chat models: the request's scope.

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[Any]],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        invocation_params: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._channel.sender.bind_loop()
        sid = _session(metadata)
        if sid is None:
            return
        tools = (invocation_params or {}).get("tools") or []
        names = [_tool_name(t) for t in tools]
        gap = self.estimator.estimate({name: None for name in names if name})
        branch, parent = self._branch(sid, metadata)
        scope = hint_scope(
            session=sid, branch=branch, parent=parent, gap=round(gap, 3) if gap else None
        )
        scope.__enter__()
        self._scopes[run_id] = (sid, scope, SendWatch().__enter__())

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        closed = self._close_scope(run_id)
        if closed is not None and not closed[1] and not self._warned:
            self._warned = True
            warn_user(_UNHINTED.format(sid=closed[0]), UnhintedClientWarning)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._close_scope(run_id)

    # Tools: tool_start with an ETA, tool_end.

    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        sid = _session(metadata)
        name = str(serialized.get("name") or kwargs.get("name") or "tool")
        if sid is None:
            return
        branch = self._branch(sid, metadata)[0]
        self._tools[run_id] = (sid, branch, name, time.monotonic())
        eta = self.estimator.estimate({name: None})
        self._send(sid, [ToolStart(br=branch, tool=name, eta=round(eta or 0.0, 3))])

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._tool_done(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._tool_done(run_id)

    # Graph runs: the thread now waits on its user.

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._channel.sender.bind_loop()  # an async run's: its tools' threads post on it
        sid = _session(metadata)
        if sid is None:
            return
        namespace = (metadata or {}).get("checkpoint_ns")
        if parent_run_id is None:
            self._roots[run_id] = sid
        elif namespace and namespace not in self._subgraph_runs.values():
            self._subgraph_runs[run_id] = str(namespace)  # a subgraph's own run

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._root_done(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._root_done(run_id)

    async def flush(self) -> None:
        """Wait for the events in flight (before closing the client or the loop)."""
        await self._channel.flush()

    def flush_sync(self, timeout: float | None = None) -> bool:
        """``flush`` after a sync ``invoke``; False if ``timeout`` ran out first."""
        return self._channel.flush_sync(timeout)

    def _close_scope(self, run_id: UUID) -> tuple[str, int] | None:
        """Close the scope of chat model run ``run_id``: (its session, hinted requests
        sent in it), or None when the run had none."""
        opened = self._scopes.pop(run_id, None)
        if opened is None:
            return None
        sid, scope, watch = opened
        # A scope closed in another context than it was opened in ends with that context.
        with contextlib.suppress(ValueError):
            watch.__exit__()
        with contextlib.suppress(ValueError):
            scope.__exit__(None, None, None)
        return sid, watch.sent

    def _tool_done(self, run_id: UUID) -> None:
        started = self._tools.pop(run_id, None)
        if started is not None:
            sid, branch, name, at = started
            self.estimator.observe(name, time.monotonic() - at)
            self._send(sid, [ToolEnd(br=branch, tool=name)])

    def _root_done(self, run_id: UUID) -> None:
        """A subgraph's run ended: its branch ends. A graph run ended: the branches left
        end, then the session (``end_session``) or the wait on its user."""
        namespace = self._subgraph_runs.pop(run_id, None)
        if namespace is not None:
            ended = self._branches.pop(namespace, None)
            if ended is not None:
                self._send(ended[0], [End(br=ended[1])])
        sid = self._roots.pop(run_id, None)
        if sid is None:
            return
        events: list[ControlEvent] = []
        for key, (owner, branch) in list(self._branches.items()):
            if owner == sid:
                del self._branches[key]
                events.append(End(br=branch))
        last = End() if self.end_session else user_wait(self.estimator, DEFAULT_USER_WAIT_PRIOR)
        self._send(sid, [*events, last])

    def _branch(
        self, sid: str, metadata: Mapping[str, Any] | None
    ) -> tuple[str | None, str | None]:
        """(branch, parent) of a call in a LangGraph subgraph: a branch per subgraph run
        (its checkpoint namespace), a child of the enclosing one's; (None, None) at the
        top. A new branch's ``fork`` goes out before the call's request."""
        namespace = str((metadata or {}).get("langgraph_checkpoint_ns") or "")
        parts = namespace.split(_NS_SEP)[:-1]  # the last is the node's own task
        branch, parent = ROOT_BRANCH, None
        for depth in range(1, len(parts) + 1):
            key = _NS_SEP.join(parts[:depth])
            parent = branch
            known = self._branches.get(key)
            if known is None:
                slug = branch_slug(parts[depth - 1].partition(":")[0])
                n = self._counts[parent, slug] = self._counts.get((parent, slug), 0) + 1
                known = self._branches[key] = (sid, child_branch(parent, slug, n))
                fork = Fork(parent=None if parent == ROOT_BRANCH else parent, children=[known[1]])
                self._send(sid, [fork])
                deliver_before_next_request(self._channel.sender)
            branch = known[1]
        return (None, None) if parent is None else (branch, parent)

    def _send(self, sid: str, events: Sequence[ControlEvent]) -> None:
        """Queue on the channel's ordered sender: from the run's task, a tool's worker
        thread or a sync ``invoke`` alike."""
        self._channel.submit(sid, events)


def _session(metadata: Mapping[str, Any] | None) -> str | None:
    """The run's session: LangGraph's ``thread_id``, else a session or conversation id."""
    for key in _SESSION_KEYS:
        value = (metadata or {}).get(key)
        if value is not None and str(value):
            return session_id_for(str(value))
    return None


def _tool_name(tool: object) -> str | None:
    if isinstance(tool, Mapping):
        function = tool.get("function")
        name = function.get("name") if isinstance(function, Mapping) else tool.get("name")
        return str(name) if name else None
    return None
