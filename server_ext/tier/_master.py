"""A local Mooncake master for tests, benchmarks and demos (loopback only)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["MooncakeMaster", "MooncakeUnavailable", "local_mooncake_master"]


class MooncakeUnavailable(RuntimeError):
    """Mooncake cannot run here; the message says why (for a test skip)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _binary() -> str:
    try:
        import mooncake.store  # noqa: F401
    except Exception as e:  # ImportError, or a missing libibverbs1 (OSError)
        raise MooncakeUnavailable(
            f"mooncake.store does not import ({e!r}); install the `mooncake` extra "
            "(mooncake-transfer-engine-non-cuda) and apt libibverbs1"
        ) from e
    beside = Path(sys.executable).with_name("mooncake_master")
    found = str(beside) if beside.exists() else shutil.which("mooncake_master")
    if found is None:
        raise MooncakeUnavailable("the mooncake_master binary is not installed")
    return found


@dataclass(frozen=True)
class MooncakeMaster:
    """A running master: ``address`` is the ``host:port`` clients connect to."""

    address: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        """Kill the master (tests use this to take the store away mid-run)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


@contextmanager
def local_mooncake_master(startup_timeout: float = 20.0) -> Iterator[MooncakeMaster]:
    """Run ``mooncake_master`` on 127.0.0.1 and always stop it on exit."""
    port, metrics = _free_port(), _free_port()
    argv = [
        _binary(),
        "--rpc_address=127.0.0.1", f"--rpc_port={port}",
        "--metrics_host=127.0.0.1", f"--metrics_port={metrics}",
    ]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        master = MooncakeMaster(f"127.0.0.1:{port}", process)
        try:
            _wait_listening(process, port, time.monotonic() + startup_timeout, log)
            yield master
        finally:
            master.stop()


def _wait_listening(
    process: subprocess.Popen[bytes], port: int, deadline: float, log: IO[bytes]
) -> None:
    """Return once the master accepts connections on ``port``; raise
    ``MooncakeUnavailable`` with its output if it exits or ``deadline`` passes."""
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
        log.seek(0)
        tail = log.read().decode(errors="replace")[-2000:]
        status = process.poll()
        how = "timed out" if status is None else f"exited with {status}"
        raise MooncakeUnavailable(f"mooncake_master did not start ({how}):\n{tail}")
