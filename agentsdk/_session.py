"""Sessions: a conversation that outlives a run, plus what the runs learned about it.

Besides the messages, a session keeps its token usage and its tools' latency histograms,
so a resumed session (even in another process) sends informed ``gap`` hints from its
first request. The SQLite tables carry this project's prefix (``agentsdk_``) and a schema
version, so one file can also hold the OpenAI Agents SDK's sessions.
"""

from __future__ import annotations

import copy
import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import anyio.to_thread
from pydantic import BaseModel, Field

from ._errors import UserError
from ._items import Message
from ._latency import LatencyStats
from ._scope import check_session_id
from ._usage import Usage

__all__ = ["SCHEMA_VERSION", "InMemorySession", "SQLiteSession", "Session", "SessionStats"]

T = TypeVar("T")


class SessionStats(BaseModel):
    """What a session accumulates across runs besides its messages.

    ``turn_ended_at`` is when its last run ended (Unix time): the next run's start
    measures how long the user took to reply.
    """

    usage: Usage = Field(default_factory=Usage)
    latency: LatencyStats = Field(default_factory=LatencyStats)
    turn_ended_at: float | None = None


class Session(Protocol):
    """Storage of one conversation; its ``session_id`` is the ``sid`` hint, so it must be a
    protocol id (1-128 characters from ``A-Za-z0-9._:~/-``).

    The shape of the OpenAI Agents SDK's ``Session``, plus ``get_stats``/``save_stats``.
    """

    @property
    def session_id(self) -> str: ...

    async def get_items(self, limit: int | None = None) -> list[Message]:
        """The conversation, oldest first (only the latest ``limit`` items if given)."""
        ...

    async def add_items(self, items: Sequence[Message]) -> None: ...

    async def pop_item(self) -> Message | None:
        """Remove and return the latest item (to retract a turn)."""
        ...

    async def clear(self) -> None:
        """Forget the messages and the stats."""
        ...

    async def get_stats(self) -> SessionStats: ...

    async def save_stats(self, stats: SessionStats) -> None: ...


def _new_id() -> str:
    return f"session-{uuid.uuid4().hex}"


class InMemorySession:
    """A session that lives as long as the object: tests, notebooks, one process."""

    def __init__(self, session_id: str | None = None) -> None:
        self.session_id = (
            _new_id() if session_id is None else check_session_id(session_id, "InMemorySession")
        )
        self._items: list[Message] = []
        self._stats = SessionStats()

    async def get_items(self, limit: int | None = None) -> list[Message]:
        items = self._items if limit is None else self._items[max(len(self._items) - limit, 0) :]
        return copy.deepcopy(items)

    async def add_items(self, items: Sequence[Message]) -> None:
        self._items.extend(copy.deepcopy(list(items)))

    async def pop_item(self) -> Message | None:
        return self._items.pop() if self._items else None

    async def clear(self) -> None:
        self._items.clear()
        self._stats = SessionStats()

    async def get_stats(self) -> SessionStats:
        return self._stats.model_copy(deep=True)

    async def save_stats(self, stats: SessionStats) -> None:
        self._stats = stats.model_copy(deep=True)


SCHEMA_VERSION = 1
"""Version of ``SQLiteSession``'s tables, kept in ``agentsdk_schema``."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS agentsdk_schema (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS agentsdk_messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS agentsdk_messages_by_session ON agentsdk_messages (session_id, id);
CREATE TABLE IF NOT EXISTS agentsdk_sessions (
    session_id TEXT PRIMARY KEY,
    stats TEXT NOT NULL
);
"""


