"""``scripts/gpu_check.py --dry-run``: the GPU check's own code, on CPU tensors.

The check is meant for a machine with a GPU and PyTorch but no vLLM, so it is
also run here in a Python where ``import vllm`` fails.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from server_ext.tier import BlockCodec

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"
DIRECTIONS = {
    "BlockCodec.pack": "D2H",
    "BlockCodec.unpack": "H2D",
    "TierWorker.save": "D2H",
    "TierWorker.load": "H2D",
}


@pytest.fixture(scope="module")
def gpu_check() -> Iterator[ModuleType]:
    """The script as a module (registered while it loads: its dataclasses look
    their module up)."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_the_dry_run_round_trips_every_path_exactly(gpu_check: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--dry-run", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["ok"] is True and report["dry_run"] is True and report["device"] == "cpu"
    shape = report["shape"]
    assert report["block_bytes"] == (
        2 * shape["layers"] * shape["block_size"] * shape["kv_heads"] * shape["head_size"] * 2
    )
    paths = {(p["path"], p["direction"]): p for p in report["paths"]}
    assert set(paths) == {("copy_", "D2H"), ("copy_", "H2D"), *DIRECTIONS.items()}
    for path in report["paths"]:
        assert path["bytes"] == shape["batch"] * report["block_bytes"]
        assert path["seconds"] > 0 and path["gb_per_s"] > 0
        assert path["waiting"] is None  # nothing runs asynchronously on the CPU
        if path["path"] in DIRECTIONS:
            assert path["exact"] is True
    # pack returns host bytes, the worker times its batches alone; unpack need not wait
    needs = {p["path"]: p["needs_wait"] for p in report["paths"] if p["path"] in DIRECTIONS}
    assert needs == dict(zip(DIRECTIONS, [True, False, True, True], strict=True))


def test_bytes_that_do_not_come_back_fail_the_check(
    gpu_check: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unpack = BlockCodec.unpack

    def flipped(self: BlockCodec, value: torch.Tensor, block_id: int) -> None:
        value = value.clone()
        value[0] ^= 1
        unpack(self, value, block_id)

    monkeypatch.setattr(BlockCodec, "unpack", flipped)
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--dry-run", "--out", str(out)]) == 1
    report = json.loads(out.read_text())
    exact = {p["path"]: p["exact"] for p in report["paths"]}
    assert report["ok"] is False
    assert exact["BlockCodec.pack"] is True and exact["TierWorker.save"] is True
    assert exact["BlockCodec.unpack"] is False and exact["TierWorker.load"] is False


def test_it_runs_where_vllm_is_not_installed(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    blocked = (
        "import runpy, sys; sys.modules['vllm'] = None; "  # `import vllm` raises ImportError
        f"sys.argv = ['gpu_check.py', '--dry-run', '--out', {str(out)!r}]; "
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    )
    run = subprocess.run(
        [sys.executable, "-c", blocked], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "all bytes exact" in run.stdout
    assert json.loads(out.read_text())["imports_vllm"] is False
