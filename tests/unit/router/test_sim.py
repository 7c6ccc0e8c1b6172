"""Simulator invariants and hand-computed timings."""

from __future__ import annotations

import math
import random

import pytest

from seedance.router.core.policy import LeastOutstanding, PowerOfTwoChoices, RoundRobin
from seedance.router.sim import (
    LLAMA31_8B_BF16_L4,
    LLAMA31_70B_FP8_H200,
    PREFIX_BLOCK_TOKENS,
    MovingAverageForecastSource,
    ReplicaParams,
    TraceRequest,
    load_trace,
    simulate,
    summarise,
)

# Round numbers so timings can be computed by hand.
HAND = ReplicaParams(
    prefill_tokens_per_s=1000.0,
    prefill_overhead_s=0.1,
    decode_base_s=0.01,
    decode_per_seq_s=0.001,
    decode_per_ctx_token_s=0.0,
    kv_capacity_tokens=1000,
    kv_bytes_per_token=1,
    max_num_seqs=8,
    max_prefill_tokens_per_iter=4096,
)


def req(t: float, prompt: int, out: int) -> TraceRequest:
    return TraceRequest(arrival_s=t, prompt_tokens=prompt, output_tokens=out)


def synthetic(n: int, seed: int, rate: float = 20.0) -> list[TraceRequest]:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(req(t, rng.randint(10, 400), rng.randint(1, 300)))
    return out


def test_single_request_prefill_and_decode_timing() -> None:
    res = simulate([req(0.0, 500, 11)], RoundRobin(), 1, HAND)
    # prefill: 0.1 + 500/1000 = 0.6 s; then 10 decode steps of 0.01 + 0.001·1 s.
    assert res.ttft_s[0] == pytest.approx(0.6)
    assert res.e2e_s[0] == pytest.approx(0.6 + 10 * 0.011)


def test_decode_step_grows_with_batch() -> None:
    res = simulate([req(0.0, 100, 5), req(0.0, 100, 5)], RoundRobin(), 1, HAND)
    # The first starts prefill alone at t=0 (0.2 s); the second's prefill runs next and stalls
    # the first's decode (prefill-first); then both decode 4 steps at batch 2 (0.012 s each).
    assert res.ttft_s == pytest.approx((0.2, 0.4))
    assert res.e2e_s == pytest.approx((0.4 + 4 * 0.012, 0.4 + 4 * 0.012))


def test_context_term_of_decode_step() -> None:
    params = ReplicaParams(
        **{f: getattr(HAND, f) for f in HAND.__slots__ if f != "decode_per_ctx_token_s"},
        decode_per_ctx_token_s=0.001,
    )
    res = simulate([req(0.0, 10, 3)], RoundRobin(), 1, params)
    # After prefill the context is 11 tokens, then 12: steps 0.01+0.001+0.011, 0.01+0.001+0.012.
    assert res.e2e_s[0] == pytest.approx(0.11 + 0.022 + 0.023)


def test_arrival_during_decode_is_prefilled_at_next_step_boundary() -> None:
    # The first request decodes steps of 0.011 s from t=0.6; the second arrives at t=0.6555,
    # inside the 6th step, so its prefill (0.2 s) starts when that step ends, at 0.6 + 6·0.011.
    res = simulate([req(0.0, 500, 100), req(0.6555, 100, 2)], RoundRobin(), 1, HAND)
    boundary = 0.6 + 6 * 0.011
    assert res.ttft_s[1] == pytest.approx(boundary + 0.2 - 0.6555)


def test_request_waits_until_kv_fits() -> None:
    # 600 + 300 fills 900 of 1000 tokens; the second (200 + 100) must wait for the first.
    res = simulate([req(0.0, 600, 300), req(0.0, 200, 100)], RoundRobin(), 1, HAND)
    first_done = res.e2e_s[0]
    assert res.ttft_s[1] == pytest.approx(first_done + 0.1 + 0.2)
    assert res.max_kv_used_frac <= 1.0


