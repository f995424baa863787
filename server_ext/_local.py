"""A local vLLM server process for tests, benchmarks and the demo.

One place that knows how to start vLLM on this test bed (loopback only, bounded
startup, process group killed on exit), so fixtures, the benchmark and the demo
cannot drift apart.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from prometheus_client.parser import text_string_to_metric_families

from ._launcher import extension_env, offloading_transfer, vllm_command
from .tier import TIER_SECRET_ENV

__all__ = [
    "LocalServer",
    "ServerStartError",
    "free_port",
    "local_server",
    "stop_local_servers",
    "stop_process",
]


_TEST_BED_TIER_SECRET = secrets.token_hex(16)
"""The tier secret of every server this process starts (unless the
environment sets one): its engines can share a Mooncake store, nobody else."""


_running: set[subprocess.Popen[bytes]] = set()
"""The servers ``local_server`` started and has not stopped yet."""


def stop_local_servers() -> None:
    """Stop every server ``local_server`` started in this process and has not
    stopped yet: for a signal handler that cannot rely on unwinding (an
    exception raised in a handler that interrupts a ``__del__`` is dropped)."""
    for process in list(_running):
        stop_process(process)


def _escape(label_value: str) -> str:
    """A label value as the exposition format writes it (the parser unescapes it)."""
    return label_value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class ServerStartError(RuntimeError):
    """The server did not come up in time; the message ends with its log tail."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LocalServer:
    """A running server: where it listens and what it serves."""

    host: str
    port: int
    model: str
    log_path: Path

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return self.root_url + "/v1"

    def metrics(self) -> dict[str, float]:
        """``/metrics`` samples summed over labels, by series name, and each
        labelled sample under its full name (``name{label="value"}``)."""
        with urllib.request.urlopen(self.root_url + "/metrics", timeout=10) as response:
            text = response.read().decode()
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
                if sample.labels:
                    labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sample.labels.items())
                    totals[f"{sample.name}{{{labels}}}"] = sample.value
        return totals

    def post_json(
        self, path: str, payload: object, headers: Mapping[str, str] | None = None
    ) -> tuple[int, object]:
        """POST JSON to ``path`` (relative to the root URL); (status, parsed body)."""
        request = urllib.request.Request(
            self.root_url + path,
            data=json.dumps(payload).encode(),
            headers={"content-type": "application/json", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")


@contextmanager
def local_server(
    model_dir: str | Path,
    *,
    extension: bool = True,
    kv_blocks: int = 256,
    block_size: int = 64,
    max_model_len: int = 8192,
    extra_config: Mapping[str, object] | None = None,
    args: Sequence[str] = (),
    served_model_name: str = "tiny",
    startup_timeout: float = 600.0,
    log_dir: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    offload_bytes: int | None = None,
) -> Iterator[LocalServer]:
    """Start vLLM (CPU build, dummy weights) on 127.0.0.1 and stop it on exit.

    ``offload_bytes`` (without the extension): vLLM's own KV offloading with
    that much host memory and vLLM's LRU, reading no hint (the hint-free
    baseline: ``server_ext.offloading_transfer``).
    """
    if offload_bytes is not None and extension:
        raise ValueError("offload_bytes is the hint-free baseline: the extension sets its own tier")
    port = free_port()
    vllm_args = [
        "--served-model-name", served_model_name,
        "--load-format", "dummy",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--enforce-eager",
        "--block-size", str(block_size),
        "--num-gpu-blocks-override", str(kv_blocks),
        "--max-model-len", str(max_model_len),
        "--enable-prompt-tokens-details",
        "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes",
        "--gpu-memory-utilization", "0.3",
        "--disable-uvicorn-access-log",
        *args,
    ]  # fmt: skip
    if offload_bytes is not None:
        transfer = offloading_transfer(offload_bytes, hints=False)
        vllm_args += ["--kv-transfer-config", json.dumps(transfer)]
    command = vllm_command(
        str(model_dir), vllm_args, extension=extension, extra_config=extra_config,
        python=sys.executable,
    )  # fmt: skip
    log_path = Path(log_dir or tempfile.gettempdir()) / f"vllm-{port}.log"
    log: IO[bytes] = log_path.open("wb")
    process = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={
            TIER_SECRET_ENV: _TEST_BED_TIER_SECRET,
            # vLLM's CPU build reserves cores by whether a connector is configured.
            **(extension_env(vllm_args) if extension or offload_bytes is not None else {}),
            **os.environ,
            **(env or {}),
        },
        start_new_session=True,
    )
    _running.add(process)
    server = LocalServer("127.0.0.1", port, served_model_name, log_path)
    try:
        _wait_ready(server, process, startup_timeout)
        yield server
    finally:
        stop_process(process)
        _running.discard(process)
        log.close()


def _wait_ready(server: LocalServer, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            with urllib.request.urlopen(server.base_url + "/models", timeout=2):
                return
        except urllib.error.HTTPError as e:
            if e.code == 401:  # up, behind --api-key
                return
            time.sleep(1.0)
        except OSError:
            time.sleep(1.0)
    text = server.log_path.read_text(errors="replace")
    why = _root_cause(text)
    reason = f"{why}\n" if why else ""
    raise ServerStartError(
        f"vLLM did not start on {server.root_url}: {reason}(log: {server.log_path})\n{text[-3000:]}"
    )


_ERROR_LINE = re.compile(
    r"^(?:\(\w+ pid=\d+\) )?(?:ERROR .*?\] )?(\w+(?:Error|Exception): .+)$", re.M
)


def _root_cause(log: str) -> str | None:
    """The first exception line of a failed start (vLLM's engine process logs
    the real cause; the API server's traceback at the end only says that it
    failed)."""
    match = _ERROR_LINE.search(log)
    return match.group(1) if match else None


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Stop ``process`` and its process group (started with ``start_new_session``):
    SIGTERM, then SIGKILL after 30 s."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
