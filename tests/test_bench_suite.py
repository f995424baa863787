"""The workload suite: its families, the order of its runs, the neighbour it
starts, its verdict, and ``python -m benchmarks.suite`` end to end on real servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks._suite import (
    DEFAULT_CONFIGS,
    FAMILIES,
    HINT_FREE,
    NOISE_CONFIG,
    QUICK_FAMILIES,
    SUITE_CONFIGS,
    busy_neighbour,
    checks,
    rotated,
)
from benchmarks.suite import _passed, main


def test_every_family_named_by_the_issue_is_in_the_suite() -> None:
    assert set(QUICK_FAMILIES) <= set(FAMILIES)
    assert FAMILIES["matrix"].max_requests is None  # the development matrix, whole
    assert FAMILIES["dense"].max_think_s < FAMILIES["sparse"].max_think_s
    assert FAMILIES["crowded"].n_traces > FAMILIES["matrix"].n_traces
    assert {f.control for f in FAMILIES.values()} >= {"none", "tools"}
    assert FAMILIES["mixed"].unhinted_share == 0.5
    # The extension runs with no knobs, as the README recommends it.
    assert SUITE_CONFIGS["extension"].extension and not SUITE_CONFIGS["extension"].prefetch
    # Beside plain, vLLM's own offloading at the same bytes, which reads no hint.
    assert DEFAULT_CONFIGS == ("plain", "hint-free", "extension", "unlimited")
    hint_free = SUITE_CONFIGS[HINT_FREE]
    assert hint_free.name == "hint-free" and hint_free.hint_free and not hint_free.hints


def test_half_unhinted_is_every_other_session_by_id() -> None:
    mixed = FAMILIES["mixed"]
    assert mixed.unhinted(["t4", "t1", "t3", "t2"]) == {"t2", "t4"}
    assert FAMILIES["dense"].unhinted(["t1", "t2"]) == frozenset()


def test_each_repeat_rotates_which_configuration_runs_first() -> None:
    configs = list(SUITE_CONFIGS.values())
    firsts = [rotated(configs, r)[0].name for r in range(3)]
    assert firsts == ["plain", "hint-free", "extension"]
    assert all(
        sorted(c.name for c in rotated(configs, r)) == sorted(SUITE_CONFIGS) for r in range(4)
    )


def test_the_neighbour_burns_a_core_only_inside_its_block() -> None:
    start = time.process_time()
    with busy_neighbour(True, limit_s=30.0):
        time.sleep(1.0)
        children = os.times()
    after = os.times()
    # Our own CPU time barely moved; the machine's did (the child ran), and the
    # child was reaped on exit (its CPU time shows up in our children's total).
    assert time.process_time() - start < 0.5
    assert after.children_user + after.children_system >= 0.5
    assert children.children_user <= after.children_user
    with busy_neighbour(False, limit_s=30.0):
        pass


def test_the_neighbour_stops_when_the_suite_is_killed() -> None:
    code = (
        "import time\n"
        "from benchmarks._suite import busy_neighbour\n"
        "with busy_neighbour(True, limit_s=60.0):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
    )
    suite = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert suite.stdout is not None and suite.stdout.readline().strip() == "ready"
    children = Path(f"/proc/{suite.pid}/task/{suite.pid}/children").read_text().split()
    [neighbour] = [int(pid) for pid in children]
    suite.kill()
    suite.wait()
    deadline = time.monotonic() + 10.0
    while _running(neighbour) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(neighbour)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _summary(
    reuse: float, mean: float, p90: float, failed: int = 0, preempt: int = 0
) -> dict[str, Any]:
    return {"reuse_of_theoretical": reuse, "ttft_mean_s": mean, "ttft_p90_s": p90,
            "failed": failed, "preemptions": preempt, "real_preemptions": preempt}  # fmt: skip


def test_the_verdict_is_on_medians_of_each_repeats_ratio() -> None:
    plain = _summary(0.5, 1.0, 2.0)
    repeats = [
        {"plain": plain, "extension": _summary(0.6, 0.9, 1.8)},
        {"plain": plain, "extension": _summary(0.55, 1.2, 2.2)},  # one bad repeat
        {"plain": plain, "extension": _summary(0.5, 1.0, 2.1)},
    ]
    found = {c.what: c for c in checks("f", "quiet", repeats)}
    assert found["reuse / plain"].value == pytest.approx(1.1) and found["reuse / plain"].passed
    assert (
        found["TTFT mean / plain"].value == pytest.approx(1.0) and found["TTFT mean / plain"].passed
    )
    assert found["TTFT p90 / plain"].value == pytest.approx(1.05)
    assert found["failed requests"].passed
    worse = [{"plain": plain, "extension": _summary(0.45, 1.1, 2.0, failed=1, preempt=2)}]
    failed = {c.what: c.passed for c in checks("f", "noisy", worse)}
    assert failed == {
        "reuse / plain": False, "TTFT mean / plain": False, "TTFT p90 / plain": True,
        "failed requests": False, "real preemptions over plain's": False,
    }  # fmt: skip
    groups = [{"plain": plain, "extension": _summary(0.5, 1.2, 2.0)}]
    unhinted = checks("mixed", "quiet", repeats[:1], groups)[-1]
    assert unhinted.what.startswith("unhinted") and not unhinted.passed


def test_plain_run_twice_measures_the_noise_each_ratio_is_read_against() -> None:
    plain = _summary(0.5, 1.0, 2.0)
    repeats = [
        {"plain": plain, "extension": _summary(0.48, 1.0, 2.0), NOISE_CONFIG: again}
        for again in (_summary(0.45, 1.1, 2.0), _summary(0.52, 0.9, 2.0))
    ]
    found = {c.what: c for c in checks("f", "quiet", repeats)}
    reuse = found["reuse / plain"]
    assert not reuse.passed and reuse.within_noise  # 0.96: plain alone spans 0.90-1.04
    assert reuse.noise is not None and (reuse.noise.low, reuse.noise.high) == pytest.approx(
        (0.9, 1.04)
    )
    assert found["TTFT p90 / plain"].within_noise  # 1.0 in 1.0-1.0
    assert "failed requests" in found and found["failed requests"].noise is None
    outside = [{**r, "extension": _summary(0.4, 1.0, 2.0)} for r in repeats]
    assert not {c.what: c for c in checks("f", "quiet", outside)}["reuse / plain"].within_noise
    alone = [{"plain": plain, "extension": _summary(0.48, 1.0, 2.0)}]
    assert not {c.what: c for c in checks("f", "quiet", alone)}["reuse / plain"].within_noise


def test_the_extension_against_hint_free_is_shown_beside_plain_and_not_counted() -> None:
    plain = _summary(0.5, 1.0, 2.0)
    repeats = [
        {"plain": plain, HINT_FREE: _summary(0.8, 0.5, 1.0), "extension": _summary(0.6, 0.6, 1.2)},
        {"plain": plain, HINT_FREE: _summary(0.6, 0.5, 1.0), "extension": _summary(0.6, 0.4, 0.8)},
    ]
    found = checks("f", "quiet", repeats)
    assert [c.what for c in found][:6] == [
        "reuse / plain", "reuse / hint-free", "TTFT mean / plain", "TTFT mean / hint-free",
        "TTFT p90 / plain", "TTFT p90 / hint-free",
    ]  # fmt: skip
    by = {c.what: c for c in found}
    reuse = by["reuse / hint-free"]
    assert reuse.value == pytest.approx((0.75 + 1.0) / 2) and not reuse.passed
    assert not reuse.counts and by["reuse / plain"].counts and reuse.noise is None
    assert by["TTFT mean / hint-free"].value == pytest.approx(1.0)
    # Losing to hint-free is shown, and the verdict is still plain's.
    assert _passed(found) and not _passed([reuse]) and not _passed([])
    without = [c.what for c in checks("f", "quiet", [{"plain": plain, "extension": plain}])]
    assert not any("hint-free" in what for what in without)


@pytest.mark.server
def test_suite_runs_plain_hint_free_and_the_extension_beside_a_neighbour_and_resumes(
    traces_dir: Path, test_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "suite.json"
    argv = [
        "--traces", str(traces_dir), "--families", "mixed", "--conditions", "noisy",
        "--configs", "plain,hint-free,extension", "--repeats", "1", "--sessions", "2",
        "--max-requests", "3", "--model", str(test_model_dir), "--out", str(out),
    ]  # fmt: skip
    status = main(argv)
    printed = capsys.readouterr().out
    saved = json.loads(out.read_text())
    run = saved["runs"]["mixed"]["noisy"]["0"]
    assert set(run) == {"plain", "hint-free", "extension"}
    assert all(r["summary"]["failed"] == 0 and r["summary"]["requests"] > 0 for r in run.values())
    # Each run's ceiling in its own send order, at the device's KV and with the tier's
    # (the extension's default, 1 GiB: 8,192 blocks of the test model; hint-free's too).
    assert saved["tier_bytes"] == 1 << 30
    for name, r in run.items():
        ceiling = r["summary"]["ceiling"]
        assert ceiling["served"] == ("device" if name == "plain" else "tiered")
        assert ceiling["tiered"]["blocks"] == ceiling["device"]["blocks"] + 8192
        for level in ("device", "tiered"):
            assert all(0 <= ceiling[level][k] <= 1 for k in ("lru", "belady"))
    ratios = saved["spread"]["mixed"]["noisy"]["ratios"]
    assert {"extension / plain", "hint-free / plain", "extension / hint-free"} <= set(ratios)
    assert set(saved["spread"]["mixed"]["noisy"]["ceilings"]) == set(run)
    assert "extension / hint-free" in printed and "TTFT mean / hint-free" in printed
    assert "+tier LRU" in printed
    # One of the two sessions sent no hints: its numbers are kept apart.
    assert len(saved["workloads"]["mixed"]["unhinted"]) == 1
    assert all(r["unhinted"]["requests"] > 0 for r in run.values())
    assert saved["extension_config"] == {}
    assert "unhinted sessions' TTFT mean / plain" in printed and "verdict" in printed
    assert status == (0 if saved["passed"] else 1)
    assert (tmp_path / "suite-ratios.png").stat().st_size > 0
    # Resuming finds every run done and starts no server.
    started = time.monotonic()
    main([*argv, "--resume"])
    assert time.monotonic() - started < 20
    assert json.loads(out.read_text())["runs"] == saved["runs"]