def test_request_larger_than_kv_pool_is_rejected_not_stuck() -> None:
    res = simulate([req(0.0, 900, 200), req(0.1, 10, 2)], RoundRobin(), 1, HAND)
    assert res.rejected == 1
    assert math.isnan(res.ttft_s[0])
    assert not math.isnan(res.e2e_s[1])


@pytest.mark.parametrize("n_replicas", [1, 3])
def test_kv_never_over_capacity_and_all_complete(n_replicas: int) -> None:
    trace = synthetic(600, seed=3)
    res = simulate(trace, LeastOutstanding(), n_replicas, HAND)
    assert res.max_kv_used_frac <= 1.0
    assert res.rejected == 0
    for t, ttft, e2e in zip(trace, res.ttft_s, res.e2e_s, strict=True):
        assert 0 < ttft <= e2e
        # A request cannot finish faster than its own prefill and decode steps.
        assert (
            e2e
            >= HAND.prefill_overhead_s
            + t.prompt_tokens / 1000
            + (t.output_tokens - 1) * (HAND.decode_base_s + HAND.decode_per_seq_s)
            - 1e-9
        )


def test_deterministic_replay() -> None:
    trace = synthetic(400, seed=5)

    def once() -> tuple[tuple[float, ...], tuple[int, ...]]:
        src = MovingAverageForecastSource(HAND.kv_capacity_tokens)
        res = simulate(trace, PowerOfTwoChoices(random.Random(9)), 3, HAND, src)
        return res.ttft_s, res.replica_of

    assert once() == once()


def test_round_robin_spreads_evenly() -> None:
    res = simulate(synthetic(300, seed=1), RoundRobin(), 3, HAND)
    assert sorted(res.replica_of.count(i) for i in range(3)) == [100, 100, 100]


def test_summary_attainment_counts_slo() -> None:
    res = simulate([req(0.0, 500, 2), req(0.0, 3000, 2)], RoundRobin(), 2, HAND)
    s = summarise(res, ttft_slo_s=1.0)
    # 0.6 s meets a 1 s SLO, 3.1 s does not.
    assert s.slo_attainment_pct == pytest.approx(50.0)


def test_loads_both_trace_formats(tmp_path) -> None:
    csv = tmp_path / "a.csv"
    csv.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,0\n"
    )
    jl = tmp_path / "m.jsonl"
    jl.write_text(
        '{"timestamp": 3000, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
        '{"timestamp": 0, "input_length": 20, "output_length": 6, "hash_ids": [0]}\n'
    )
    a = load_trace(csv)
    assert a[1].arrival_s == pytest.approx(4.314579)
    assert a[1].output_tokens == 1
    m = load_trace(jl)
    assert [r.prompt_tokens for r in m] == [20, 10]
    assert m[1].arrival_s == pytest.approx(3.0)


def test_default_profile_is_consistent() -> None:
    p = LLAMA31_70B_FP8_H200
    # 80 layers × 8 KV heads × 128 dims × 2 (K, V) × 2 bytes (bf16).
    assert p.kv_bytes_per_token == 80 * 8 * 128 * 2 * 2
    assert p.typical_decode_step_s() > p.decode_base_s


