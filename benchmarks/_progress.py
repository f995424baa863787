"""Progress of a long replay, so a run of many minutes is not silent.

A terminal gets one line redrawn in place (at most every ``min_interval_s``); a
log (CI, a file) gets a plain line per 10% of the requests, so it stays short.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

__all__ = ["Progress"]

_BAR_WIDTH = 20


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """Counts finished requests of one configuration; ``stream`` defaults to
    ``sys.stderr`` (looked up when constructed, so captured streams work)."""

    def __init__(
        self,
        label: str,
        total: int,
        stream: TextIO | None = None,
        min_interval_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.failed = 0
        self._stream = sys.stderr if stream is None else stream
        self._tty = self._stream.isatty()
        self._min_interval = min_interval_s
        self._clock = clock
        self._start = clock()
        self._drawn_at: float | None = None
        self._shown = 0  # ``done`` at the last line written
        self._width = 0  # length of the line on a terminal, to blank a longer one
        self._step = max(1, math.ceil(total / 10))
        self._closed = False
        if self._tty:
            self._write()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def advance(self, failed: bool = False) -> None:
        """One more request finished (``failed``: with an error)."""
        self.done += 1
        self.failed += int(failed)
        final = self.done >= self.total
        if self._tty:
            now = self._clock()
            due = self._drawn_at is None or now - self._drawn_at >= self._min_interval
            if final or due:
                self._write()
        elif final or self.done >= self._shown + self._step:
            self._write()

    def close(self) -> None:
        """Show the last count if it is not shown yet, and end a terminal's line."""
        if self._closed:
            return
        self._closed = True
        if self.done != self._shown:
            self._write()
        if self._tty and self._width:
            self._stream.write("\n")
            self._stream.flush()

    def _line(self) -> str:
        """The current state, e.g. ``[plain] [####......] 12/30 requests  1m05s elapsed``."""
        elapsed = self._clock() - self._start
        filled = min(_BAR_WIDTH, _BAR_WIDTH * self.done // self.total) if self.total else 0
        parts = [
            f"[{self.label}] [{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] "
            f"{self.done}/{self.total} requests"
        ]
        if self.failed:
            parts.append(f"{self.failed} failed")
        parts.append(f"{_duration(elapsed)} elapsed")
        if 0 < self.done < self.total:
            parts.append(f"~{_duration(elapsed / self.done * (self.total - self.done))} left")
        return "  ".join(parts)

    def _write(self) -> None:
        text = self._line()
        if self._tty:
            self._stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
            self._drawn_at = self._clock()
        else:
            self._stream.write(text + "\n")
        self._shown = self.done
        self._stream.flush()
