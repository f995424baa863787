"""``HostOffloadingConnector``: vLLM's ``OffloadingConnector`` whose host-copied
loads complete within their engine step.

The connector's three differences from vLLM's, each against the piece of vLLM
it hands to (a recording stand-in for vLLM's scheduler side here; the real
server test in ``test_tier_server.py`` checks that the loaded KV is the
stored KV, byte for byte in greedy output, and that the load moved every
block):
- a tier hit is declared synchronous and stops short of the last token;
- vLLM's scheduler side is shown the load's blocks unhashed, so that it loads
  from the first block past the device's own prefix;
- a finished load is never reported as a finished receive (vLLM's scheduler
  expects one only for a request that waited for it).
On a GPU, and with any spec other than ``HostOffloadingSpec``, it is vLLM's
connector unchanged.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock

from server_ext.offload import HostOffloadingConnector, HostOffloadingSpec
from server_ext.offload import _connector as connector_module


class RecordingScheduler:
    """What ``OffloadingConnector`` hands its scheduler-side calls to."""

    def __init__(self, hit: int) -> None:
        self.hit = hit
        self.lookups: list[tuple[int, int | None]] = []
        self.allocations: list[KVCacheBlocks] = []
        # vLLM's bookkeeping that a step's loads are kept out of
        self._req_status: dict[str, Any] = {}
        self._current_batch_load_jobs: dict[int, Any] = {}
        self.pending_while_building: list[set[int]] = []

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int, max_num_new_tokens: int | None = None
    ) -> tuple[int | None, bool]:
        self.lookups.append((num_computed_tokens, max_num_new_tokens))
        hit = self.hit if max_num_new_tokens is None else min(self.hit, max_num_new_tokens)
        return hit, bool(hit)

    def update_state_after_alloc(
        self, request: Any, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self.allocations.append(blocks)

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        self.pending_while_building.append(set(self._req_status["r"].transfer_jobs))
        self._current_batch_load_jobs = {}
        return "meta"


class RecordingWorker:
    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        return {"sent"}, {"loaded"}


def _connector(in_step: bool, hit: int = 0) -> tuple[HostOffloadingConnector, RecordingScheduler]:
    connector = HostOffloadingConnector.__new__(HostOffloadingConnector)
    scheduler = RecordingScheduler(hit)
    connector.connector_scheduler = scheduler  # type: ignore[assignment]
    connector.connector_worker = RecordingWorker()  # type: ignore[assignment]
    connector._connector_metadata = OffloadingConnectorMetadata({}, {})
    connector.__dict__["_bounding_group_ids"] = ()  # no group outside the offloading
    connector._loads_in_step = in_step
    connector._evictions = None
    return connector, scheduler


def _request(num_tokens: int) -> Any:
    return SimpleNamespace(request_id="r", num_tokens=num_tokens)


def test_a_host_hit_loads_in_step_and_leaves_the_last_token_to_compute() -> None:
    connector, scheduler = _connector(in_step=True, hit=1024)
    assert connector.get_num_new_matched_tokens(_request(1024), 0) == (1023, False)
    assert scheduler.lookups == [(0, 1023)]
    # Past the device's own prefix, the bound counts from there.
    assert connector.get_num_new_matched_tokens(_request(1024), 512) == (511, False)


def test_vllms_connector_on_a_gpu_loads_asynchronously() -> None:
    connector, scheduler = _connector(in_step=False, hit=1024)
    assert connector.get_num_new_matched_tokens(_request(1024), 0) == (1024, True)
    assert scheduler.lookups == [(0, None)]


def test_the_load_blocks_are_shown_unhashed_with_their_ids() -> None:
    connector, scheduler = _connector(in_step=True)
    hashed = KVCacheBlock(7)
    hashed._block_hash = b"h"  # type: ignore[assignment]
    null = KVCacheBlock(0, is_null=True)
    connector.update_state_after_alloc(
        _request(128), KVCacheBlocks(([null, hashed, KVCacheBlock(9)],)), 64
    )
    (shown,) = scheduler.allocations
    assert [(b.block_id, b.is_null, b.block_hash) for b in shown.blocks[0]] == [
        (0, True, None),
        (7, False, None),
        (9, False, None),
    ]
    assert hashed.block_hash == b"h"  # vLLM's own blocks are untouched


def test_without_a_load_the_blocks_pass_as_they_are() -> None:
    for in_step, external in ((True, 0), (False, 64)):
        connector, scheduler = _connector(in_step=in_step)
        blocks = KVCacheBlocks(([KVCacheBlock(3)],))
        connector.update_state_after_alloc(_request(64), blocks, external)
        assert scheduler.allocations == [blocks]


def test_an_in_step_load_is_not_a_finished_receive() -> None:
    connector, _ = _connector(in_step=True)
    assert connector.get_finished(set()) == ({"sent"}, set())
    connector, _ = _connector(in_step=False)
    assert connector.get_finished(set()) == ({"sent"}, {"loaded"})


OURS = {"spec_name": "HostOffloadingSpec", "spec_module_path": "server_ext.offload"}


def test_a_steps_stores_are_built_beside_its_loads() -> None:
    """vLLM issues a request's stores only while none of its loads is pending
    (an asynchronous load's request is not running yet); an in-step load is
    done before that step's stores are submitted, so it is kept out of the
    check, and back in the books for its completion."""
    connector, scheduler = _connector(in_step=True)
    scheduler._req_status["r"] = SimpleNamespace(transfer_jobs={3, 7})  # 7: a store
    scheduler._current_batch_load_jobs = {3: SimpleNamespace(req_id="r")}
    assert connector.build_connector_meta(SimpleNamespace()) == "meta"
    assert scheduler.pending_while_building == [{7}]
    assert scheduler._req_status["r"].transfer_jobs == {3, 7}
    # vLLM's connector as it is elsewhere
    connector, scheduler = _connector(in_step=False)
    scheduler._req_status["r"] = SimpleNamespace(transfer_jobs={3})
    scheduler._current_batch_load_jobs = {3: SimpleNamespace(req_id="r")}
    connector.build_connector_meta(SimpleNamespace())
    assert scheduler.pending_while_building == [{3}]


def test_a_vllm_without_the_touch_points_keeps_its_async_loads(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(connector_module, "_IN_STEP_TOUCH_POINTS", {"_renamed_in_a_later_vllm"})
    monkeypatch.setattr(HostOffloadingSpec, "copies_on_host", staticmethod(lambda: True))

    def vllms_init(self: OffloadingConnector, *args: object) -> None:
        self._kv_transfer_config = SimpleNamespace(kv_connector_extra_config=OURS)  # type: ignore[assignment]

    monkeypatch.setattr(OffloadingConnector, "__init__", vllms_init)
    connector = connector_module.HostOffloadingConnector(None, None, None)  # type: ignore[arg-type]
    assert connector._loads_in_step is False
    assert "stay asynchronous" in caplog.text


@pytest.mark.parametrize(
    ("extra", "host", "expected"),
    [
        ({"spec_name": "HostOffloadingSpec", "spec_module_path": "server_ext.offload"}, True, True),
        (
            {"spec_name": "HostOffloadingSpec", "spec_module_path": "server_ext.offload"},
            False,
            False,
        ),
        ({"spec_name": "CPUOffloadingSpec"}, True, False),
    ],
)
def test_loads_are_in_step_only_where_the_spec_copies_on_the_host(
    monkeypatch: pytest.MonkeyPatch, extra: dict[str, str], host: bool, expected: bool
) -> None:
    monkeypatch.setattr(HostOffloadingSpec, "copies_on_host", staticmethod(lambda: host))

    def vllms_init(self: OffloadingConnector, *args: object) -> None:
        self._kv_transfer_config = SimpleNamespace(kv_connector_extra_config=extra)  # type: ignore[assignment]

    monkeypatch.setattr(OffloadingConnector, "__init__", vllms_init)
    connector = connector_module.HostOffloadingConnector(None, None, None)  # type: ignore[arg-type]
    assert connector._loads_in_step is expected
