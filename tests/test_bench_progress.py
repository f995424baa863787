"""Progress of a long replay: short logs off a terminal, one redrawn line on it."""

from __future__ import annotations

import io
import time

from benchmarks._progress import Progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_tenth_and_the_final_count() -> None:
    out = io.StringIO()
    with Progress("plain", 325, stream=out) as progress:
        for i in range(325):
            progress.advance(failed=i % 100 == 0)
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text
    assert len(lines) == 10
    assert lines[0].startswith("plain:  10%|#") and "33/325" in lines[0]
    assert "1 failed" in lines[0]
    assert lines[-1].startswith("plain: 100%|##########| 325/325 [")
    assert lines[-1].endswith("4 failed]")
    assert text.isascii()


def test_a_log_shows_where_an_aborted_run_stopped() -> None:
    out = io.StringIO()
    with Progress("host", 100, stream=out) as progress:
        for _ in range(15):
            progress.advance()
    counts = [line.split("| ")[1].split()[0] for line in out.getvalue().splitlines()]
    assert counts == ["10/100", "15/100"]
    assert "failed" not in out.getvalue()


def test_a_terminal_line_is_redrawn_in_place_and_throttled() -> None:
    out = _Tty()
    progress = Progress("retention", 10, stream=out, min_interval_s=60.0)
    assert out.getvalue().count("\r") == 1  # the empty bar at once
    for _ in range(9):
        progress.advance()  # within the interval: no redraw
    assert out.getvalue().count("\r") == 1
    progress.advance(failed=True)
    progress.close()
    progress.close()
    text = out.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and text.count("\n") == 1
    last = text.rsplit("\r", 1)[1]
    assert last.startswith("retention: 100%") and "10/10" in last and "1 failed" in last


def test_a_terminal_redraws_once_the_interval_has_passed() -> None:
    out = _Tty()
    with Progress("x", 3, stream=out, min_interval_s=0.05) as progress:
        progress.advance()
        time.sleep(0.1)
        progress.advance()
        assert "2/3" in out.getvalue().rsplit("\r", 1)[1]
        progress.advance()
    assert out.getvalue().rstrip("\n").rsplit("\r", 1)[1].startswith("x: 100%")
