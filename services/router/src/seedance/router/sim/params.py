"""The simulated replica's fixed performance profile.

One replica = Llama-3.1-70B with FP8 weights (bf16 KV cache) served by vLLM on one H200 141 GB.
Every figure is derived in docs/router-sim.md from published numbers (vLLM's nightly
benchmark, NVIDIA's TTFT post, the model config, H200 datasheet). The same profile is
used for every policy; no field is fitted to a trace. Must not do: hold run state.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LLAMA31_70B_FP8_H200", "ReplicaParams"]


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

    def typical_decode_step_s(self, batch: int = 32, ctx_tokens_per_seq: int = 1500) -> float:
        """A representative step time, for policies that need one number."""
        return (
            self.decode_base_s
            + self.decode_per_seq_s * batch
            + self.decode_per_ctx_token_s * batch * ctx_tokens_per_seq
        )


LLAMA31_70B_FP8_H200 = ReplicaParams(
    prefill_tokens_per_s=5_000.0,
    prefill_overhead_s=0.020,
    decode_base_s=0.020,
    decode_per_seq_s=0.0001,
    decode_per_ctx_token_s=9.1e-8,
    kv_capacity_tokens=180_000,
    kv_bytes_per_token=327_680,
    max_num_seqs=256,
    max_prefill_tokens_per_iter=8192,
)