class SQLiteSession:
    """A session in a SQLite file (stdlib ``sqlite3``), resumable from any process.

    The database runs in WAL mode, so readers in other processes do not block the writer.
    Queries run in a worker thread; one connection per object, serialised by a lock.
    Concurrent runs of the same session in different processes interleave their messages
    and the last ``save_stats`` wins; ``pop_item`` is atomic across processes (each item
    is returned once). A file whose tables a newer version of this SDK
    wrote is refused (``UserError``) rather than misread. ``close()`` (or leaving a
    ``with`` / ``async with`` block) closes the connection.
    """

    def __init__(self, session_id: str, db_path: str | os.PathLike[str] = ":memory:") -> None:
        self.session_id = check_session_id(session_id, "SQLiteSession")
        if not isinstance(db_path, str | os.PathLike):
            raise UserError(
                f"SQLiteSession: db_path must be a file path, got {type(db_path).__name__}"
            )
        self._lock = threading.Lock()
        self._db = sqlite3.connect(db_path, check_same_thread=False, timeout=30.0)
        with self._lock, self._db:
            if str(db_path) != ":memory:":
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
            (version,) = self._db.execute("SELECT max(version) FROM agentsdk_schema").fetchone()
            if version is None:
                self._db.execute("INSERT INTO agentsdk_schema VALUES (?)", (SCHEMA_VERSION,))
        if version is not None and version > SCHEMA_VERSION:
            self._db.close()
            raise UserError(
                f"SQLiteSession: {os.fspath(db_path)} holds sessions of schema version"
                f" {version}, newer than this SDK's {SCHEMA_VERSION}: upgrade agentsdk"
            )

    async def get_items(self, limit: int | None = None) -> list[Message]:
        rows = await self._run(
            lambda db: db.execute(
                "SELECT message FROM (SELECT id, message FROM agentsdk_messages"
                " WHERE session_id = ? ORDER BY id DESC LIMIT ?) ORDER BY id",
                (self.session_id, -1 if limit is None else limit),
            ).fetchall()
        )
        return [json.loads(message) for (message,) in rows]

    async def add_items(self, items: Sequence[Message]) -> None:
        rows = [(self.session_id, json.dumps(item)) for item in items]
        await self._run(
            lambda db: db.executemany(
                "INSERT INTO agentsdk_messages (session_id, message) VALUES (?, ?)", rows
            )
        )

    async def pop_item(self) -> Message | None:
        def pop(db: sqlite3.Connection) -> Message | None:
            # Take the write lock before reading: another process popping at
            # the same moment must not read (and return) the same row.
            db.execute("BEGIN IMMEDIATE")
            row = db.execute(
                "SELECT id, message FROM agentsdk_messages WHERE session_id = ?"
                " ORDER BY id DESC LIMIT 1",
                (self.session_id,),
            ).fetchone()
            if row is None:
                return None
            db.execute("DELETE FROM agentsdk_messages WHERE id = ?", (row[0],))
            message: Message = json.loads(row[1])
            return message

        return await self._run(pop)

    async def clear(self) -> None:
        def clear(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM agentsdk_messages WHERE session_id = ?", (self.session_id,))
            db.execute("DELETE FROM agentsdk_sessions WHERE session_id = ?", (self.session_id,))

        await self._run(clear)

    async def get_stats(self) -> SessionStats:
        row = await self._run(
            lambda db: db.execute(
                "SELECT stats FROM agentsdk_sessions WHERE session_id = ?", (self.session_id,)
            ).fetchone()
        )
        return SessionStats() if row is None else SessionStats.model_validate_json(row[0])

    async def save_stats(self, stats: SessionStats) -> None:
        payload = stats.model_dump_json()
        await self._run(
            lambda db: db.execute(
                "INSERT INTO agentsdk_sessions (session_id, stats) VALUES (?, ?)"
                " ON CONFLICT (session_id) DO UPDATE SET stats = excluded.stats",
                (self.session_id, payload),
            )
        )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> SQLiteSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> SQLiteSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def _run(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``query`` in one transaction, in a worker thread."""

        def locked() -> T:
            with self._lock, self._db:
                return query(self._db)

        return await anyio.to_thread.run_sync(locked)
