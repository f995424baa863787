"""The ceiling of a run: the reuse LRU and Belady's policy reach in its send order.

A run's prompts, served one at a time in the order its client sent them,
through a prefix cache of a given number of full blocks: LRU (no knowledge of
what comes) and Belady's optimal policy (evict the block whose next use is
furthest in the future: perfect knowledge). Blocks pinned by running requests
are ignored, so both are upper bounds for their policy *given that order*.
Each run gets them at two capacities: the device's KV blocks alone, and the
device plus the host tier in blocks (the tier's bytes over the bytes of one KV
block of the served model), so a table says how much of what any eviction
could win each configuration won. ``benchmarks.bound`` adds the extension's
own policy to the device's.
"""

from __future__ import annotations

import json
import statistics
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._traces import PrefixIndex

__all__ = [
    "bounds",
    "ceiling",
    "format_ceilings",
    "kv_block_bytes",
    "median_ceiling",
    "prefix_hits",
    "tier_blocks",
    "touch",
]

_NEVER = float("inf")

_DTYPE_BYTES = {
    "float64": 8,
    "double": 8,
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
}
"""Bytes of one KV element by the checkpoint's ``torch_dtype``."""


def prefix_hits(blocks: Sequence[int], prompt_len: int, size: int, cached: Any) -> int:
    """Cached prefix tokens, capped like vLLM (the last prompt token is computed)."""
    limit = (prompt_len - 1) // size
    n = 0
    while n < min(len(blocks), limit) and blocks[n] in cached:
        n += 1
    return n * size


def touch(cache: OrderedDict[int, None], blocks: Sequence[int]) -> None:
    """Mark a request's ``blocks`` used, its prefix most recently: vLLM frees a
    request's blocks tail first, so LRU evicts a chain from its end (a chain
    whose first block is gone cannot be hit at all)."""
    for b in reversed(blocks):
        cache[b] = None
        cache.move_to_end(b)


def bounds(prompts: Sequence[Sequence[int]], block_size: int, capacity: int) -> tuple[int, int]:
    """(LRU, Belady) cached tokens of ``prompts`` served in order.

    Belady evicts the block used furthest in the future, the deepest in its
    chain among equals: a block is never needed later than its parent, and
    keeping a child whose parent is gone would waste the room.
    """
    index = PrefixIndex(block_size)
    seqs = [index.chain(p)[0] for p in prompts]
    depth = {b: d for seq in seqs for d, b in enumerate(seq)}
    next_use: list[dict[int, float]] = [{} for _ in seqs]
    seen: dict[int, float] = {}
    for i in range(len(seqs) - 1, -1, -1):
        next_use[i] = {b: seen.get(b, _NEVER) for b in seqs[i]}
        seen.update((b, i) for b in seqs[i])
    lru: OrderedDict[int, None] = OrderedDict()
    belady: dict[int, float] = {}
    lru_hits = belady_hits = 0
    for i, (prompt, blocks) in enumerate(zip(prompts, seqs, strict=True)):
        lru_hits += prefix_hits(blocks, len(prompt), block_size, lru)
        belady_hits += prefix_hits(blocks, len(prompt), block_size, belady)
        touch(lru, blocks)
        belady.update((b, next_use[i][b]) for b in blocks)
        while len(lru) > capacity:
            lru.popitem(last=False)
        if len(belady) > capacity:
            furthest = sorted(belady, key=lambda b: (belady[b], depth[b]), reverse=True)
            for b in furthest[: len(belady) - capacity]:
                del belady[b]
    return lru_hits, belady_hits


def kv_block_bytes(model_dir: str | Path, block_size: int) -> int:
    """Bytes of one KV block of the model in ``model_dir`` as vLLM serves it by
    default, from its ``config.json``: K and V, of every layer, for every KV
    head, ``block_size`` tokens of ``head_dim`` elements each.

    The element size is the checkpoint's ``torch_dtype``, except that vLLM's
    ``--dtype auto`` serves a float32 checkpoint (or one that names none) in 16
    bits, its KV included; another ``--dtype`` or ``--kv-cache-dtype`` on the
    command line is not seen here. Attention that stores no per-head K and V
    (MLA) is not modelled.
    """
    config: dict[str, Any] = json.loads((Path(model_dir) / "config.json").read_text())
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), dict):
        config = {**config, **config["text_config"]}  # a multimodal checkpoint's language model
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"{model_dir}: unknown torch_dtype {dtype!r}")
    element = 2 if dtype in ("float32", "float") else _DTYPE_BYTES[dtype]
    return 2 * layers * kv_heads * head_dim * element * block_size


