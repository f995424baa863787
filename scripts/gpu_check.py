"""Check the KV copy paths the project still owns, on a GPU: exact bytes, GB/s, syncs.

On a GPU deployment vLLM's own code moves the host tier's KV (its
``CPUOffloadingWorker``; the project's ``HostOffloadingWorker`` runs only on the
CPU build). What the project still copies itself is the Mooncake tier's path:
``BlockCodec`` packs a block of every layer off the device into one flat host
tensor and unpacks it back, and ``TierWorker`` drives it around a store. This
script runs that path on CUDA tensors shaped like a real model's KV cache and
reports, per path:

- whether the bytes come back exactly (a store round trip through
  ``TierWorker`` too, with a store in memory);
- the GB/s achieved, beside a plain ``copy_`` of the same bytes to and from
  pinned host memory on the same machine (what the link allows);
- whether the calling thread waited for the device: work is queued on the
  stream first (``torch.cuda._sleep``), then the call and a
  ``torch.cuda.synchronize()`` after it are timed, and the synchronizations
  PyTorch itself counts (``torch.cuda.set_sync_debug_mode``) are reported.
  ``pack`` must wait (it returns host bytes) and ``TierWorker`` waits on
  purpose, once per batch (it times its transfers without the forward queued
  before them); ``unpack`` is not required to.

It needs PyTorch and a CUDA device, not vLLM (it imports none: the GPU machine
it is meant for may have no vLLM) nor a network. ``--dry-run`` runs the same
code on CPU tensors of a small shape (seconds; what the test suite runs).

    python scripts/gpu_check.py --out results/gpu_check.json
    python scripts/gpu_check.py --dry-run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

# The project from its checkout: the GPU machine need not have it installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from server_ext.tier import BlockCodec, Shard, TierStats, TierWorker, shard_key

QUEUED_S = 0.05
"""Device work queued before a call whose waiting is measured."""

_sleep: Callable[[int], None] = torch.cuda._sleep
"""Keeps the device busy for a number of its clock cycles (PyTorch's own tests use it)."""

BASELINE = "copy_"
"""The plain ``copy_`` of the same bytes that each path is set beside."""

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Shape:
    """A model's KV cache: vLLM's per-layer layout on CUDA, ``[2, blocks,
    block_size, kv_heads, head_size]`` (keys and values)."""

    layers: int
    kv_heads: int
    head_size: int
    dtype: str
    block_size: int
    blocks: int
    batch: int
    """Blocks per transfer (one engine step's saves or loads)."""

    @property
    def block_bytes(self) -> int:
        element = torch.tensor([], dtype=DTYPES[self.dtype]).element_size()
        return 2 * self.block_size * self.kv_heads * self.head_size * element * self.layers


FULL = Shape(
    layers=32, kv_heads=8, head_size=128, dtype="bf16", block_size=16, blocks=2048, batch=64
)
DRY = Shape(layers=2, kv_heads=2, head_size=16, dtype="bf16", block_size=4, blocks=32, batch=8)


@dataclass
class Waiting:
    """Whether a call waited for device work queued before it."""

    queued_s: float
    call_s: float
    sync_after_s: float
    implicit_syncs: int
    """Synchronizations PyTorch's sync debug mode warned of during the call."""

    @property
    def waited(self) -> bool:
        return self.call_s >= QUEUED_S / 2


@dataclass
class PathResult:
    """One copy path: its bytes per call, median time, GB/s, exactness."""

    path: str
    direction: str
    bytes: int
    seconds: float
    exact: bool | None
    needs_wait: bool | None
    """Whether the design needs the call to wait for the device (False: it
    does not; None: a baseline copy, not the project's)."""
    waiting: Waiting | None = None
    gb_per_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.gb_per_s = self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


class MemoryTier:
    """A ``KVTier`` in a dict: the store ``TierWorker`` fills and reads, without
    Mooncake (its transfer engine and MACs are not copies of device memory)."""

    def __init__(self) -> None:
        self.values: dict[str, torch.Tensor] = {}
        self._stats = TierStats()

    def contains(self, keys: Sequence[str]) -> int:
        return next((i for i, key in enumerate(keys) if key not in self.values), len(keys))

    def put(self, key: str, value: torch.Tensor, pin_s: float = 0.0) -> bool:
        self.values[key] = value
        self._stats.puts += 1
        return True

    def get(self, key: str) -> torch.Tensor | None:
        return self.values.get(key)

    def drop(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.values.pop(key, None)

    def close(self) -> None:
        self.values.clear()

    @property
    def bytes_used(self) -> int:
        return sum(value.numel() for value in self.values.values())

    @property
    def stats(self) -> TierStats:
        return self._stats


class Device:
    """Timing on one device: synchronizing and queueing work where it is CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._cycles_per_s = self._calibrate() if self.cuda else 0.0

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _calibrate(self) -> float:
        """Cycles of ``torch.cuda._sleep`` per second on this device (a launch's
        microseconds are noise against its milliseconds)."""
        cycles = 10_000_000
        _sleep(cycles)
        self.sync()
        start = time.perf_counter()
        _sleep(cycles)
        self.sync()
        return cycles / (time.perf_counter() - start)

    def timed(self, call: Callable[[], object], repeats: int) -> float:
        """Median seconds of ``call`` from an idle device to its work done."""
        call()  # warm-up: allocator, kernels
        seconds = []
        for _ in range(repeats):
            self.sync()
            start = time.perf_counter()
            call()
            self.sync()
            seconds.append(time.perf_counter() - start)
        return statistics.median(seconds)

    def waiting(self, call: Callable[[], object]) -> Waiting | None:
        """How ``call`` behaves with ``QUEUED_S`` of work queued before it
        (None off CUDA: nothing runs asynchronously there)."""
        if not self.cuda:
            return None
        self.sync()
        _sleep(int(self._cycles_per_s * QUEUED_S))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                start = time.perf_counter()
                call()
                returned = time.perf_counter()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        self.sync()
        done = time.perf_counter()
        syncs = sum("synchroniz" in str(w.message).lower() for w in caught)
        return Waiting(QUEUED_S, returned - start, done - returned, syncs)


def kv_caches(shape: Shape, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random bytes in every layer (any bit pattern: compared as bytes)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    dims = (2, shape.blocks, shape.block_size, shape.kv_heads, shape.head_size)
    caches = {}
    for layer in range(shape.layers):
        tensor = torch.empty(dims, dtype=DTYPES[shape.dtype], device=device)
        tensor.view(torch.uint8).random_(0, 256, generator=generator)
        caches[f"model.layers.{layer}.self_attn.attn"] = tensor
    return caches


def _blocks(caches: dict[str, torch.Tensor], ids: Sequence[int]) -> torch.Tensor:
    """The bytes of blocks ``ids``, every layer in name order (as packed)."""
    index = torch.tensor(list(ids), device=next(iter(caches.values())).device)
    layers = [caches[name].index_select(1, index).movedim(1, 0) for name in sorted(caches)]
    return torch.stack(layers, dim=1).contiguous().view(torch.uint8).reshape(len(ids), -1)


def _zero(caches: dict[str, torch.Tensor], ids: Sequence[int]) -> None:
    index = torch.tensor(list(ids), device=next(iter(caches.values())).device)
    for tensor in caches.values():
        tensor.index_fill_(1, index, 0)


def check(shape: Shape, device: torch.device, repeats: int) -> list[PathResult]:
    """Every path on ``shape``'s KV: ``batch`` blocks out of the start of the
    cache, back into its end (``blocks`` at least twice ``batch``)."""
    on = Device(device)
    caches = kv_caches(shape, device)
    codec = BlockCodec(caches, shape.blocks)
    assert codec.block_bytes == shape.block_bytes
    src = list(range(shape.batch))
    dst = list(range(shape.blocks - shape.batch, shape.blocks))
    reference = _blocks(caches, src).cpu()
    nbytes = shape.batch * shape.block_bytes
    results = []

    # What the link allows: one copy_ of the same bytes to and from host
    # memory, pinned on CUDA (the CPU build has no pinning).
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=on.cuda)
    for direction, copy in (("D2H", lambda: host.copy_(flat)), ("H2D", lambda: flat.copy_(host))):
        seconds = on.timed(copy, repeats)
        results.append(PathResult(BASELINE, direction, nbytes, seconds, None, None))

    packed: list[torch.Tensor] = []

    def pack() -> None:
        packed[:] = codec.pack(src)

    seconds = on.timed(pack, repeats)
    exact = torch.equal(torch.stack(packed), reference)
    results.append(PathResult("BlockCodec.pack", "D2H", nbytes, seconds, exact, True))
    results[-1].waiting = on.waiting(pack)

    def unpack() -> None:
        for value, block in zip(packed, dst, strict=True):
            codec.unpack(value, block)

    _zero(caches, dst)
    seconds = on.timed(unpack, repeats)
    exact = torch.equal(_blocks(caches, dst).cpu(), reference)
    results.append(PathResult("BlockCodec.unpack", "H2D", nbytes, seconds, exact, False))
    results[-1].waiting = on.waiting(unpack)

    tier = MemoryTier()
    worker = TierWorker(tier, codec)
    keys = [f"block-{i}" for i in src]

    def save() -> None:
        worker.save([(key, block, 0.0) for key, block in zip(keys, src, strict=True)], [])

    seconds = on.timed(save, repeats)
    stored = torch.stack([tier.values[shard_key(key, Shard())] for key in keys])
    exact = torch.equal(stored, reference)
    results.append(PathResult("TierWorker.save", "D2H", nbytes, seconds, exact, True))
    results[-1].waiting = on.waiting(save)

    failed: set[int] = set()

    def load() -> None:
        failed.update(worker.load(list(zip(keys, dst, strict=True))))

    _zero(caches, dst)
    seconds = on.timed(load, repeats)
    exact = not failed and torch.equal(_blocks(caches, dst).cpu(), reference)
    results.append(PathResult("TierWorker.load", "H2D", nbytes, seconds, exact, True))
    results[-1].waiting = on.waiting(load)
    report = worker.take_report()
    assert report is not None and not report.failed_saves and not report.failed_loads
    return results


def _table(results: Sequence[PathResult]) -> str:
    baseline = {r.direction: r.gb_per_s for r in results if r.path == BASELINE}
    header = (
        f"{'path':<18} {'dir':<4} {'MiB':>7} {'ms':>8} {'GB/s':>7} {'of copy_':>8} "
        f"{'exact':>5} {'waited':>7} {'needed':>7} {'sync after ms':>13} {'syncs':>5}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        w = r.waiting
        needed = {True: "yes", False: "no", None: "-"}[r.needs_wait]
        lines.append(
            f"{r.path:<18} {r.direction:<4} {r.bytes / 2**20:>7.1f} {r.seconds * 1e3:>8.2f} "
            f"{r.gb_per_s:>7.2f} {r.gb_per_s / baseline[r.direction]:>8.2f} "
            f"{'-' if r.exact is None else 'yes' if r.exact else 'NO':>5} "
            f"{'-' if w is None else 'yes' if w.waited else 'no':>7} {needed:>7} "
            f"{'-' if w is None else f'{w.sync_after_s * 1e3:.2f}':>13} "
            f"{'-' if w is None else w.implicit_syncs:>5}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU tensors, a small shape")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--kv-heads", type=int)
    parser.add_argument("--head-size", type=int)
    parser.add_argument("--dtype", choices=DTYPES)
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--blocks", type=int, help="blocks in the KV cache")
    parser.add_argument("--batch", type=int, help="blocks per transfer")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per path (median)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)

    base = DRY if args.dry_run else FULL
    given = {k: v for k, v in vars(args).items() if k in asdict(base) and v is not None}
    shape = Shape(**{**asdict(base), **given})
    if shape.blocks < 2 * shape.batch:
        parser.error(f"--blocks {shape.blocks}: at least twice --batch ({shape.batch})")
    if args.dry_run:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        parser.error("no CUDA device (--dry-run checks the same code on CPU tensors)")
    results = check(shape, device, args.repeats)
    ok = all(r.exact is not False for r in results)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}, torch {torch.__version__}, {shape}, {shape.block_bytes} bytes per block")
    print(_table(results))
    print("all bytes exact" if ok else "BYTES DIFFER")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "device": name,
            "torch": torch.__version__,
            "dry_run": args.dry_run,
            "shape": asdict(shape),
            "block_bytes": shape.block_bytes,
            "queued_s": QUEUED_S,
            "baseline_pinned": device.type == "cuda",
            "ok": ok,
            "imports_vllm": sys.modules.get("vllm") is not None,
            "not_checked": {
                "server_ext.offload.HostOffloadingWorker": "the CPU build's host-to-host "
                "copy; on CUDA vLLM's own CPUOffloadingWorker moves the host tier's KV",
            },
            "paths": [
                {**asdict(r), "waiting": None if r.waiting is None else asdict(r.waiting)}
                | {"waited": None if r.waiting is None else r.waiting.waited}
                for r in results
            ],
        }
        args.out.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
