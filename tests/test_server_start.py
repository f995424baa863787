"""A server that cannot start says why: the engine's own error, not only the API
server's "Engine core initialization failed"."""

from __future__ import annotations

import platform
import re
from pathlib import Path

import pytest

from server_ext import LocalServer, ServerStartError, local_server
from server_ext.__main__ import main as serve_main
from server_ext._launcher import RESERVED_CPU_ENV, extension_env
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


def _omp_binding(log: Path) -> list[str]:
    """The CPU cores vLLM gave its compute threads and kept back, as it logs them."""
    return re.findall(r"(?:core ids|reserved_cpus)=\[[^\]]*\]", log.read_text(errors="replace"))


def test_the_extension_leaves_vllm_the_cpu_cores_plain_vllm_has(
    vllm_server: LocalServer, plain_vllm_server: LocalServer
) -> None:
    # vLLM keeps one more core back when any KV connector is configured; this
    # one runs no thread of its own, so its launches pin the reservation.
    assert _omp_binding(vllm_server.log_path) == _omp_binding(plain_vllm_server.log_path) != []


def test_the_reservation_follows_the_ranks_and_yields_to_the_operator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(RESERVED_CPU_ENV, raising=False)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert extension_env([]) == {RESERVED_CPU_ENV: "1"}
    assert extension_env(["--tensor-parallel-size", "2", "-pp", "2"]) == {RESERVED_CPU_ENV: "4"}
    assert extension_env(["--tensor-parallel-size=2"]) == {RESERVED_CPU_ENV: "2"}
    monkeypatch.setattr(platform, "machine", lambda: "ppc64le")
    assert extension_env(["-tp", "4"]) == {RESERVED_CPU_ENV: "1"}
    monkeypatch.setenv(RESERVED_CPU_ENV, "3")
    assert extension_env(["-tp", "4"]) == {}


def test_serve_execs_vllm_with_the_reservation(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(RESERVED_CPU_ENV, raising=False)
    assert serve_main(["serve", "m", "--print-command"]) == 0
    assert capsys.readouterr().out.startswith(f"{RESERVED_CPU_ENV}=")


def test_a_plain_vllm_launch_finds_the_connector_by_name(
    test_model_dir: Path, tmp_path: Path
) -> None:
    """vLLM's own launch, no module path: the package's ``vllm.general_plugins``
    entry point registers the connector, so vLLM finds it by name (and the
    extension's metrics appear on vLLM's ``/metrics``)."""
    transfer = '{"kv_connector": "AgentHintsConnector", "kv_role": "kv_both"}'
    with local_server(
        test_model_dir,
        extension=False,
        kv_blocks=64,
        max_model_len=2048,
        args=["--kv-transfer-config", transfer],
        env=extension_env(),
        log_dir=tmp_path,
        startup_timeout=600,
    ) as server:
        status, _ = server.post_json(
            "/v1/completions", {"model": server.model, "prompt": [5] * 200, "max_tokens": 2}
        )
        assert status == 200
        assert any(name.startswith("agent_hints_") for name in server.metrics())
