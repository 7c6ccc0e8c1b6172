"""Router benchmark: replay a trace through the simulator under every routing policy.

Usage: bench_router.py TRACE [--slo-s 2.0] [--seed 1] [--profile h200-70b|l4-8b]
TRACE is an Azure LLM inference CSV (TIMESTAMP,ContextTokens,GeneratedTokens) or the Mooncake
conversation JSONL; the format is detected from the first line.

Replica count: the fleet just under round-robin's SLO knee, i.e. one less than the smallest count
at which round-robin meets the SLO target (see docs/router-sim.md for why and for the target when
the trace has prompts no idle replica can prefill within the SLO). Latency is TTFT throughout.
Progress goes to stderr; the table and the final `router:` line to stdout.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from seedance.router.core.policy import (
    Forecast,
    HoldOrder,
    LateBinding,
    LeastOutstanding,
    PowerOfTwoChoices,
    PredictiveConfig,
    PredictiveSloPolicy,
    ReplicaForecast,
    ReplicaState,
    RoundRobin,
    RouteRequest,
    RoutingPolicy,
)
from seedance.router.sim import (
    LLAMA31_8B_BF16_L4,
    LLAMA31_70B_FP8_H200,
    MovingAverageForecastSource,
    NoForecastSource,
    PolicySummary,
    ReplicaParams,
    TraceRequest,
    load_trace,
    simulate,
    summarise,
)
from seedance.router.sim.report import percentile

PROFILES: dict[str, ReplicaParams] = {
    "h200-70b": LLAMA31_70B_FP8_H200,
    "l4-8b": LLAMA31_8B_BF16_L4,
}
P = LLAMA31_70B_FP8_H200  # replaced by --profile in main()
BASELINES = ("round_robin", "least_outstanding", "power_of_two")
# Late-binding rows (docs/router-sim.md): the router holds requests while every replica has a
# full prefill iteration queued. `late_least_outstanding` is the baseline's late-binding twin,
# printed for honesty but not part of the baseline set; the shortest-prompt-first row
# reorders the router's queue and is reported apart (it can starve long prompts).
LATE_REF = "late_least_outstanding"
SPF = "late_predictive_slo(spf)"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def predictive_config(slo_s: float) -> PredictiveConfig:
    return PredictiveConfig(
        prefill_tokens_per_s=P.prefill_tokens_per_s,
        prefill_overhead_s=P.prefill_overhead_s,
        decode_step_s=P.typical_decode_step_s(),
        ttft_slo_s=slo_s,
    )


def policies(seed: int, slo_s: float) -> dict[str, Callable[[], RoutingPolicy]]:
    return {
        "round_robin": RoundRobin,
        "least_outstanding": LeastOutstanding,
        "power_of_two": lambda: PowerOfTwoChoices(random.Random(seed)),
        "predictive_slo": lambda: PredictiveSloPolicy(predictive_config(slo_s)),
        LATE_REF: lambda: LateBinding(
            LeastOutstanding(), prefill_tokens_per_iter=P.max_prefill_tokens_per_iter
        ),
        "late_predictive_slo": lambda: LateBinding(
            PredictiveSloPolicy(predictive_config(slo_s)),
            prefill_tokens_per_iter=P.max_prefill_tokens_per_iter,
        ),
        SPF: lambda: LateBinding(
            PredictiveSloPolicy(predictive_config(slo_s)),
            prefill_tokens_per_iter=P.max_prefill_tokens_per_iter,
            order=HoldOrder.SHORTEST_PROMPT,
            name=SPF,
        ),
    }


@dataclass(frozen=True, slots=True)
class Row:
    summary: PolicySummary
    reasons: dict[str, int]
    wall_s: float
    hit_pct: float
    # Share of requests held in the router (late binding) and the P95 of time held, ms.
    held_pct: float
    hold_p95_ms: float
    # Fairness: the longest TTFT, and the P95 TTFT of the longest 10 % of prompts.
    ttft_max_ms: float
    long_prompt_p95_ms: float


def run(
    trace: list[TraceRequest], make: Callable[[], RoutingPolicy], n: int, slo_s: float, fc: bool
) -> Row:
    source = MovingAverageForecastSource(P.kv_capacity_tokens) if fc else NoForecastSource()
    t0 = time.perf_counter()
    res = simulate(trace, make(), n, P, source)
    wall = time.perf_counter() - t0
    hold = sorted(res.hold_s)
    long_cut = sorted(r.prompt_tokens for r in trace)[int(0.9 * len(trace))]
    served = [t for t in res.ttft_s if not math.isnan(t)]
    long_ttft = sorted(
        t
        for r, t in zip(trace, res.ttft_s, strict=True)
        if r.prompt_tokens >= long_cut and not math.isnan(t)
    )
    return Row(
        summary=summarise(res, slo_s),
        reasons=dict(res.reasons),
        wall_s=wall,
        hit_pct=100.0 * res.prefix_hit_tokens / max(res.prompt_tokens, 1),
        held_pct=100.0 * sum(1 for h in hold if h > 0) / max(len(hold), 1),
        hold_p95_ms=percentile(hold, 95) * 1e3 if hold else 0.0,
        ttft_max_ms=max(served, default=math.nan) * 1e3,
        long_prompt_p95_ms=percentile(long_ttft, 95) * 1e3,
    )


def attainable_pct(trace: list[TraceRequest], slo_s: float) -> float:
    """Share of requests an idle replica could serve within the SLO (prefill alone)."""
    ok = sum(
        1
        for r in trace
        if r.prompt_tokens + r.output_tokens <= P.kv_capacity_tokens
        and P.prefill_overhead_s + r.prompt_tokens / P.prefill_tokens_per_s <= slo_s
    )
    return 100.0 * ok / len(trace)


def find_replicas(trace: list[TraceRequest], slo_s: float, target_pct: float, cap: int) -> int:
    cache: dict[int, float] = {}

    def rr(n: int) -> float:
        if n not in cache:
            row = run(trace, RoundRobin, n, slo_s, fc=False)
            s, wall = row.summary, row.wall_s
            cache[n] = s.slo_attainment_pct
            log(
                f"  search: round_robin n={n} slo_attainment={s.slo_attainment_pct:.1f}% "
                f"({wall:.1f}s)"
            )
        return cache[n]

    hi = 1
    while rr(hi) < target_pct:
        if hi >= cap:
            raise SystemExit(f"round-robin never reaches {target_pct:.1f}% up to {cap} replicas")
        hi = min(hi * 2, cap)
    lo = hi // 2  # rr(lo) < target (or lo == 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if rr(mid) >= target_pct:
            hi = mid
        else:
            lo = mid
    return max(hi - 1, 1)


def decision_us_p50(slo_s: float, n: int = 10, calls: int = 20_000) -> float:
    pol = PredictiveSloPolicy(predictive_config(slo_s))
    rng = random.Random(7)
    states = [
        ReplicaState(
            replica_id=f"r{i}",
            waiting=rng.randrange(5),
            running=rng.randrange(40),
            prefill_tokens_waiting=rng.randrange(20_000),
            prefill_tokens_in_progress=rng.randrange(8_000),
            kv_used_tokens=rng.randrange(P.kv_capacity_tokens),
            kv_capacity_tokens=P.kv_capacity_tokens,
        )
        for i in range(n)
    ]
    fc = Forecast(
        made_at_s=0.0,
        replicas={
            s.replica_id: ReplicaForecast(
                qps_5s=1.0,
                qps_30s=1.0,
                kv_used_tokens_5s=s.kv_used_tokens,
                kv_used_tokens_30s=s.kv_used_tokens,
            )
            for s in states
        },
    )
    req = RouteRequest(prompt_tokens=1000)
    samples = []
    for _ in range(calls // 100):
        t0 = time.perf_counter_ns()
        for _ in range(100):
            pol.choose(req, states, fc, 1.0)
        samples.append((time.perf_counter_ns() - t0) / 100 / 1e3)
    return statistics.median(samples)


def table(n: int, rows: dict[str, Row]) -> None:
    print(f"\nreplicas={n}  (latency = time to first token, ms; e2e = end-to-end, ms)")
    hdr = (
        f"{'policy':<28}{'ttft_p50':>10}{'ttft_p95':>10}{'ttft_p99':>10}{'ttft_max':>10}"
        f"{'long_p95':>10}{'e2e_p95':>10}{'slo_%':>7}{'kv_max':>7}{'hit_%':>6}{'held_%':>7}"
        f"{'hold_p95':>9}{'sim_s':>6}  reasons"
    )
    print(hdr)
    for name, r in rows.items():
        s = r.summary
        print(
            f"{name:<28}{s.ttft_p50_ms:>10.0f}{s.ttft_p95_ms:>10.0f}{s.ttft_p99_ms:>10.0f}"
            f"{r.ttft_max_ms:>10.0f}{r.long_prompt_p95_ms:>10.0f}{s.e2e_p95_ms:>10.0f}"
            f"{s.slo_attainment_pct:>7.1f}{s.max_kv_used_frac:>7.2f}{r.hit_pct:>6.1f}"
            f"{r.held_pct:>7.1f}{r.hold_p95_ms:>9.0f}{r.wall_s:>6.1f}  {r.reasons}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--slo-s", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-replicas", type=int, default=256)
    ap.add_argument("--profile", choices=sorted(PROFILES), default="h200-70b")
    args = ap.parse_args()
    global P
    P = PROFILES[args.profile]

    trace = load_trace(args.trace)
    name = args.trace.stem
    log(f"trace {name}: {len(trace)} requests over {trace[-1].arrival_s:.0f} s")
    ceiling = attainable_pct(trace, args.slo_s)
    target = 0.9 * ceiling
    log(f"attainable SLO share (idle replica) {ceiling:.1f}% -> round-robin target {target:.1f}%")
    n = find_replicas(trace, args.slo_s, target, args.max_replicas)
    log(f"operating point: {n} replicas")

    makers = policies(args.seed, args.slo_s)
    results: dict[int, dict[str, Row]] = {}
    for count in (n, n + 1):
        rows = {}
        for pname, make in makers.items():
            log(f"  replay {pname} n={count}")
            rows[pname] = run(trace, make, count, args.slo_s, fc=True)
        rows["predictive_slo(no forecast)"] = run(
            trace, makers["predictive_slo"], count, args.slo_s, fc=False
        )
        results[count] = rows

    print(
        f"trace={name} requests={len(trace)} slo_ttft_s={args.slo_s} "
        f"attainable_pct={ceiling:.1f} rr_target_pct={target:.1f}"
    )
    print(f"replica profile {args.profile}: {P}")
    print(
        "hit_% = prompt tokens served from the replica's prefix cache; long_p95 = TTFT p95 of the "
        "longest 10 % of prompts; held_% / hold_p95 = requests held in the router (late binding) "
        "and the p95 time held (part of TTFT)"
    )
    for count in (n + 1, n):
        table(count, results[count])
    us = decision_us_p50(args.slo_s)
    print(f"\npredictive_slo decision time, 10 replicas: p50 {us:.1f} us")

    rows = results[n]
    best_name = min(BASELINES, key=lambda b: rows[b].summary.ttft_p95_ms)
    best = rows[best_name].summary
    ours = rows["predictive_slo"].summary
    ratio = ours.ttft_p95_ms / best.ttft_p95_ms
    for other in ("late_predictive_slo", SPF):
        o = rows[other].summary
        print(
            f"{other}: p95 {o.ttft_p95_ms:.0f} ms, ratio {o.ttft_p95_ms / best.ttft_p95_ms:.3f} "
            f"against {best_name}, {o.ttft_p95_ms / rows[LATE_REF].summary.ttft_p95_ms:.3f} "
            f"against {LATE_REF}; slo {o.slo_attainment_pct:.1f}%"
        )
    print(f"best baseline by TTFT p95: {best_name}; ratio = ours / best at {n} replicas")
    print(
        f"router: trace={name} p95_latency_ms={ours.ttft_p95_ms:.0f} "
        f"best_baseline_p95_ms={best.ttft_p95_ms:.0f} ratio={ratio:.3f} "
        f"slo_attainment_pct={ours.slo_attainment_pct:.1f} "
        f"baseline_slo_attainment_pct={best.slo_attainment_pct:.1f}"
    )


if __name__ == "__main__":
    main()
