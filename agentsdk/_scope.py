"""Ambient agent hints: a context-local scope that every hinted request picks up.

The hints live in a ``ContextVar`` so they follow the code that makes the request, not the client
object: one client can serve many sessions and branches at once, and a scope entered before
``asyncio.create_task`` / an anyio task group is inherited by the tasks started inside it.
A scope is validated and its header serialized when it is created (memoized, as agent loops
open a scope per model call with recurring values), so the per-request cost is a
``ContextVar.get``.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import re
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import TracebackType
from typing import ParamSpec, Protocol, TypeVar

from hints_spec import (
    MAX_ID_LENGTH,
    AgentHints,
    HintError,
    HintErrorCode,
    parse_body,
    serialize_header,
)

from ._errors import UserError
from ._sentinel import UNSET, Unset

__all__ = [
    "ContextThreadPoolExecutor",
    "HintArgumentError",
    "ResolvedScope",
    "SendWatch",
    "active_scope",
    "branch_slug",
    "check_session_id",
    "child_branch",
    "current_hints",
    "deliver_before_next_request",
    "hint_scope",
    "note_sent",
    "session_id_for",
    "take_pending",
]

# hint_scope argument name -> agent_hints body key.
_KEYS: Mapping[str, str] = {
    "session": "sid",
    "branch": "br",
    "parent": "pbr",
    "gap": "gap",
    "ttl": "ttl",
    "end": "end",
    "prio": "prio",
}
_BODY_KEYS = tuple(_KEYS.values())
_SLUG = re.compile(r"[^A-Za-z0-9._~-]+")
_POSITION = {arg: index for index, arg in enumerate(_KEYS)}

_ADVICE: Mapping[HintErrorCode, str] = {
    HintErrorCode.BAD_ID: (
        "session, branch and parent must be 1..128 characters from A-Z a-z 0-9 . _ : ~ / -"
    ),
    HintErrorCode.OUT_OF_RANGE: (
        "gap and ttl must be 0..86400 seconds (gap with at most 3 decimals), prio 0..7"
    ),
    HintErrorCode.WRONG_TYPE: (
        "session/branch/parent take str, gap float, ttl and prio int, end bool"
    ),
    HintErrorCode.INVALID_COMBINATION: "parent needs a branch and must differ from it",
}


class HintArgumentError(UserError):
    """A ``hint_scope`` argument the protocol would reject.

    Raised where the scope is written rather than as a 400 from the server much later.
    """

    code: HintErrorCode

    def __init__(self, message: str, code: HintErrorCode) -> None:
        super().__init__(message)
        self.code = code


def check_session_id(session_id: object, where: str) -> str:
    """``session_id`` if the protocol accepts it as ``sid``; else a ``UserError`` for ``where``."""
    if isinstance(session_id, str):
        try:
            parse_body({"sid": session_id})
            return session_id
        except HintError:
            pass
    raise UserError(
        f"{where}: session id {session_id!r:.80} is not a protocol session id: use 1-128"
        " characters from A-Z a-z 0-9 . _ : ~ / -"
    )


def branch_slug(agent_name: str) -> str:
    """``agent_name`` as it appears in branch ids (children are counted per slug)."""
    return _SLUG.sub("-", agent_name).strip("-")[:48] or "agent"


def child_branch(parent: str, slug: str, n: int) -> str:
    """The id of ``parent``'s ``n``-th child of ``slug`` (``branch_slug``): ``{parent}/{slug}-{n}``.

    Ids past the protocol's 128 characters (deep nesting) keep their last segment and a
    digest of the full path, so they stay unique and reproducible.
    """
    branch = f"{parent}/{slug}-{n}"
    if len(branch) > MAX_ID_LENGTH:
        branch = f"{slug}-{n}~{hashlib.sha256(branch.encode()).hexdigest()[:32]}"
    return branch


def session_id_for(conversation: str) -> str:
    """A framework's conversation or thread id as a session id: itself when the protocol
    accepts it, else a stable digest of it (so every turn still maps to one session)."""
    try:
        return check_session_id(conversation, "")
    except UserError:
        return "h-" + hashlib.sha256(conversation.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class ResolvedScope:
    """The effective hints of a scope, precomputed for the request hook.

    ``values`` holds the value given for each key of ``_BODY_KEYS`` (None when unset);
    nested scopes start from it.
    """

    values: tuple[object, ...]
    hints: AgentHints
    header: str


_ACTIVE: ContextVar[ResolvedScope | None] = ContextVar("agentsdk_hint_scope", default=None)
_WATCH: ContextVar[SendWatch | None] = ContextVar("agentsdk_send_watch", default=None)
_PENDING: ContextVar[Pending | None] = ContextVar("agentsdk_pending_events", default=None)


class Pending(Protocol):
    """Events on their way (a ``ControlSender``): what a request may have to wait for."""

    async def flush(self) -> None: ...

    def flush_sync(self, timeout: float | None = None) -> bool: ...


def deliver_before_next_request(pending: Pending) -> None:
    """The next hinted request of this context first waits until what was submitted to
    ``pending`` is delivered: for an adapter that submits a ``fork`` from a callback that
    cannot wait (LangChain's are sync), so that it still precedes the child's request."""
    _PENDING.set(pending)


def take_pending() -> Pending | None:
    """What the request about to go out must wait for (once), if anything."""
    pending = _PENDING.get()
    if pending is not None:
        _PENDING.set(None)
    return pending


class SendWatch:
    """Counts the hinted requests sent while it is active (``sent``).

    For an adapter that opens a scope around a request it does not make (a LangChain
    callback): afterwards it can tell whether the framework's client attached the
    hints, and say so when it did not. Enter and exit may happen in different
    callbacks; a context copied in between shares the watch.
    """

    __slots__ = ("_token", "sent")

    def __init__(self) -> None:
        self.sent = 0
        self._token: Token[SendWatch | None] | None = None

    def __enter__(self) -> SendWatch:
        self._token = _WATCH.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None, "__exit__ without __enter__"
        _WATCH.reset(self._token)
        self._token = None


def note_sent() -> None:
    """A hinted client attached the active scope to a request."""
    watch = _WATCH.get()
    if watch is not None:
        watch.sent += 1


def active_scope() -> ResolvedScope | None:
    """The innermost scope of the current context (for the client hook)."""
    return _ACTIVE.get()


def current_hints() -> AgentHints | None:
    """The effective hints of the current context, or None outside any ``hint_scope``."""
    scope = _ACTIVE.get()
    return None if scope is None else scope.hints


@functools.lru_cache(maxsize=1024, typed=True)  # typed: True must not hit the entry of 1
def _build(*values: object) -> ResolvedScope:
    hints = parse_body(dict(zip(_BODY_KEYS, values, strict=True)))
    return ResolvedScope(values, hints, serialize_header(hints))


def _resolve(base: ResolvedScope | None, overrides: Mapping[str, object]) -> ResolvedScope:
    values: list[object] = list(base.values) if base else [None] * len(_BODY_KEYS)
    if "branch" in overrides and "parent" not in overrides:
        values[_POSITION["parent"]] = None  # br and pbr move together, as in a merge (SPEC §5)
    for arg, value in overrides.items():
        values[_POSITION[arg]] = value
    try:
        try:
            return _build(*values)
        except TypeError:  # an unhashable argument: let the codec name the wrong type
            return _build.__wrapped__(*values)
    except HintError as err:
        given = ", ".join(f"{arg}={value!r}" for arg, value in overrides.items())
        advice = _ADVICE.get(err.code)
        hint = f" ({advice})" if advice else ""
        raise HintArgumentError(f"hint_scope({given}): {err.message}{hint}", err.code) from err


_P = ParamSpec("_P")
_T = TypeVar("_T")


class ContextThreadPoolExecutor(ThreadPoolExecutor):
    """A ``ThreadPoolExecutor`` whose tasks run in a copy of the submitting context, so
    the ``hint_scope`` active at ``submit`` / ``map`` reaches the hinted requests they make.

    Threads do not inherit context variables: a plain executor's tasks (and
    ``loop.run_in_executor``'s) run outside any scope, where requests carry no hints.
    ``asyncio.to_thread`` and anyio's ``to_thread.run_sync`` copy the context already;
    elsewhere, ``contextvars.copy_context().run(fn, ...)`` does it for one call.
    """

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        context = contextvars.copy_context()
        return super().submit(functools.partial(context.run, fn, *args, **kwargs))


class hint_scope:
    """Attach agent hints to every hinted request made inside the block (``with`` or
    ``async with``).

    Nested scopes override only the keys they are given; ``None`` clears a key
    (``hint_scope(branch=None)`` goes back to the root branch). A ``branch`` without
    ``parent`` also clears the inherited parent, which belonged to the old branch.
    Invalid values raise ``HintArgumentError`` at construction. ``end`` and ``prio``
    have protocol defaults (False, 3) and cannot be cleared, only set.
    """

    __slots__ = ("_base", "_overrides", "_resolved", "_token")

    def __init__(
        self,
        *,
        session: str | Unset | None = UNSET,
        branch: str | Unset | None = UNSET,
        parent: str | Unset | None = UNSET,
        gap: float | Unset | None = UNSET,
        ttl: int | Unset | None = UNSET,
        end: bool | Unset = UNSET,
        prio: int | Unset = UNSET,
    ) -> None:
        given = {
            "session": session,
            "branch": branch,
            "parent": parent,
            "gap": gap,
            "ttl": ttl,
            "end": end,
            "prio": prio,
        }
        self._overrides: Mapping[str, object] = {
            arg: value for arg, value in given.items() if value is not UNSET
        }
        self._base = _ACTIVE.get()
        self._resolved = _resolve(self._base, self._overrides)
        self._token: Token[ResolvedScope | None] | None = None

    def __enter__(self) -> AgentHints:
        if self._token is not None:
            raise RuntimeError("this hint_scope is already active; create one per with-block")
        base = _ACTIVE.get()
        if base is not self._base:  # entered under other hints than it was created under
            self._base, self._resolved = base, _resolve(base, self._overrides)
        self._token = _ACTIVE.set(self._resolved)
        return self._resolved.hints

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._token is not None, "__exit__ without __enter__"
        _ACTIVE.reset(self._token)
        self._token = None

    async def __aenter__(self) -> AgentHints:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)