def tier_blocks(model_dir: str | Path, tier_bytes: int, block_size: int) -> int | None:
    """KV blocks of the served model that ``tier_bytes`` of host tier hold;
    None when the model is no directory with a readable ``config.json`` (a
    hub name)."""
    try:
        return tier_bytes // kv_block_bytes(model_dir, block_size)
    except (OSError, KeyError, ValueError):
        return None


def _share(tokens: int, theoretical: int) -> float | None:
    return tokens / theoretical if theoretical else None


def ceiling(
    prompts: Sequence[Sequence[int]],
    theoretical: int,
    block_size: int,
    device_blocks: int,
    tier_blocks: int | None,
    *,
    tiered: bool,
) -> dict[str, Any]:
    """The JSON of a run's ceiling: LRU and Belady reuse of ``prompts`` (in send
    order), as shares of the run's ``theoretical`` cached tokens, at
    ``device_blocks`` (``device``) and at those plus ``tier_blocks``
    (``tiered``; None without a tier size); ``served``: the capacity the run
    itself had (``tiered`` when it ran with the tier)."""

    def at(capacity: int) -> dict[str, Any]:
        lru, belady = bounds(prompts, block_size, capacity)
        return {
            "blocks": capacity,
            "lru": _share(lru, theoretical),
            "belady": _share(belady, theoretical),
        }

    return {
        "device": at(device_blocks),
        "tiered": None if tier_blocks is None else at(device_blocks + tier_blocks),
        "served": "tiered" if tiered and tier_blocks is not None else "device",
    }


def median_ceiling(ceilings: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The median of each number of ``ceilings`` (the repeats of one
    configuration), in ``ceiling``'s layout; None without any."""
    if not ceilings:
        return None

    def median(values: list[Any]) -> Any:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    merged: dict[str, Any] = {"served": ceilings[0]["served"]}
    for level in ("device", "tiered"):
        found = [c[level] for c in ceilings if c.get(level) is not None]
        merged[level] = (
            {key: median([f[key] for f in found]) for key in ("blocks", "lru", "belady")}
            if found
            else None
        )
    return merged


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def format_ceilings(summaries: Sequence[Mapping[str, Any]], note: str = "") -> list[str]:
    """Lines for a table: per run that has a ceiling, its reuse, LRU and Belady
    at the device's capacity and with the tier, and its reuse as a share of
    Belady at the capacity it had (``of Belady``); empty when none has one.
    ``note`` ends the title line."""
    rows = [s for s in summaries if s.get("ceiling")]
    if not rows:
        return []
    head = (
        f"{'ceiling':<24}{'reuse':>8}{'device LRU':>12}{'Belady':>9}"
        f"{'+tier LRU':>11}{'Belady':>9}{'of Belady':>11}  blocks (device, +tier)"
    )
    lines = [
        "reuse of the theoretical maximum in each run's send order, at its KV (LRU; "
        f"Belady: exact future knowledge){note}",
        head,
        "-" * len(head),
    ]
    for s in rows:
        c, reuse = s["ceiling"], s.get("reuse_of_theoretical")
        device, tiered = c["device"], c.get("tiered") or {}
        own = (tiered if c.get("served") == "tiered" else device).get("belady")
        of_belady = reuse / own if isinstance(reuse, int | float) and own else None
        blocks = f"{device['blocks']:,.0f}, " + (
            f"{tiered['blocks']:,.0f}" if tiered.get("blocks") is not None else "-"
        )
        lines.append(
            f"{s['config']:<24}{_percent(reuse):>8}{_percent(device['lru']):>12}"
            f"{_percent(device['belady']):>9}{_percent(tiered.get('lru')):>11}"
            f"{_percent(tiered.get('belady')):>9}{_percent(of_belady):>11}  {blocks}"
        )
    return lines
