"""What one engine step costs, and the presets that name a GPU, a model and a tier.

Two step-cost models:

- ``Roofline``: a GPU from its data sheet and a dense transformer from its
  ``config.json``. A step's time is the larger of its FLOPs over the GPUs'
  dense peak times a model-FLOPs utilisation and its bytes (weights once,
  plus the KV its attention reads) over their HBM bandwidth times a
  bandwidth utilisation, plus tensor-parallel all-reduces over NVLink and a
  fixed per-step overhead. The utilisations are the assumptions; every
  constant is in ``docs/simulator.md`` with its source; the GEMMs'
  utilisation is the one microsoft/vidur's H100 kernel profile of a 70B
  model shows (Vidur's tables themselves are not shipped or read here).
- ``Measured``: the test bed, from a suite run's own numbers: seconds per
  step, per prefilled token and per decoded token.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

__all__ = [
    "GIB",
    "GPUS",
    "MODELS",
    "PRESETS",
    "Gpu",
    "LinkSpec",
    "Measured",
    "ModelSpec",
    "Preset",
    "Roofline",
    "StepCost",
]

GIB = 1 << 30


class StepCost(Protocol):
    """Seconds of one engine step."""

    def step_s(
        self, prefill_tokens: int, prefill_attn: float, decode_seqs: int, decode_ctx: int
    ) -> float:
        """``prefill_tokens`` prompt tokens whose attention spans
        ``prefill_attn`` token pairs in all, beside ``decode_seqs`` decoding
        sequences whose contexts sum to ``decode_ctx`` tokens."""
        ...


@dataclass(frozen=True, slots=True)
class Gpu:
    """A GPU's data-sheet numbers (dense, no sparsity)."""

    name: str
    bf16_flops: float
    fp8_flops: float
    hbm_bytes: int
    hbm_bw: float
    nvlink_bw: float
    """All-reduce bandwidth per GPU (NVLink 4: 450 GB/s each way)."""


