"""MooncakeTier against a real ``mooncake_master`` on 127.0.0.1 (no vLLM)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import torch

from server_ext.tier import (
    GuardedTier,
    KVTier,
    MooncakeTier,
    MooncakeUnavailable,
    local_mooncake_master,
)

pytestmark = pytest.mark.mooncake


@pytest.fixture
def master() -> Iterator[str]:
    try:
        with local_mooncake_master() as running:
            yield running.address
    except MooncakeUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture
def connect() -> Iterator[Callable[[str], MooncakeTier]]:
    """Clients for the test, closed after it (a native client left open at
    interpreter exit aborts the process)."""
    clients: list[MooncakeTier] = []

    def make(address: str) -> MooncakeTier:
        clients.append(MooncakeTier(address, segment_bytes=32 << 20, buffer_bytes=16 << 20))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def test_put_get_contains_and_soft_pin(master: str, connect: Callable[[str], MooncakeTier]) -> None:
    tier = connect(master)
    value = torch.arange(4096, dtype=torch.int32).view(torch.uint8)
    assert tier.put("a", value)
    assert tier.put("b", value[:100], pin_s=30)  # a soft pin from a hint's ttl
    assert tier.contains(["a", "b", "c", "a"]) == 2
    got = tier.get("a")
    assert got is not None and torch.equal(got, value)
    assert tier.get("missing") is None
    assert tier.stats.hits == 1 and tier.stats.misses == 1


def test_checksum_mismatch_is_a_miss(master: str, connect: Callable[[str], MooncakeTier]) -> None:
    tier = connect(master)
    tier.put("k", torch.zeros(64, dtype=torch.uint8))
    store = connect(master)._store  # a second client writes a forged value
    assert store.put("forged", b"\x01" * 64 + b"\x00\x00\x00\x00") == 0
    assert tier.get("forged") is None
    assert tier.stats.corrupt == 1
    assert tier.get("k") is not None


def test_dead_master_is_a_bounded_miss(connect: Callable[[str], MooncakeTier]) -> None:
    try:
        with local_mooncake_master() as running:
            address = running.address
            tier: KVTier = GuardedTier(lambda: connect(address), timeout_s=0.5, cooldown_s=30)
            assert tier.put("k", torch.ones(8, dtype=torch.uint8))
    except MooncakeUnavailable as e:
        pytest.skip(str(e))
    # The master is gone: every call returns within the timeout, as a miss.
    start = time.monotonic()
    assert tier.get("k") is None
    assert tier.contains(["k"]) == 0
    assert not tier.put("k2", torch.ones(8, dtype=torch.uint8))
    assert time.monotonic() - start < 2.0
    assert tier.stats.errors >= 1


def test_unreachable_master_at_startup_is_a_miss(
    connect: Callable[[str], MooncakeTier],
) -> None:
    tier = GuardedTier(lambda: connect("127.0.0.1:9"), timeout_s=0.5, cooldown_s=30)
    start = time.monotonic()
    assert tier.get("k") is None
    assert not tier.put("k", torch.ones(8, dtype=torch.uint8))
    assert time.monotonic() - start < 2.0


def test_a_master_that_cannot_start_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in binary that rejects the master's flags and exits at once.
    monkeypatch.setattr("server_ext.tier._master._binary", lambda: "/bin/sh")
    with (
        pytest.raises(MooncakeUnavailable, match=r"exited with 2[^\n]*\n.*Illegal option"),
        local_mooncake_master(startup_timeout=10),
    ):
        pytest.fail("the stand-in started")
