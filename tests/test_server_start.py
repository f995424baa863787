"""A server that cannot start says why: the engine's own error, not only the API
server's "Engine core initialization failed"."""

from __future__ import annotations

from pathlib import Path

import pytest

from server_ext import ServerStartError, local_server
from server_ext._local import _root_cause

pytestmark = pytest.mark.server


def test_a_failed_start_names_the_engines_error(test_model_dir: Path, tmp_path: Path) -> None:
    # 8 blocks of 64 tokens cannot hold one 2048-token request: vLLM refuses to start.
    with (
        pytest.raises(ServerStartError) as failed,
        local_server(
            test_model_dir, kv_blocks=8, max_model_len=2048, log_dir=tmp_path, startup_timeout=240
        ),
    ):
        pytest.fail("vLLM started with less KV cache than one request needs")
    first_line = str(failed.value).splitlines()[0]
    assert "ValueError: To serve at least one request with the model's max seq len" in first_line
    assert str(tmp_path) in str(failed.value)  # where the whole log is


def test_root_cause_is_the_first_exception_line() -> None:
    log = (
        "(APIServer pid=1) INFO starting\n"
        "(EngineCore pid=2) ERROR 12-01 09:20:34 [core.py:1510] ValueError: no room\n"
        "RuntimeError: Engine core initialization failed.\n"
    )
    assert _root_cause(log) == "ValueError: no room"
    assert _root_cause("INFO all fine\n") is None