def _blocks(prompt: int, first: int) -> tuple[int, ...]:
    # One ID per started PREFIX_BLOCK_TOKENS block, as Mooncake's hash_ids.
    return tuple(range(first, first + -(-prompt // PREFIX_BLOCK_TOKENS)))


def _with_cache_params(**over: object) -> ReplicaParams:
    base = {f: getattr(HAND, f) for f in HAND.__slots__}
    base.update(kv_capacity_tokens=10 * PREFIX_BLOCK_TOKENS, max_prefill_tokens_per_iter=8192)
    base.update(over)
    return ReplicaParams(**base)


def test_prefix_cache_hit_skips_cached_blocks() -> None:
    params = _with_cache_params()
    prompt = 2 * PREFIX_BLOCK_TOKENS + 100
    hashes = _blocks(prompt, 0)
    first = TraceRequest(arrival_s=0.0, prompt_tokens=prompt, output_tokens=2, prefix_hashes=hashes)
    # Same first two blocks, a different third: 2 blocks are served from the cache.
    second = TraceRequest(
        arrival_s=10.0, prompt_tokens=prompt, output_tokens=2, prefix_hashes=(*hashes[:2], 99)
    )
    res = simulate([first, second], RoundRobin(), 1, params)
    assert res.ttft_s[0] == pytest.approx(0.1 + prompt / 1000)
    assert res.ttft_s[1] == pytest.approx(0.1 + 100 / 1000)
    assert res.prefix_hit_tokens == 2 * PREFIX_BLOCK_TOKENS
    off = simulate([first, second], RoundRobin(), 1, _with_cache_params(prefix_caching=False))
    assert off.ttft_s[1] == pytest.approx(0.1 + prompt / 1000)
    assert off.prefix_hit_tokens == 0


def test_prefix_cache_full_hit_still_computes_one_token() -> None:
    params = _with_cache_params()
    prompt = PREFIX_BLOCK_TOKENS
    h = _blocks(prompt, 0)
    trace = [
        TraceRequest(arrival_s=t, prompt_tokens=prompt, output_tokens=1, prefix_hashes=h)
        for t in (0.0, 5.0)
    ]
    res = simulate(trace, RoundRobin(), 1, params)
    assert res.ttft_s[1] == pytest.approx(0.1 + 1 / 1000)


def test_prefix_cache_is_per_replica_and_lru_bounded() -> None:
    params = _with_cache_params()
    prompt = 3 * PREFIX_BLOCK_TOKENS
    a = TraceRequest(arrival_s=0.0, prompt_tokens=prompt, output_tokens=1, prefix_hashes=(1, 2, 3))
    # Round-robin over 2 replicas sends the repeat of `a` to the other replica: no hit.
    repeat = TraceRequest(
        arrival_s=5.0, prompt_tokens=prompt, output_tokens=1, prefix_hashes=a.prefix_hashes
    )
    res = simulate([a, repeat], RoundRobin(), 2, params)
    assert res.prefix_hit_tokens == 0
    # On one replica, 10 blocks of other prompts (the pool's size) push `a` out.
    fillers = [
        TraceRequest(
            arrival_s=1.0 + i,
            prompt_tokens=2 * PREFIX_BLOCK_TOKENS,
            output_tokens=1,
            prefix_hashes=(100 + 2 * i, 101 + 2 * i),
        )
        for i in range(5)
    ]
    late = TraceRequest(
        arrival_s=20.0, prompt_tokens=prompt, output_tokens=1, prefix_hashes=a.prefix_hashes
    )
    res = simulate([a, *fillers, late], RoundRobin(), 1, params)
    assert res.prefix_hit_tokens == 0
    res = simulate([a, *fillers[:3], late], RoundRobin(), 1, params)
    assert res.prefix_hit_tokens == prompt - 1


def test_mooncake_hash_ids_are_loaded(tmp_path) -> None:
    jl = tmp_path / "m.jsonl"
    jl.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]}\n')
    assert load_trace(jl)[0].prefix_hashes == (7, 8)


def test_l4_profile_is_consistent() -> None:
    p = LLAMA31_8B_BF16_L4
    # Llama-3.1-8B: 32 layers × 8 KV heads × 128 dims × 2 (K, V) × 2 bytes (bf16).
    assert p.kv_bytes_per_token == 32 * 8 * 128 * 2 * 2
    # The KV pool fits in what 24 GB leaves after 16.06 GB of weights.
    assert p.kv_capacity_tokens * p.kv_bytes_per_token < (24e9 - 16.06e9)
