"""The simulated replica's fixed performance profile.

Two named profiles, each derived in docs/router-sim.md from published numbers (model config,
GPU datasheet, vLLM defaults): `LLAMA31_8B_BF16_L4` (the benchmark's default: Llama-3.1-8B in
bf16 served by vLLM on one NVIDIA L4 24 GB, small enough that one replica more or less changes a
fleet's capacity by ~10 % on the Azure conversation trace) and `LLAMA31_70B_FP8_H200` (the first
profile; one replica of it is a third of that trace's whole fleet). The same profile is used for
every policy; no field is fitted to a trace. Must not do: hold run state.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LLAMA31_8B_BF16_L4", "LLAMA31_70B_FP8_H200", "ReplicaParams"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaParams:
    """Timing and capacity of one replica; see docs/router-sim.md for each source."""

    # Prefill: time = prefill_overhead_s + prompt tokens / prefill_tokens_per_s per iteration.
    prefill_tokens_per_s: float
    prefill_overhead_s: float
    # Decode step: decode_base_s + decode_per_seq_s * batch + decode_per_ctx_token_s * Σ context.
    decode_base_s: float
    decode_per_seq_s: float
    decode_per_ctx_token_s: float
    # KV pool, in tokens (bytes of the pool / KV bytes per token).
    kv_capacity_tokens: int
    kv_bytes_per_token: int
    # vLLM scheduler limits: sequences in a batch, prompt tokens per prefill iteration.
    max_num_seqs: int
    max_prefill_tokens_per_iter: int
    # Automatic prefix caching (vLLM V1's default): prompt blocks already in the replica's KV
    # pool are not prefilled again. Needs traces that carry prefix block IDs.
    prefix_caching: bool = True
    # Bytes of weights a new replica loads before it serves (what its measured start-up is
    # scaled by, `router_sim.startup`); 0: not known.
    weight_bytes: int = 0

    def typical_decode_step_s(self, batch: int = 32, ctx_tokens_per_seq: int = 1500) -> float:
        """A representative step time, for policies that need one number."""
        return (
            self.decode_base_s
            + self.decode_per_seq_s * batch
            + self.decode_per_ctx_token_s * batch * ctx_tokens_per_seq
        )


LLAMA31_70B_FP8_H200 = ReplicaParams(
    prefill_tokens_per_s=7_000.0,
    prefill_overhead_s=0.020,
    decode_base_s=0.020,
    decode_per_seq_s=0.0001,
    decode_per_ctx_token_s=9.1e-8,
    kv_capacity_tokens=180_000,
    kv_bytes_per_token=327_680,
    max_num_seqs=256,
    max_prefill_tokens_per_iter=8192,
    # 70.6 B parameters at one byte (FP8).
    weight_bytes=70_600_000_000,
)


LLAMA31_8B_BF16_L4 = ReplicaParams(
    # 2 x 8.03 GFLOP/token at 121 TFLOP/s dense bf16 x ~50 % MFU (docs/router-sim.md).
    prefill_tokens_per_s=3_800.0,
    prefill_overhead_s=0.020,
    # 16.06 GB of bf16 weights at 300 GB/s = 53.5 ms at 100 %, ~85 % achieved.
    decode_base_s=0.063,
    decode_per_seq_s=0.0003,
    # 128 KiB of KV per context token read at 300 GB/s x 85 %.
    decode_per_ctx_token_s=5.1e-7,
    # 24 GB x 0.9 - 15.0 GiB weights - ~1.2 GiB activations ~ 4.0 GiB / 128 KiB.
    kv_capacity_tokens=32_000,
    kv_bytes_per_token=131_072,
    max_num_seqs=256,
    max_prefill_tokens_per_iter=8192,
    # 8.03 B parameters in bf16.
    weight_bytes=16_060_000_000,
)
