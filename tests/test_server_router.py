"""Scale-out behind an existing router: vllm-router (``consistent_hash``) in front of
two real vLLM CPU servers with the extension.

The router hashes ``X-Session-ID`` first and otherwise the whole body, which grows
every turn; the SDK sends the session there, so all of a session's turns reach the
instance that holds its KV and its retention.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest
from openai.types.chat import ChatCompletionMessageParam

from agentsdk import ControlChannel, HintedAsyncOpenAI, hint_scope
from hints_spec import End
from server_ext import LocalServer
from server_ext._local import free_port, stop_process

from sdk_calls import INSTRUCTIONS

pytestmark = [pytest.mark.server, pytest.mark.anyio]

ROUTER = Path(sys.executable).with_name("vllm-router")


@contextmanager
def vllm_router(workers: list[LocalServer], timeout: float = 60.0) -> Iterator[str]:
    """Run vllm-router on 127.0.0.1 in front of ``workers``; yield its ``/v1`` URL."""
    if not ROUTER.exists():
        pytest.fail(f"{ROUTER} not found: `make bootstrap` installs vllm-router (dev extra)")
    port = free_port()
    command = [
        str(ROUTER), "--host", "127.0.0.1", "--port", str(port), "--policy", "consistent_hash",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        "--worker-urls", *(w.root_url for w in workers),
    ]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            wait_healthy(process, f"http://127.0.0.1:{port}", time.monotonic() + timeout, log)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            stop_process(process)


def wait_healthy(
    process: subprocess.Popen[bytes], url: str, deadline: float, log: IO[bytes]
) -> None:
    """Return once ``url``/health answers; fail with the router's output if it exits
    or ``deadline`` passes."""
    while process.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    log.seek(0)
    pytest.fail(f"vllm-router did not start: {log.read()[-2000:]!r}")


@pytest.fixture(scope="module")
def router(vllm_server: LocalServer, second_vllm_server: LocalServer) -> Iterator[str]:
    with vllm_router([vllm_server, second_vllm_server]) as url:
        yield url


def counts(server: LocalServer) -> tuple[float, float]:
    """Hinted inference requests and control events the instance has served."""
    metrics = server.metrics()
    return (
        metrics.get("agent_hints_requests_total", 0.0),
        metrics.get("agent_hints_control_events_total", 0.0),
    )


async def converse(client: HintedAsyncOpenAI, model: str, sid: str, turns: int) -> list[int]:
    """A session of ``turns`` growing chat turns; each turn's cached prompt tokens."""
    system = f"Session {sid}. {INSTRUCTIONS}"  # no prefix shared with other sessions
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": system}]
    cached = []
    with hint_scope(session=sid, gap=5.0):
        for turn in range(turns):
            messages.append({"role": "user", "content": f"Step {turn}: go on."})
            reply = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=8
            )
            assert reply.usage is not None
            details = reply.usage.prompt_tokens_details
            cached.append(details.cached_tokens or 0 if details is not None else 0)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    return cached


async def test_a_sessions_turns_and_control_events_reach_one_instance(
    router: str, vllm_server: LocalServer, second_vllm_server: LocalServer
) -> None:
    """Each session's turns, and then its ``end``, all reach the instance holding its
    KV: turns after the first hit its prefix cache, and the other instance sees none
    of it. (Without ``X-Session-ID`` the router hashes each body, which differs per
    turn and per event, so three sessions of three turns would all stay together
    with probability 1/64.)"""
    servers = (vllm_server, second_vllm_server)
    async with HintedAsyncOpenAI(base_url=router, api_key="unused", max_retries=0) as client:
        for sid in ("routed-1", "routed-2", "routed-3"):
            before = [counts(s) for s in servers]
            cached = await converse(client, vllm_server.model, sid, turns=3)
            assert await ControlChannel(client).send(sid, [End()]) is not None
            seen = sorted(
                (a[0] - b[0], a[1] - b[1])
                for a, b in zip([counts(s) for s in servers], before, strict=True)
            )
            assert seen == [(0, 0), (3, 1)], (sid, seen)
            assert cached[0] == 0 and all(c > 0 for c in cached[1:]), (sid, cached)
