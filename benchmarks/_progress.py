"""Progress of a long replay, so a run of many minutes is not silent.

tqdm draws it. A terminal gets its bar redrawn in place (at most every
``min_interval_s``); a log (CI, a file) gets the same line written plainly once per
10% of the requests, so it stays short.
"""

from __future__ import annotations

import math
import sys
import time
from types import TracebackType
from typing import TextIO

from tqdm import tqdm

__all__ = ["Progress"]


class Progress:
    """Counts finished requests of one configuration; ``stream`` defaults to
    ``sys.stderr`` (looked up when constructed, so captured streams work)."""

    def __init__(
        self, label: str, total: int, stream: TextIO | None = None, min_interval_s: float = 0.5
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.failed = 0
        self._stream = sys.stderr if stream is None else stream
        self._started = time.monotonic()
        self._step = max(1, math.ceil(total / 10))
        self._shown = 0  # ``done`` at the last log line
        self._closed = False
        # Off a terminal the bar is only a formatter: tqdm itself would write '\r' redraws.
        self._bar: tqdm | None = (
            tqdm(
                total=total,
                desc=label,
                unit="req",
                file=self._stream,
                mininterval=min_interval_s,
                miniters=1,
                dynamic_ncols=True,
            )
            if self._stream.isatty()
            else None
        )

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
        if self._bar is not None:
            if failed:
                self._bar.set_postfix_str(self._postfix(), refresh=False)
            self._bar.update(1)
        elif self.done >= min(self._shown + self._step, self.total):
            self._log()

    def close(self) -> None:
        """Show the last count if it is not shown yet, and end a terminal's line."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif self.done != self._shown:
            self._log()

    def _postfix(self) -> str:
        return f"{self.failed} failed" if self.failed else ""

    def _log(self) -> None:
        line = tqdm.format_meter(
            self.done,
            self.total,
            time.monotonic() - self._started,
            prefix=self.label,
            unit="req",
            postfix=self._postfix() or None,
            ascii=True,  # logs are read anywhere, in any encoding
        )
        self._stream.write(line + "\n")
        self._stream.flush()
        self._shown = self.done
