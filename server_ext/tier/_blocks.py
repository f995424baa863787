"""Packing vLLM KV blocks (every layer) into flat byte tensors, and back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

__all__ = ["BlockCodec"]


def _block_dim(tensor: torch.Tensor, num_blocks: int) -> int:
    # vLLM's logical per-layer KV shape is [K/V, blocks, heads, tokens, dim]
    # whatever the physical layout; fall back to the first dim that is a
    # multiple of the block count for other shapes (e.g. MLA's [blocks, ...]).
    if tensor.dim() == 5 and tensor.shape[1] % num_blocks == 0:
        return 1
    for dim, size in enumerate(tensor.shape):
        if size >= num_blocks and size % num_blocks == 0:
            return dim
    raise ValueError(f"no block dimension of {num_blocks} in KV shape {tuple(tensor.shape)}")


class BlockCodec:
    """One vLLM block of all layers <-> one flat uint8 tensor.

    Works on any device (device -> host on ``pack``, host -> device on
    ``unpack``) and any kernel block size that divides vLLM's block size.
    """

    def __init__(self, kv_caches: Mapping[str, torch.Tensor], num_blocks: int) -> None:
        self._layers = [kv_caches[name] for name in sorted(kv_caches)]
        if not self._layers:
            raise ValueError("no KV cache layers")
        first = self._layers[0]
        if any(t.shape != first.shape or t.dtype != first.dtype for t in self._layers):
            raise ValueError("layers differ in KV shape or dtype (hybrid models unsupported)")
        self._dim = _block_dim(first, num_blocks)
        self._ratio = first.shape[self._dim] // num_blocks
        self._dtype = first.dtype
        per_layer = first.numel() // num_blocks * first.element_size()
        self.block_bytes = per_layer * len(self._layers)

    def synchronize(self) -> None:
        """Wait for the work queued on the KV caches' device (a GPU's forward),
        so that a transfer timed from here is timed alone."""
        device = self._layers[0].device
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def _kernel_ids(self, block_ids: Sequence[int]) -> torch.Tensor:
        r = self._ratio
        ids = torch.tensor(list(block_ids), dtype=torch.long)
        return (ids[:, None] * r + torch.arange(r)).reshape(-1)

    def pack(self, block_ids: Sequence[int]) -> list[torch.Tensor]:
        """Host copies of ``block_ids``, one fresh flat uint8 tensor per block."""
        if not block_ids:
            return []
        n = len(block_ids)
        per_layer = []
        for layer in self._layers:
            picked = layer.index_select(self._dim, self._kernel_ids(block_ids).to(layer.device))
            per_layer.append(picked.movedim(self._dim, 0).reshape(n, self._ratio, -1))
        packed = torch.stack(per_layer, dim=1).to("cpu").contiguous()  # [n, layers, r, ...]
        flat = packed.view(torch.uint8).reshape(n, -1)
        return [row.clone() for row in flat]

    def unpack(self, value: torch.Tensor, block_id: int) -> None:
        """Write one packed block back into ``block_id`` of every layer."""
        if value.numel() != self.block_bytes:
            raise ValueError(f"packed block has {value.numel()} bytes, expected {self.block_bytes}")
        r = self._ratio
        blocks = value.contiguous().view(self._dtype).reshape(len(self._layers), r, -1)
        for i, layer in enumerate(self._layers):
            view = layer.movedim(self._dim, 0)[block_id * r : (block_id + 1) * r]
            view.copy_(blocks[i].reshape(view.shape).to(layer.device))
