"""One engine instance: vLLM's scheduler loop on the simulated clock.

Each step: running requests first (a decode token each, a prefill its next
chunk), then waiting ones in arrival order while the step's token budget,
``max_seqs`` and free blocks last (vLLM stops admitting at the first request
that cannot get blocks). A waiting request's prefix comes from the device's
cache, then from the host tier, then from the shared pool; a load is
asynchronous, as vLLM's offloading does it: the request keeps its blocks and
waits outside the step until the copy lands, then competes again. The blocks
a request computed go to the tier (and the pool) once its prefill is done,
copied beside the compute. A step's time is the preset's ``StepCost``; while
only decodes run and nothing else happens, many steps are taken as one.

The extension's retention is ``server_ext._engine.EngineRetention`` over
this pool (``_cache.PoolPort``), driven as the connector drives it: a
request added, scheduled and finished, each step, each control message.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.v1.kv_offload.base import OffloadKey, ReqContext

from server_ext._contract import read_control, read_params
from server_ext._engine import EngineRetention

from ._cache import DevicePool
from ._model import Preset
from ._tier import Link, Tier, offload_keys

if TYPE_CHECKING:
    from ._cluster import Cluster

__all__ = ["Engine", "Request"]


@dataclass(slots=True, eq=False)
class Request:
    """One model call in the engine."""

    request_id: str
    keys: list[int]
    prompt_tokens: int
    output_tokens: int
    params: dict[str, Any] | None
    on_first: Callable[[float], None]
    on_done: Callable[[float], None]
    arrived: float = 0.0
    anon: int = 0
    computed: int = 0
    """Prompt tokens computed or cached: ``num_computed_tokens``."""
    cached: int = 0
    generated: int = 0
    first_computed: int = 0
    """Index of the first block this request computes (stored afterwards)."""
    admitted: bool = False
    loading: int = 0
    tier_ctx: ReqContext | None = None
    pool_ctx: ReqContext | None = None
    load_keys: list[OffloadKey] = field(default_factory=list)
    pool_keys: list[OffloadKey] = field(default_factory=list)
    offload_keys: list[OffloadKey] | None = None
    """``keys`` as the tier names them (made once, when a tier first asks)."""
    load_started: float = 0.0
    blocked_at: int = -1
    """Free blocks when it last could not get its blocks."""

    @property
    def num_computed_tokens(self) -> int:  # server_ext._requests.Progress
        return self.computed

    @property
    def num_prompt_tokens(self) -> int:
        return self.prompt_tokens

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prompt_tokens


class Engine:
    """One vLLM instance (module doc)."""

    def __init__(
        self,
        cluster: Cluster,
        index: int,
        preset: Preset,
        pool: DevicePool,
        tier: Tier | None,
        retention: EngineRetention | None,
    ) -> None:
        self.cluster = cluster
        self.index = index
        self.preset = preset
        self.pool = pool
        self.tier = tier
        self.retention = retention
        self.h2d = Link(preset.pcie)
        self.d2h = Link(preset.pcie)
        self.net = Link(preset.pool_link)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.loads_in_flight = 0
        self.busy = False
        self.busy_s = 0.0
        self.steps = 0
        self.bytes_loaded = {"host": 0, "pool": 0}
        self.bytes_stored = {"host": 0, "pool": 0}
        self.loads = 0
        self.loads_hidden = 0
        self.load_wait_s = 0.0
        # A run of decode steps in progress (start, step s, steps, requests),
        # and the token that voids its end event when an arrival cuts it.
        self._span: tuple[float, float, int, list[Request]] | None = None
        self._landed: list[Request] = []
        self._token = 0

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running) + self.loads_in_flight

    # -- arrivals and control

    def submit(self, r: Request) -> None:
        now = self.cluster.now
        r.arrived = now
        B = self.preset.block_tokens
        r.anon = math.ceil((r.prompt_tokens + r.output_tokens) / B) - len(r.keys)
        if self.retention is not None:
            self.retention.request_added(r.request_id, read_params(r.params).hinted, len(r.keys), r)
        if self.tier is not None:
            r.tier_ctx = Tier.context(r.request_id, r.params)
            self.tier.begin(r.tier_ctx)
        if self.cluster.pool is not None:
            r.pool_ctx = Tier.context(r.request_id, None)
            self.cluster.pool.begin(r.pool_ctx)
        self.waiting.append(r)
        self.kick()

    def control(self, request_id: str, params: dict[str, Any]) -> None:
        """A control message: to the retention, and to the tier's policy as
        vLLM's offloading sees one (a request with no blocks)."""
        message = read_control(params)
        if self.retention is not None and message is not None:
            self.retention.control(message)
        if self.tier is not None:
            self.tier.control(request_id, params)

    def kick(self) -> None:
        """Something arrived: a step starts now, or after the step in progress
        (a run of decode steps is cut there)."""
        if not self.busy:
            self.busy = True
            self.cluster.at(self.cluster.now, self._step)
            return
        span = self._span
        if span is None or span[2] <= 1:
            return
        start, dt, steps, decodes = span
        done = min(int((self.cluster.now - start) / dt) + 1, steps)
        if done == steps:
            return
        self._token += 1  # the run's end event is void
        self.steps -= steps - done
        self.busy_s -= dt * (steps - done)
        self._schedule_done(start + dt * done, [], decodes, done)

    def _schedule_done(
        self, at: float, chunks: list[tuple[Request, int]], decodes: list[Request], steps: int
    ) -> None:
        token = self._token

        def done() -> None:
            if token == self._token:
                self._span = None
                self._step_done(chunks, decodes, steps)

        self.cluster.at(at, done)

    # -- the step

    def _admit(self, r: Request, budget: int) -> int | None:
        """Try to admit ``r``: the tokens it prefills this step (0: it waits
        for a load), None if it cannot get its blocks."""
        B = self.preset.block_tokens
        limit = (r.prompt_tokens - 1) // B
        keys = r.keys
        if not r.admitted:
            if self.pool.free_blocks() <= r.blocked_at:
                return None  # nothing was freed since it last could not fit
            hit = self.pool.hit(keys, limit)
            if not self.pool.acquire(keys, r.anon):
                r.blocked_at = self.pool.free_blocks()
                return None
            more: list[OffloadKey] = []
            pool_more: list[OffloadKey] = []
            if self.tier is not None and r.tier_ctx is not None and hit < limit:
                more = self.tier.hits(_offload_keys(r)[hit:limit], r.tier_ctx)
            cpool = self.cluster.pool
            if cpool is not None and r.pool_ctx is not None and hit + len(more) < limit:
                pool_more = cpool.hits(_offload_keys(r)[hit + len(more) : limit], r.pool_ctx)
            r.admitted = True
            r.cached = (hit + len(more) + len(pool_more)) * B
            r.computed = r.cached
            r.first_computed = hit + len(more) + len(pool_more)
            if more or pool_more:
                self._load(r, more, pool_more)
                return 0
            self.pool.computed(keys[: r.first_computed])
        if self.retention is not None:
            self.retention.request_scheduled(r.request_id)
        self.running.append(r)
        return min(r.prompt_tokens - r.computed, budget)

    def _load(self, r: Request, host: list[OffloadKey], pool: list[OffloadKey]) -> None:
        now = self.cluster.now
        nbytes = self.preset.kv_block_bytes
        done = now
        if host:
            assert self.tier is not None and r.tier_ctx is not None
            self.tier.load(host, r.tier_ctx)
            done = self.h2d.transfer(now, len(host) * nbytes)
            self.bytes_loaded["host"] += len(host) * nbytes
        if pool:
            cpool = self.cluster.pool
            assert cpool is not None and r.pool_ctx is not None
            cpool.load(pool, r.pool_ctx)
            done = max(done, self.net.transfer(now, len(pool) * nbytes))
            self.bytes_loaded["pool"] += len(pool) * nbytes
        r.load_keys, r.pool_keys = host, pool
        r.loading = 1
        r.load_started = now
        self.loads += 1
        self.loads_in_flight += 1
        self.cluster.at(done, lambda: self._loaded(r))

    def _loaded(self, r: Request) -> None:
        now = self.cluster.now
        if self.tier is not None and r.tier_ctx is not None and r.load_keys:
            self.tier.loaded(r.load_keys, r.tier_ctx)
        if self.cluster.pool is not None and r.pool_ctx is not None and r.pool_keys:
            self.cluster.pool.loaded(r.pool_keys, r.pool_ctx)
        self.pool.computed(r.keys[: r.first_computed])
        self.loads_in_flight -= 1
        r.loading = 0
        wait = now - r.load_started
        self.load_wait_s += wait
        # A load is hidden when the engine was busy with others meanwhile:
        # the request would have queued behind them anyway.
        if wait <= 0 or len(self.running) > 0:
            self.loads_hidden += 1
        if self.busy:
            # vLLM's scheduler learns of a finished load from a step's output.
            self._landed.append(r)
            self.kick()
        else:
            self.waiting.appendleft(r)
            self.kick()

    def _step(self) -> None:
        now = self.cluster.now
        preset = self.preset
        budget = preset.max_batched_tokens
        chunks: list[tuple[Request, int]] = []
        decodes: list[Request] = []
        for r in self.running:
            if r.prefilling:
                n = min(r.prompt_tokens - r.computed, budget)
                if n > 0:
                    chunks.append((r, n))
                    budget -= n
            else:
                decodes.append(r)
                budget -= 1
        while self.waiting and budget > 0 and len(self.running) < preset.max_seqs:
            r = self.waiting.popleft()
            admitted = self._admit(r, budget)
            if admitted is None:
                self.waiting.appendleft(r)
                break
            n = admitted
            if n > 0:
                chunks.append((r, n))
                budget -= n
        if not chunks and not decodes:
            self.busy = False
            return
        if self.retention is not None:
            self.retention.step_scheduled(
                {r.request_id: n for r, n in chunks} | {r.request_id: 1 for r in decodes}
            )
        prefill = sum(n for _, n in chunks)
        attn = sum(n * (r.computed + n / 2) for r, n in chunks)
        ctx = sum(r.prompt_tokens + r.generated for r in decodes)
        dt = preset.cost.step_s(prefill, attn, len(decodes), ctx)
        steps = 1
        if not chunks and decodes:
            # Only decodes, and nothing waiting could be admitted (only a
            # finish frees blocks): steps until the first one finishes, at
            # the mean context (an arrival or a landed load cuts the run: kick).
            steps = min(r.output_tokens - r.generated for r in decodes)
            if steps > 1:
                mid = ctx + len(decodes) * (steps - 1) / 2
                dt = preset.cost.step_s(0, 0.0, len(decodes), int(mid))
                self._span = (now, dt, steps, decodes)
        self.steps += steps
        self.busy_s += dt * steps
        self._schedule_done(now + dt * steps, chunks, decodes, steps)

    def _step_done(
        self, chunks: list[tuple[Request, int]], decodes: list[Request], steps: int
    ) -> None:
        now = self.cluster.now
        finished: list[Request] = []
        for r, n in chunks:
            r.computed += n
            if not r.prefilling:
                self._prefilled(r)
                r.generated = 1
                r.on_first(now)
                if r.generated >= r.output_tokens:
                    finished.append(r)
        for r in decodes:
            r.generated += steps
            if r.generated >= r.output_tokens:
                finished.append(r)
        for r in finished:
            self._finish(r)
        if self._landed:
            self.waiting.extendleft(reversed(self._landed))
            self._landed.clear()
        self._step()

    def _prefilled(self, r: Request) -> None:
        """The prompt is computed: its new blocks are cached, and copied to
        the tier and the pool beside the compute."""
        new_keys = r.keys[r.first_computed :]
        self.pool.computed(new_keys)
        if not new_keys or (r.tier_ctx is None and r.pool_ctx is None):
            return
        new = _offload_keys(r)[r.first_computed :]
        now = self.cluster.now
        nbytes = self.preset.kv_block_bytes
        if self.tier is not None and r.tier_ctx is not None:
            taken = self.tier.store(new, r.tier_ctx)
            if taken:
                done = self.d2h.transfer(now, len(taken) * nbytes)
                self.bytes_stored["host"] += len(taken) * nbytes
                tier, ctx = self.tier, r.tier_ctx
                self.cluster.at(done, lambda: tier.stored(taken, ctx))
        cpool = self.cluster.pool
        if cpool is not None and r.pool_ctx is not None:
            taken_pool = cpool.store(new, r.pool_ctx)
            if taken_pool:
                done = self.net.transfer(now, len(taken_pool) * nbytes)
                self.bytes_stored["pool"] += len(taken_pool) * nbytes
                pctx = r.pool_ctx
                self.cluster.at(done, lambda: cpool.stored(taken_pool, pctx))

    def _finish(self, r: Request) -> None:
        self.running.remove(r)
        if self.retention is not None:
            self.retention.request_finished(r.request_id, r.keys)
        self.pool.release(r.keys, r.anon)
        if self.tier is not None and r.tier_ctx is not None:
            self.tier.finished(r.tier_ctx)
        if self.cluster.pool is not None and r.pool_ctx is not None:
            self.cluster.pool.finished(r.pool_ctx)
        r.on_done(self.cluster.now)


def _offload_keys(r: Request) -> list[OffloadKey]:
    if r.offload_keys is None:
        r.offload_keys = offload_keys(r.keys)
    return r.offload_keys
