"""Replay simulator of LLM replicas with continuous batching, for scoring routing policies.

Pure and deterministic: virtual time, no sleeps, no clocks. `simulate` replays a trace through
N replicas with a fixed `ReplicaParams` profile (or a fleet a `Scaler` resizes, see
`sim.autoscale`); `summarise` turns the result into the figures the router benchmark reports.
"""

from seedance.bench.router_sim.engine import simulate
from seedance.bench.router_sim.forecast_source import MovingAverageForecastSource, NoForecastSource
from seedance.bench.router_sim.interfaces import (
    FleetObservation,
    ForecastSource,
    ReplicaSnapshot,
    Scaler,
    SimResult,
)
from seedance.bench.router_sim.params import LLAMA31_8B_BF16_L4, LLAMA31_70B_FP8_H200, ReplicaParams
from seedance.bench.router_sim.report import PolicySummary, summarise
from seedance.traces.llm_requests import PREFIX_BLOCK_TOKENS, TraceRequest, load_trace

__all__ = [
    "LLAMA31_8B_BF16_L4",
    "LLAMA31_70B_FP8_H200",
    "PREFIX_BLOCK_TOKENS",
    "FleetObservation",
    "ForecastSource",
    "MovingAverageForecastSource",
    "NoForecastSource",
    "PolicySummary",
    "ReplicaParams",
    "ReplicaSnapshot",
    "Scaler",
    "SimResult",
    "TraceRequest",
    "load_trace",
    "simulate",
    "summarise",
]