GPUS = {
    # NVIDIA H100 SXM5 data sheet: 989 TFLOPS BF16, 1979 FP8 (dense), 80 GB
    # HBM3 at 3.35 TB/s, NVLink 4 900 GB/s (450 each way).
    "h100": Gpu("H100 SXM 80GB", 989e12, 1979e12, 80 * 10**9, 3.35e12, 450e9),
    # NVIDIA H200 SXM data sheet: the H100's compute, 141 GB HBM3e at 4.8 TB/s.
    "h200": Gpu("H200 SXM 141GB", 989e12, 1979e12, 141 * 10**9, 4.8e12, 450e9),
}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A dense decoder from its ``config.json`` (Llama 3.1 here)."""

    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int

    def kv_bytes_per_token(self, element_bytes: int) -> int:
        """K and V of every layer and KV head, one token."""
        return 2 * self.layers * self.kv_heads * self.head_dim * element_bytes


MODELS = {
    # meta-llama/Llama-3.1-70B config.json: 80 layers, hidden 8192, 64 heads,
    # 8 KV heads of 128; 70.6e9 parameters.
    "llama-70b": ModelSpec("Llama-3.1-70B", 70.6e9, 80, 8192, 64, 8, 128),
    # meta-llama/Llama-3.1-8B: 32 layers, hidden 4096, 32 heads, 8 KV heads.
    "llama-8b": ModelSpec("Llama-3.1-8B", 8.03e9, 32, 4096, 32, 8, 128),
}


@dataclass(frozen=True, slots=True)
class Roofline:
    """``StepCost`` of ``model`` on ``tp`` GPUs (module doc)."""

    gpu: Gpu
    model: ModelSpec
    tp: int
    weight_bytes: int
    """Bytes per parameter: 2 (BF16) or 1 (FP8)."""
    kv_element_bytes: int
    gemm_mfu: float = 0.7
    """microsoft/vidur's H100 profile of Llama-2-70B (the same layers as
    Llama-3.1-70B): the projections and MLP of 4,096 tokens, TP 1, take
    10.0 ms per layer for 7.0 TFLOP: 70% of the dense BF16 peak."""
    attn_mfu: float = 0.5
    """FlashAttention-2/3 forward on H100: 35-75% of peak by head size and
    length (FlashAttention-3 paper, 2024); half is the assumption."""
    mbu: float = 0.7
    """Share of HBM bandwidth a decode step's weight and KV reads reach."""
    overhead_s: float = 0.004
    """vLLM's scheduler and sampling per step, CPU side."""

    def step_s(
        self, prefill_tokens: int, prefill_attn: float, decode_seqs: int, decode_ctx: int
    ) -> float:
        m = self.model
        tokens = prefill_tokens + decode_seqs
        if tokens == 0:
            return 0.0
        peak = self.gpu.fp8_flops if self.weight_bytes == 1 else self.gpu.bf16_flops
        # GEMMs: 2 FLOPs per parameter per token; attention: QK^T and AV, 2
        # FLOPs each per query head dimension per token pair, every layer.
        attn_flops = 4 * m.layers * m.heads * m.head_dim * (prefill_attn + decode_ctx)
        compute = (2 * m.params * tokens / self.gemm_mfu + attn_flops / self.attn_mfu) / (
            self.tp * peak
        )
        # Decoding reads each sequence's whole KV; prefill is compute-bound.
        kv_read = m.kv_bytes_per_token(self.kv_element_bytes) * decode_ctx
        memory = (m.params * self.weight_bytes + kv_read) / (self.tp * self.gpu.hbm_bw * self.mbu)
        allreduce = 0.0
        if self.tp > 1:  # two ring all-reduces of the activations per layer
            size = tokens * m.hidden * 2
            allreduce = 2 * m.layers * size * 2 * (self.tp - 1) / self.tp / self.gpu.nvlink_bw
        return self.overhead_s + max(compute, memory) + allreduce

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(self.kv_element_bytes)

    def kv_tokens(self, memory_fraction: float = 0.9, activation_bytes: int = 4 * GIB) -> int:
        """Tokens of KV the GPUs hold: vLLM's ``gpu_memory_utilization`` of
        their memory, less the weights and an activation reserve per GPU."""
        free = self.tp * (self.gpu.hbm_bytes * memory_fraction - activation_bytes)
        free -= self.model.params * self.weight_bytes
        return max(int(free // self.kv_bytes_per_token), 0)


@dataclass(frozen=True, slots=True)
class Measured:
    """``StepCost`` measured on the test bed: a fixed cost per step, per
    prefilled token (its attention included) and per decoding sequence."""

    step_s_fixed: float
    prefill_token_s: float
    decode_seq_s: float

    def step_s(
        self, prefill_tokens: int, prefill_attn: float, decode_seqs: int, decode_ctx: int
    ) -> float:
        if prefill_tokens == 0 and decode_seqs == 0:
            return 0.0
        return (
            self.step_s_fixed
            + prefill_tokens * self.prefill_token_s
            + decode_seqs * self.decode_seq_s
        )


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A transfer path: bytes per second one way, and a latency per transfer."""

    bandwidth: float
    latency_s: float


# PCIe Gen5 x16: 64 GB/s per direction raw; about 50 GB/s is what pinned-memory
# copies reach (NVIDIA's bandwidthTest on H100 hosts), per GPU. A TP group of
# n GPUs moves its shards in parallel: n times that.
PCIE5 = LinkSpec(50e9, 20e-6)
# Mooncake-like pool over RDMA: a 400 Gb/s NIC per 8-GPU node, about 45 GB/s
# achieved (Mooncake's transfer engine reports ~87% of line rate), shared by
# the node's instances; tens of microseconds per transfer.
RDMA_NODE = LinkSpec(45e9, 50e-6)
# The CPU test bed: a host-tier "transfer" is a memcpy within one machine.
MEMCPY = LinkSpec(5e9, 1e-5)


@dataclass(frozen=True, slots=True)
class Preset:
    """One engine configuration: its step cost, KV geometry, tier sizes,
    links and scheduler limits.

    Args:
        name: The preset's CLI name.
        cost: Seconds per step.
        block_tokens: Tokens per block the simulator tracks (prefix caching,
            the tier): the test bed's vLLM block; on a GPU, a 256-token
            offloading block (16 of vLLM's 16-token blocks).
        device_blocks: KV blocks one instance's GPUs hold.
        kv_block_bytes: Bytes of one block (all TP shards together).
        host_tier_bytes: The host tier of one instance (vLLM's offloading
            size; the extension's ``tier_bytes``).
        pcie: Host <-> GPU path of one instance (each direction).
        pool_link: An instance's path to the shared pool.
        max_batched_tokens: vLLM's ``max_num_batched_tokens``.
        max_seqs: vLLM's ``max_num_seqs``.
        token_scale: Engine tokens per workload token (the test bed's
            ``k/64``: 4 token ids per 64-token hash block).
        max_out: Cap on output tokens (the suite's ``max_out``); 0: none.
        max_model_len: The served context: longer prompts are cut to it.
        gpus: GPUs per instance (for sessions per GPU).
        description: One line for tables.
    """

    name: str
    cost: StepCost
    block_tokens: int
    device_blocks: int
    kv_block_bytes: int
    host_tier_bytes: int
    pcie: LinkSpec
    pool_link: LinkSpec
    max_batched_tokens: int
    max_seqs: int
    token_scale: float = 1.0
    max_out: int = 0
    max_model_len: int = 131072
    gpus: int = 1
    description: str = ""

    @property
    def host_tier_blocks(self) -> int:
        return self.host_tier_bytes // self.kv_block_bytes

    def with_block_tokens(self, tokens: int) -> Preset:
        """The same engine tracked at ``tokens`` per block (same bytes)."""
        scale = tokens / self.block_tokens
        return replace(
            self,
            block_tokens=tokens,
            device_blocks=int(self.device_blocks / scale),
            kv_block_bytes=int(self.kv_block_bytes * scale),
        )


def _gpu_preset(
    name: str, gpu: str, model: str, tp: int, weight_bytes: int, host_gib: int, description: str
) -> Preset:
    roof = Roofline(GPUS[gpu], MODELS[model], tp, weight_bytes, kv_element_bytes=weight_bytes)
    block = 256
    block_bytes = roof.kv_bytes_per_token * block
    return Preset(
        name=name,
        cost=roof,
        block_tokens=block,
        device_blocks=roof.kv_tokens() // block,
        kv_block_bytes=block_bytes,
        host_tier_bytes=host_gib * GIB,
        pcie=LinkSpec(PCIE5.bandwidth * tp, PCIE5.latency_s),
        pool_link=RDMA_NODE,
        max_batched_tokens=8192,
        max_seqs=1024,
        gpus=tp,
        description=description,
    )


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        _gpu_preset(
            "h100-70b", "h100", "llama-70b", 4, 2, 512, "H100 x4 (TP4), Llama-3.1-70B BF16"
        ),
        _gpu_preset(
            "h100-70b-fp8", "h100", "llama-70b", 2, 1, 256, "H100 x2 (TP2), Llama-3.1-70B FP8"
        ),
        _gpu_preset(
            "h200-70b", "h200", "llama-70b", 4, 2, 512, "H200 x4 (TP4), Llama-3.1-70B BF16"
        ),
        _gpu_preset(
            "h200-70b-fp8", "h200", "llama-70b", 2, 1, 256, "H200 x2 (TP2), Llama-3.1-70B FP8"
        ),
        _gpu_preset("h100-8b", "h100", "llama-8b", 1, 2, 128, "H100 x1, Llama-3.1-8B BF16"),
        _gpu_preset("h200-8b", "h200", "llama-8b", 1, 2, 128, "H200 x1, Llama-3.1-8B BF16"),
    )
}
"""The GPU presets; ``testbed`` is built from a suite run (``_validate``)."""
