"""``python -m benchmarks.replay`` end to end: real servers, a real trace, the table,
the JSON and the plots (a short slice: 4 requests of one trace, plain and retention);
and a run killed by SIGTERM stops the server it started."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import misses
from benchmarks.replay import main

pytestmark = pytest.mark.server


def test_replay_prints_one_table_and_writes_the_json_and_plots(
    traces_dir: Path, test_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.json"
    argv = [
        "--traces", str(traces_dir), "--trace-ids", "trace_0100",
        "--max-requests-per-trace", "4", "--time-scale", "100", "--kv-blocks", "80",
        "--max-model-len", "4096", "--configs", "plain,retention",
        "--model", str(test_model_dir), "--out", str(out), "--startup-timeout", "240",
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rows = [
        w[0]
        for w in map(str.split, printed.splitlines())
        if w[:2] in (["plain", "4"], ["retention", "4"])
    ]
    # A running table after the first configuration, one final table after the last.
    assert rows == ["plain", "plain", "retention"]
    assert "retention / plain" in printed and f"wrote {out}" in printed
    run = json.loads(out.read_text())
    assert list(run["configs"]) == ["plain", "retention"]
    for config in run["configs"].values():
        summary = config["summary"]
        assert (summary["requests"], summary["failed"]) == (4, 0)
        assert [r["seq"] for r in config["records"]] == [0, 1, 2, 3]
        assert config["samples"], "gauges were sampled during the run"
    hinted = [r["hint"] for r in run["configs"]["retention"]["records"]]
    assert all(h and 'sid="trace_0100"' in h for h in hinted)
    assert all(r["hint"] is None for r in run["configs"]["plain"]["records"])
    assert (tmp_path / "run-ttft-cdf.png").stat().st_size > 0
    assert (tmp_path / "run-reuse-over-time.png").stat().st_size > 0
    # The saved run feeds the analyses.
    assert misses.main([str(out), "--traces", str(traces_dir), "--bound", "plain"]) == 0
    assert "TTFT by kind" in capsys.readouterr().out


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _processes_with(argument: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if argument.encode() in cmdline.read_bytes().split(b"\0"):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue  # it exited while we looked
    return found


def test_a_run_killed_by_sigterm_stops_its_server(
    traces_dir: Path, test_model_dir: Path, tmp_path: Path
) -> None:
    """The server runs in its own process group; without the run's SIGTERM
    handling it would outlive the run (3.5 GB and a port)."""
    argv = [
        sys.executable, "-m", "benchmarks.replay",
        "--traces", str(traces_dir), "--trace-ids", "trace_0100",
        "--max-requests-per-trace", "40", "--time-scale", "1", "--kv-blocks", "80",
        "--max-model-len", "4096", "--configs", "plain",
        "--model", str(test_model_dir), "--out", str(tmp_path / "run.json"),
        "--startup-timeout", "240",
    ]  # fmt: skip
    run = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        port = None
        while port is None or not _listening(port):
            assert run.poll() is None and time.monotonic() < deadline, "the server never came up"
            logs = list(tmp_path.glob("vllm-*.log"))
            port = int(logs[0].stem.removeprefix("vllm-")) if logs else None
            time.sleep(0.5)
        assert _processes_with(str(port)), "the server's command line names its port"
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=90) == 128 + signal.SIGTERM
    finally:
        if run.poll() is None:
            run.kill()
    assert not _listening(port)
    assert _processes_with(str(port)) == []


_SWALLOWED_SIGTERM = """
import os, signal, subprocess, sys, time
import benchmarks._server as server
from server_ext import _local

server._SIGTERM_GRACE_S = 1.0
child = subprocess.Popen(["sleep", "600"], start_new_session=True)
_local._running.add(child)  # as local_server registers the servers it starts
print(child.pid, flush=True)


class Interrupted:
    def __del__(self):  # the handler's SystemExit is raised here, and dropped
        os.kill(os.getpid(), signal.SIGTERM)


with server.sigterm_as_exit():
    Interrupted()
    while True:  # what would go on for ever
        time.sleep(0.05)
"""


def test_a_sigterm_whose_exit_python_drops_still_stops_the_servers_and_the_run() -> None:
    run = subprocess.Popen(
        [sys.executable, "-c", _SWALLOWED_SIGTERM],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert run.stdout is not None
    child = int(run.stdout.readline())
    try:
        assert run.wait(timeout=30) == 128 + signal.SIGTERM
        _, stderr = run.communicate()
        assert "Exception ignored" in stderr  # the SystemExit was dropped, as Python does
        deadline = time.monotonic() + 10
        while _alive(child):
            assert time.monotonic() < deadline, "the registered server outlived the run"
            time.sleep(0.1)
    finally:
        if run.poll() is None:
            run.kill()
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False
