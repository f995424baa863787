"""``make demo`` on a clone with nothing beside it: the repository's files copied where
no ``../shared`` is, no trace variable set, run there with the venv's python."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from examples import demo

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files git has (tracked, and new ones not ignored) in an empty directory."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.decode()
    root = tmp_path_factory.mktemp("alone") / "agent-hints"
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a deleted file is still listed until its removal is committed
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    assert not (root.parent / "shared").exists()
    return root


def _python(clone: Path, *argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """The venv's python in ``clone``, with no ``AGENT_HINTS_*`` variable."""
    return subprocess.run(
        [sys.executable, *argv],
        cwd=clone,
        env={k: v for k, v in os.environ.items() if not k.startswith("AGENT_HINTS_")},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_workload_of_a_clone_alone_is_the_generated_one(clone: Path) -> None:
    code = (
        "import benchmarks, examples.demo as d; s, ss = d.workload(d.arguments([]));"
        "print(benchmarks.__file__); print(s.kind, s.path); print(len(ss), ss[0].session_id)"
    )
    done = _python(clone, "-c", code, timeout=120)
    assert done.returncode == 0, done.stderr
    module, source, sessions = done.stdout.splitlines()
    assert Path(module).is_relative_to(clone)  # the copy's code, not the checkout's
    assert source == f"generated {clone / 'benchmarks' / 'workload_figures.json'}"
    assert sessions == "24 generated-000"


def test_the_demo_runs_plain_hint_free_and_hinted_at_the_extensions_tier_bytes() -> None:
    args = demo.arguments([])
    assert args.configs == "plain,hint-free,hinted"
    assert args.tier_bytes is None  # agent_replay resolves it: the extension's own, for both
    assert demo.arguments(["--tier-bytes", "1000"]).tier_bytes == 1000


@pytest.mark.server
def test_a_two_session_demo_runs_on_a_clone_alone(clone: Path) -> None:
    args = "--sessions 2 --time-scale 100 --max-think 2 --startup-timeout 240"
    done = _python(clone, "-m", "examples.demo", *args.split(), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "2 agent sessions (sessions generated from the figures in" in out
    assert "hinted / plain" in out and "the SDK's ETAs (hinted run)" in out
    assert "hinted / hint-free" in out and "hint-free / plain" in out and "+tier LRU" in out
    assert "of the recorded waits)" in out
    report = json.loads((clone / "results" / "demo.json").read_text())
    assert report["source"]["kind"] == "generated"
    assert [s["id"] for s in report["sessions"]] == ["generated-000", "generated-001"]
    assert list(report["summary"]) == ["plain", "hint-free", "hinted"]
    # hint-free's offloading and the extension's tier: the same bytes, the extension's own.
    assert report["tier_bytes"] == 1 << 30
    for summary in report["summary"].values():
        assert summary["failed"] == 0 and summary["requests"] > 0
        assert summary["ttft_p50_s"] is not None and summary["reuse_of_theoretical"] > 0
        ceiling = summary["ceiling"]
        for level in ("device", "tiered"):
            assert 0 <= ceiling[level]["lru"] <= 1 and 0 < ceiling[level]["belady"] <= 1
    assert report["summary"]["hinted"]["agent_hints"]["control_events"] > 0
    for plot in ("ttft-cdf", "reuse-over-time", "calibration"):
        assert (clone / "results" / f"demo-{plot}.png").stat().st_size > 0
    assert "wrote results/demo.json" in out
