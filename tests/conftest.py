"""Shared fixtures: the generated test model and real vLLM CPU servers on 127.0.0.1.

Servers are expensive here (~30 s to start on 2 cores), so the extension server and
a plain vLLM server are shared by the whole session; tests that need another
configuration start their own with ``server_ext.local_server`` and stop it in the
same fixture.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from server_ext import LocalServer, local_server, make_test_model

REPO = Path(__file__).resolve().parent.parent
TRACES = Path(os.environ.get("AGENT_HINTS_TRACES", REPO.parent / "shared" / "traces"))


@pytest.fixture(scope="session")
def test_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_test_model(tmp_path_factory.mktemp("tiny-model"))


def extension_server(model_dir: Path, log_dir: Path) -> AbstractContextManager[LocalServer]:
    """vLLM with the extension: 128 blocks of 64 tokens, hermes tool parser."""
    return local_server(model_dir, kv_blocks=128, max_model_len=4096, log_dir=log_dir)


@pytest.fixture(scope="session")
def vllm_server(
    test_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalServer]:
    with extension_server(test_model_dir, tmp_path_factory.mktemp("vllm-logs")) as server:
        yield server


@pytest.fixture(scope="module")
def second_vllm_server(
    test_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalServer]:
    """Another instance like ``vllm_server``, for a module that scales out."""
    with extension_server(test_model_dir, tmp_path_factory.mktemp("second-logs")) as server:
        yield server


@pytest.fixture(scope="session")
def plain_vllm_server(
    test_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalServer]:
    """vLLM as shipped, no extension: 48 blocks of 64 tokens (a small flood evicts)."""
    with local_server(
        test_model_dir,
        extension=False,
        kv_blocks=48,
        max_model_len=2048,
        log_dir=tmp_path_factory.mktemp("plain-logs"),
    ) as server:
        yield server


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"agent traces not found at {TRACES} (set AGENT_HINTS_TRACES)")
    return TRACES


@pytest.fixture(autouse=True)
def _finalize_leaked_clients() -> Iterator[None]:
    """Collect garbage after each test, outside any event loop.

    openai's async client closes its pool from ``__del__`` on whatever loop is
    running at that moment; a client a test forgot to close would otherwise be
    finalized inside a later test's loop and fail that test instead.
    """
    yield
    gc.collect()
