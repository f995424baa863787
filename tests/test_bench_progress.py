"""Progress of a long replay: short logs off a terminal, one redrawn line on it."""

from __future__ import annotations

import io

from benchmarks._progress import Progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_log_gets_a_line_per_tenth_and_the_final_count() -> None:
    out = io.StringIO()
    clock = _Clock()
    with Progress("plain", 325, stream=out, clock=clock) as progress:
        for i in range(325):
            clock.now += 0.4
            progress.advance(failed=i % 100 == 0)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert 10 <= len(lines) <= 11
    assert lines[0].startswith("[plain] [")
    assert "~" in lines[0] and "left" in lines[0]
    assert "325/325 requests  4 failed  2m10s elapsed" in lines[-1]
    assert "left" not in lines[-1]


def test_a_log_shows_where_an_aborted_run_stopped() -> None:
    out = io.StringIO()
    with Progress("host", 100, stream=out, clock=_Clock()) as progress:
        for _ in range(15):
            progress.advance()
    assert [line.split("]")[-1].split()[0] for line in out.getvalue().splitlines()] == [
        "10/100",
        "15/100",
    ]


def test_a_terminal_line_is_redrawn_and_throttled() -> None:
    out = _Tty()
    clock = _Clock()
    progress = Progress("retention", 10, stream=out, min_interval_s=1.0, clock=clock)
    assert out.getvalue().count("\r") == 1  # the empty bar at once
    for _ in range(4):
        clock.now += 0.3
        progress.advance()  # 0.3 s .. 1.2 s after the first draw: one redraw, at 1.2
    assert out.getvalue().count("\r") == 2
    assert "4/10 requests" in out.getvalue().rsplit("\r", 1)[1]
    for _ in range(6):
        progress.advance(failed=True)  # no time passes, but the final count is drawn
    progress.close()
    progress.close()
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and text.count("\n") == 1
    last = text.rsplit("\r", 1)[1]
    assert last.startswith("[retention] [" + "#" * 20 + "] 10/10 requests  6 failed  1s elapsed")


def test_a_shorter_redraw_blanks_the_longer_line() -> None:
    out = _Tty()
    clock = _Clock()
    with Progress("x", 2, stream=out, min_interval_s=0.0, clock=clock) as progress:
        clock.now += 3700.0
        progress.advance(failed=True)
        first = out.getvalue().rsplit("\r", 1)[1]
        progress.advance()
    last = out.getvalue().rsplit("\r", 1)[1].rstrip("\n")
    assert first.endswith("1/2 requests  1 failed  1h01m elapsed  ~1h01m left")
    assert last.endswith("2/2 requests  1 failed  1h01m elapsed" + " " * len("  ~1h01m left"))
