"""Probes behind docs/router-sim.md's "Against the goal" notes: experiments that explain the
router benchmark's figures but are not policies the router ships.

Usage: router_probes.py TRACE REPLICAS   (H200 profile, TTFT SLO 2 s, the bench's settings)

* release rules: `LateBinding` with the two release rules it does not use (bind only to replicas
  with nothing waiting, up to 4 waiting; bind when the router's KV estimate fits);
* oracle: `predictive_slo` told each request's true output length (no router has it);
* ageing: the router's queue ordered by arrival + c x own prefill time;
* backlog: arrivals and first tokens per minute under least-outstanding, around the worst minute.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import seedance.router.core.policy.late_binding as late_binding
from seedance.router.core.policy import (
    Decision,
    Forecast,
    LateBinding,
    LeastOutstanding,
    PredictiveConfig,
    PredictiveSloPolicy,
    ReplicaState,
    RouteRequest,
    RoutingPolicy,
)
from seedance.router.sim import (
    LLAMA31_70B_FP8_H200,
    MovingAverageForecastSource,
    SimResult,
    TraceRequest,
    load_trace,
    simulate,
    summarise,
)
from seedance.router.sim.report import percentile

P = LLAMA31_70B_FP8_H200
SLO_S = 2.0
CFG = PredictiveConfig(
    prefill_tokens_per_s=P.prefill_tokens_per_s,
    prefill_overhead_s=P.prefill_overhead_s,
    decode_step_s=P.typical_decode_step_s(),
    ttft_slo_s=SLO_S,
)
TakeRule = Callable[[RouteRequest, ReplicaState, int], bool]


def line(name: str, trace: Sequence[TraceRequest], res: SimResult) -> None:
    s = summarise(res, SLO_S)
    cut = sorted(r.prompt_tokens for r in trace)[int(0.9 * len(trace))]
    long_ = sorted(t for r, t in zip(trace, res.ttft_s, strict=True) if r.prompt_tokens >= cut)
    print(
        f"{name:<34} ttft p50/p95/p99 {s.ttft_p50_ms:.0f}/{s.ttft_p95_ms:.0f}/{s.ttft_p99_ms:.0f}"
        f" ms  max {max(t for t in res.ttft_s if not math.isnan(t)) * 1e3:.0f}"
        f"  long_p95 {percentile(long_, 95) * 1e3:.0f}"
        f"  slo {s.slo_attainment_pct:.1f}%",
        flush=True,
    )


def replay(trace: Sequence[TraceRequest], policy: RoutingPolicy, n: int) -> SimResult:
    return simulate(trace, policy, n, P, MovingAverageForecastSource(P.kv_capacity_tokens))


def release_rules(trace: Sequence[TraceRequest], n: int) -> None:
    out = CFG.expected_output_tokens
    rules: dict[str, TakeRule] = {
        "nothing waiting": lambda r, s, it: s.waiting == 0,
        "up to 4 waiting": lambda r, s, it: s.waiting < 4,
        "router KV estimate fits": lambda r, s, it: (
            (s.waiting == 0 and s.running == 0)
            or s.kv_used_tokens + s.prefill_tokens_waiting + (s.waiting + 1) * out + r.prompt_tokens
            <= s.kv_capacity_tokens
        ),
    }
    kept = late_binding.can_take_now
    try:
        for name, rule in rules.items():
            late_binding.can_take_now = rule
            pol = LateBinding(
                LeastOutstanding(), prefill_tokens_per_iter=P.max_prefill_tokens_per_iter
            )
            line(f"late_lo, release: {name}", trace, replay(trace, pol, n))
    finally:
        late_binding.can_take_now = kept


class OracleOutput(PredictiveSloPolicy):
    """`predictive_slo` with each request's true output length in place of the a-priori 256."""

    name = "predictive_slo(oracle output)"

    def __init__(self, trace: Sequence[TraceRequest]) -> None:
        super().__init__(CFG)
        self._out = {(t.arrival_s, t.prompt_tokens): t.output_tokens for t in trace}

    def choose(
        self,
        request: RouteRequest,
        replicas: Sequence[ReplicaState],
        forecast: Forecast | None,
        now_s: float,
    ) -> Decision:
        # Early binding: now_s is the request's arrival time.
        out = self._out[(now_s, request.prompt_tokens)]
        self._cfg = dataclasses.replace(CFG, expected_output_tokens=out)
        return super().choose(request, replicas, forecast, now_s)


class Aged(LateBinding):
    def __init__(self, c: float) -> None:
        super().__init__(
            PredictiveSloPolicy(CFG), prefill_tokens_per_iter=P.max_prefill_tokens_per_iter
        )
        self._c = c
        self.name = f"late_predictive_slo(age c={c:g})"

    def hold_key(self, request: RouteRequest, now_s: float) -> float:
        return now_s + self._c * request.prompt_tokens / P.prefill_tokens_per_s


def backlog(trace: Sequence[TraceRequest], n: int) -> None:
    res = replay(trace, LeastOutstanding(), n)
    arr = collections.Counter(int(t.arrival_s // 60) for t in trace)
    first = collections.Counter(
        int((t.arrival_s + x) // 60) for t, x in zip(trace, res.ttft_s, strict=True)
    )
    worst = max(range(len(trace)), key=lambda i: res.ttft_s[i])
    m = int(trace[worst].arrival_s // 60)
    print(
        f"least_outstanding, worst TTFT {res.ttft_s[worst]:.1f} s at t={trace[worst].arrival_s:.0f} s"
    )
    for w in range(m - 5, m + 5):
        print(f"  minute from {w * 60:>5} s: arrivals {arr[w]:>4}  first tokens {first[w]:>4}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("replicas", type=int)
    args = ap.parse_args()
    trace = load_trace(args.trace)
    n = args.replicas
    print(f"trace={args.trace.stem} replicas={n} (H200 profile)", file=sys.stderr)
    release_rules(trace, n)
    line("predictive_slo", trace, replay(trace, PredictiveSloPolicy(CFG), n))
    line(OracleOutput.name, trace, replay(trace, OracleOutput(trace), n))
    for c in (2.0, 5.0, 10.0, 20.0, 50.0):
        pol = Aged(c)
        line(pol.name, trace, replay(trace, pol, n))
    backlog(trace, n)


if __name__ == "__main__":
    main()
