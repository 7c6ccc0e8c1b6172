"""One replica of the replay: the requests it holds and its state, and how many decode steps fit
in a span of virtual time.

Owns `SimRequest` (a trace request's progress through the replay), `SimReplica` (a replica's
queue, prefill batch, running sequences, KV use and prefix cache), the phases a replica is in
and `steps_within`, the closed form of a run of decode steps. Must not schedule, route or
scale: `engine` does, from these. Internal to the replay (`seedance.bench.router_sim` exports
none of it).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque

from seedance.traces.llm_requests import TraceRequest

__all__ = [
    "BOUNDARY",
    "DECODE",
    "DRAINING",
    "IDLE",
    "PREFILL",
    "READY",
    "RETIRED",
    "STARTING",
    "SimReplica",
    "SimRequest",
    "steps_within",
]

# BOUNDARY: an iteration has just ended and the replica is about to schedule the next one.
IDLE, PREFILL, DECODE, BOUNDARY = 0, 1, 2, 3
# A replica's place in the fleet (only with a `Scaler`): starting (billed, no traffic), ready
# (routed to), draining (no new traffic, finishing its own), retired (no longer billed).
STARTING, READY, DRAINING, RETIRED = 0, 1, 2, 3


class SimRequest:
    __slots__ = (
        "admit_s",
        "arrival_s",
        "cached",
        "e2e_s",
        "hashes",
        "hold_s",
        "idx",
        "kv_need",
        "output",
        "prompt",
        "ttft_s",
    )

    def __init__(self, idx: int, t: TraceRequest) -> None:
        self.idx = idx
        self.arrival_s = t.arrival_s
        self.prompt = t.prompt_tokens
        self.output = t.output_tokens
        self.kv_need = t.prompt_tokens + t.output_tokens
        self.hashes = t.prefix_hashes
        self.cached = 0
        self.hold_s = 0.0
        self.admit_s = math.nan
        self.ttft_s = math.nan
        self.e2e_s = math.nan


class SimReplica:
    __slots__ = (
        "cache",
        "ctx_tokens",
        "dec_k",
        "dec_start",
        "dec_u",
        "dec_v",
        "ended_s",
        "kv_used",
        "mode",
        "name",
        "phase",
        "prefill_batch",
        "prefill_tokens",
        "queue",
        "queued_tokens",
        "running",
        "started_s",
        "steps_done",
        "version",
    )

    def __init__(self, name: str, started_s: float = 0.0, phase: int = READY) -> None:
        self.name = name
        self.phase = phase
        self.started_s = started_s
        self.ended_s = math.nan
        self.queue: deque[SimRequest] = deque()
        self.queued_tokens = 0
        self.prefill_batch: list[SimRequest] = []
        self.prefill_tokens = 0
        # (finish step, request index, request): a request finishes when steps_done reaches it.
        self.running: list[tuple[int, int, SimRequest]] = []
        self.steps_done = 0
        self.ctx_tokens = 0
        self.kv_used = 0
        self.mode = IDLE
        self.version = 0
        self.dec_start = 0.0
        self.dec_u = 0.0
        self.dec_v = 0.0
        self.dec_k = 0
        # Prefix blocks held in the KV pool, least recently used first.
        self.cache: OrderedDict[int, None] = OrderedDict()


def steps_within(u: float, v: float, elapsed: float) -> int:
    """Largest j with S(j) = j·u + v·j(j−1)/2 <= elapsed (whole decode steps done)."""
    if elapsed <= 0:
        return 0
    if v <= 0:
        j = int(elapsed / u)
    else:
        b = u - v / 2
        j = int((-b + math.sqrt(b * b + 2 * v * elapsed)) / v)
    # Guard float rounding either way.
    while j > 0 and j * u + v * j * (j - 1) / 2 > elapsed:
        j -= 1
    while (j + 1) * u + v * (j + 1) * j / 2 <= elapsed:
        j += 1
    return j
