"""Event-driven replay of LLM replicas with continuous batching, in virtual time.

Owns the replica model and the event loop. Each replica runs a prefill-first iteration
scheduler (vLLM V0's default, no chunked prefill):

* A request waits in its replica's FIFO queue until its KV fits: admission reserves
  prompt + output tokens (the final size, so the pool can never be oversubscribed and nothing is
  preempted) and respects `max_num_seqs`. The head of the queue blocks those behind it.
* At each iteration boundary, if the queue head can be admitted, the replica runs one prefill
  iteration over the admissible head requests (up to `max_prefill_tokens_per_iter` prompt tokens,
  always at least one request): `prefill_overhead_s + tokens / prefill_tokens_per_s`. The first
  token of each is produced at its end (TTFT). Decoding stalls meanwhile.
* With `prefix_caching`, each replica keeps an LRU of the prefix blocks it has prefilled (up to
  its KV pool's size in blocks). At admission the request's leading blocks found there are not
  prefilled again (at least one prompt token always is, as in vLLM); its blocks enter the cache
  when its prefill ends. KV admission still reserves the full prompt (conservative: shared
  blocks would in reality be reused, not copied).
* Otherwise the running batch decodes; one step emits one token per sequence and lasts
  `decode_base_s + decode_per_seq_s·B + decode_per_ctx_token_s·Σcontext`. Steps between two
  events are advanced in closed form (the batch is fixed between them), which is what makes a
  full-hour replay take seconds in Python. An arrival that can be admitted cuts the run of steps
  at the next step boundary, exactly where a real engine would schedule its prefill.

With a `Scaler` the fleet changes size during the replay (the autoscaling benchmark). At every
`tick_s` the scaler sees a `FleetObservation` and names the replica count it wants; a replica it
adds is billed from that instant and takes traffic only `startup_s` later (weights loading,
engine start); one it removes first cancels replicas still starting (newest first), then stops
routing to the least-loaded ready ones, which finish what they hold and are billed until they are
empty. A removal is undone by reviving a draining replica before any new one is started.

The router sees each replica's exact state at the arrival instant and, when a forecast source is
given, the latest forecast it has published. A policy that is a `HoldingPolicy` binds late: each
request enters the router's own queue (ordered by the policy's hold key) and the queue's head is
offered to the policy on every arrival and at every iteration boundary of any replica, before
that replica schedules its next iteration, until the policy releases it; the time held is part
of the request's TTFT. Other policies bind every request on arrival.

Must not do: sleep, read clocks, or use global randomness; the same inputs give the same outputs.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from seedance.router.core.policy.state import (
    Decision,
    Forecast,
    HoldingPolicy,
    ReplicaState,
    RouteRequest,
    RoutingPolicy,
)
from seedance.router.sim.params import ReplicaParams
from seedance.router.sim.trace import PREFIX_BLOCK_TOKENS, TraceRequest

__all__ = [
    "FleetObservation",
    "ForecastSource",
    "ReplicaSnapshot",
    "Scaler",
    "SimResult",
    "simulate",
]

# _BOUNDARY: an iteration has just ended and the replica is about to schedule the next one.
_IDLE, _PREFILL, _DECODE, _BOUNDARY = 0, 1, 2, 3
# A replica's place in the fleet (only with a `Scaler`): starting (billed, no traffic), ready
# (routed to), draining (no new traffic, finishing its own), retired (no longer billed).
_STARTING, _READY, _DRAINING, _RETIRED = 0, 1, 2, 3


class _Req:
    __slots__ = (
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
        self.ttft_s = math.nan
        self.e2e_s = math.nan


class _Replica:
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

    def __init__(self, name: str, started_s: float = 0.0, phase: int = _READY) -> None:
        self.name = name
        self.phase = phase
        self.started_s = started_s
        self.ended_s = math.nan
        self.queue: deque[_Req] = deque()
        self.queued_tokens = 0
        self.prefill_batch: list[_Req] = []
        self.prefill_tokens = 0
        # (finish step, request index, request): a request finishes when steps_done reaches it.
        self.running: list[tuple[int, int, _Req]] = []
        self.steps_done = 0
        self.ctx_tokens = 0
        self.kv_used = 0
        self.mode = _IDLE
        self.version = 0
        self.dec_start = 0.0
        self.dec_u = 0.0
        self.dec_v = 0.0
        self.dec_k = 0
        # Prefix blocks held in the KV pool, least recently used first.
        self.cache: OrderedDict[int, None] = OrderedDict()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaSnapshot:
    """What a forecast source may observe of a replica at a tick."""

    replica_id: str
    kv_used_tokens: int
    arrivals_since_last_tick: int


class ForecastSource:
    """Interface for forecast providers inside the replay (see `sim.forecast_source`)."""

    def observe(self, now_s: float, replicas: Sequence[ReplicaSnapshot]) -> Forecast | None:
        raise NotImplementedError

    @property
    def tick_s(self) -> float:
        raise NotImplementedError


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetObservation:
    """What an autoscaler may observe at one of its ticks: engine gauges and router counters.

    Never a request's output length before it has finished, nor any future arrival.
    """

    now_s: float
    # States of the replicas taking traffic, and how many are starting or draining.
    ready: tuple[ReplicaState, ...]
    starting: int
    draining: int
    # Requests that reached the router since the previous tick: (arrival_s, prompt tokens).
    arrivals: tuple[tuple[float, int], ...]
    # Requests that finished since the previous tick, and their output tokens in all.
    finished: int
    finished_output_tokens: int
    # KV tokens held by every billed replica (draining ones included).
    kv_used_tokens: int
    # First tokens since the previous tick: (TTFT s, prompt tokens) of each request.
    first_tokens: tuple[tuple[float, int], ...] = ()


class Scaler:
    """Interface for autoscaling policies inside the replay (see `sim.autoscale`)."""

    @property
    def tick_s(self) -> float:
        raise NotImplementedError

    def desired(self, obs: FleetObservation) -> int:
        """Replicas wanted (ready + starting), given what is observable now."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    """Per-request latencies (seconds; NaN for requests that could never fit a replica)."""

    ttft_s: tuple[float, ...]
    e2e_s: tuple[float, ...]
    replica_of: tuple[int, ...]
    reasons: Counter[str]
    max_kv_used_frac: float
    rejected: int
    # Prompt tokens not prefilled thanks to prefix-cache hits, and all prompt tokens admitted.
    prefix_hit_tokens: int = 0
    prompt_tokens: int = 0
    # Time each request spent held in the router before binding (all zero unless the policy
    # is a `HoldingPolicy`); it is part of its TTFT.
    hold_s: tuple[float, ...] = ()
    # Billed replica time (start-up and draining included) up to the end of the replay, and the
    # fleet size (ready + starting) after each scaler decision: (time_s, replicas).
    replica_seconds: float = 0.0
    fleet_timeline: tuple[tuple[float, int], ...] = ()


def _steps_within(u: float, v: float, elapsed: float) -> int:
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


def simulate(
    trace: Sequence[TraceRequest],
    policy: RoutingPolicy,
    n_replicas: int,
    params: ReplicaParams,
    forecast_source: ForecastSource | None = None,
    on_decision: Callable[[int, ReplicaState], None] | None = None,
    *,
    scaler: Scaler | None = None,
    startup_s: float = 0.0,
    max_replicas: int = 1024,
) -> SimResult:
    """Replay `trace` through `n_replicas` replicas (the starting fleet, with a `scaler`)."""
    if n_replicas < 1:
        raise ValueError(f"n_replicas must be >= 1, got {n_replicas}")
    if scaler is not None and isinstance(policy, HoldingPolicy):
        raise ValueError("a holding policy cannot be replayed with a scaler")
    if startup_s < 0:
        raise ValueError(f"startup_s must be >= 0, got {startup_s}")
    p = params
    reps = [_Replica(f"r{i}") for i in range(n_replicas)]
    # Indices of the replicas taking traffic, in the order policies see them.
    live = list(range(n_replicas))
    pending: list[tuple[float, int]] = []  # (ready at, replica index) of starting replicas
    next_scale = scaler.tick_s if scaler is not None else math.inf
    scale_arrivals: list[tuple[float, int]] = []
    scale_finished = [0, 0]  # requests, output tokens
    scale_first: list[tuple[float, int]] = []
    timeline: list[tuple[float, int]] = []
    last_event_s = 0.0
    events: list[tuple[float, int, int, int]] = []  # (time, seq, replica, version)
    seq = 0
    reasons: Counter[str] = Counter()
    max_kv = 0
    rejected = 0
    arrivals_tick = [0] * n_replicas
    forecast: Forecast | None = None
    next_tick = 0.0
    tick_s = forecast_source.tick_s if forecast_source is not None else math.inf
    cache_cap_blocks = p.kv_capacity_tokens // PREFIX_BLOCK_TOKENS
    caching = p.prefix_caching

    def cached_tokens(r: _Replica, req: _Req) -> int:
        if not caching or not req.hashes:
            return 0
        cache = r.cache
        hit = 0
        for h in req.hashes:
            if h not in cache:
                break
            cache.move_to_end(h)
            hit += 1
        return min(hit * PREFIX_BLOCK_TOKENS, req.prompt - 1)

    def insert_blocks(r: _Replica, req: _Req) -> None:
        cache = r.cache
        for h in req.hashes:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > cache_cap_blocks:
            cache.popitem(last=False)

    def schedule(r: _Replica, ri: int, now: float) -> None:
        nonlocal seq, max_kv
        q = r.queue
        free = p.kv_capacity_tokens - r.kv_used
        n_seqs = len(r.running)
        batch: list[_Req] = []
        tokens = 0  # prompt tokens to compute (cache hits excluded)
        full = 0  # whole prompts, as counted in queued_tokens
        while q:
            head = q[0]
            if head.kv_need > free or n_seqs >= p.max_num_seqs:
                break
            head.cached = cached_tokens(r, head)
            work = head.prompt - head.cached
            if batch and tokens + work > p.max_prefill_tokens_per_iter:
                break
            q.popleft()
            batch.append(head)
            tokens += work
            full += head.prompt
            free -= head.kv_need
            n_seqs += 1
        r.version += 1
        if batch:
            r.queued_tokens -= full
            r.kv_used = p.kv_capacity_tokens - free
            max_kv = max(max_kv, r.kv_used)
            r.prefill_batch = batch
            r.prefill_tokens = tokens
            r.mode = _PREFILL
            end = now + p.prefill_overhead_s + tokens / p.prefill_tokens_per_s
        elif r.running:
            bsz = len(r.running)
            u = p.decode_base_s + p.decode_per_seq_s * bsz + p.decode_per_ctx_token_s * r.ctx_tokens
            v = p.decode_per_ctx_token_s * bsz
            k = r.running[0][0] - r.steps_done
            r.mode = _DECODE
            r.dec_start, r.dec_u, r.dec_v, r.dec_k = now, u, v, k
            end = now + k * u + v * k * (k - 1) / 2
        else:
            r.mode = _IDLE
            return
        seq += 1
        heapq.heappush(events, (end, seq, ri, r.version))

    def finish(req: _Req) -> None:
        scale_finished[0] += 1
        scale_finished[1] += req.output

    def iteration_end(r: _Replica, ri: int, now: float) -> None:
        nonlocal last_event_s
        last_event_s = now
        if r.mode == _PREFILL:
            for req in r.prefill_batch:
                req.ttft_s = now - req.arrival_s
                if scaler is not None:
                    scale_first.append((req.ttft_s, req.prompt))
                if caching and req.hashes:
                    insert_blocks(r, req)
                if req.output == 1:
                    req.e2e_s = req.ttft_s
                    r.kv_used -= req.kv_need
                    finish(req)
                else:
                    heapq.heappush(r.running, (r.steps_done + req.output - 1, req.idx, req))
                    r.ctx_tokens += req.prompt + 1
            r.prefill_batch = []
            r.prefill_tokens = 0
        elif r.mode == _DECODE:
            k = r.dec_k
            r.steps_done += k
            r.ctx_tokens += len(r.running) * k
            running = r.running
            while running and running[0][0] <= r.steps_done:
                _, _, req = heapq.heappop(running)
                req.e2e_s = now - req.arrival_s
                r.kv_used -= req.kv_need
                r.ctx_tokens -= req.prompt + req.output
                finish(req)
        if held:
            # The router sees the boundary (KV freed, batch done) and may release held requests,
            # to this replica or another, before this replica schedules its next iteration.
            r.mode = _BOUNDARY
            release_held(now)
        schedule(r, ri, now)
        if r.phase == _DRAINING and r.mode == _IDLE and not r.queue:
            retire(r, now)

    def retire(r: _Replica, now: float) -> None:
        r.phase = _RETIRED
        r.ended_s = now

    def run_events_until(t: float) -> None:
        # Iteration ends at the same instant as an arrival are processed first.
        while events and events[0][0] <= t:
            end, _, ri, ver = heapq.heappop(events)
            r = reps[ri]
            if ver == r.version:
                iteration_end(r, ri, end)

    def tick_until(now: float) -> None:
        nonlocal arrivals_tick, forecast, next_tick
        if forecast_source is None:
            return
        while next_tick <= now:
            snaps = [
                ReplicaSnapshot(
                    replica_id=ids[i],
                    kv_used_tokens=reps[i].kv_used,
                    arrivals_since_last_tick=arrivals_tick[i],
                )
                for i in live
            ]
            arrivals_tick = [0] * len(reps)
            forecast = forecast_source.observe(next_tick, snaps)
            next_tick += tick_s

    def observe() -> list[ReplicaState]:
        return [
            ReplicaState(
                replica_id=r.name,
                waiting=len(r.queue),
                running=len(r.running) + len(r.prefill_batch),
                prefill_tokens_waiting=r.queued_tokens,
                prefill_tokens_in_progress=r.prefill_tokens,
                kv_used_tokens=r.kv_used,
                kv_capacity_tokens=p.kv_capacity_tokens,
            )
            for r in (reps[i] for i in live)
        ]

    def dispatch(req: _Req, decision: Decision, states: list[ReplicaState], now: float) -> None:
        nonlocal seq
        ri = live[decision.replica_index]
        reasons[decision.reason.value] += 1
        arrivals_tick[ri] += 1
        replica_of[req.idx] = ri
        if on_decision is not None:
            on_decision(req.idx, states[decision.replica_index])
        r = reps[ri]
        was_empty = not r.queue
        r.queue.append(req)
        r.queued_tokens += req.prompt
        if r.mode == _IDLE:
            schedule(r, ri, now)
        elif (
            r.mode == _DECODE
            and was_empty
            and req.kv_need <= p.kv_capacity_tokens - r.kv_used
            and len(r.running) < p.max_num_seqs
        ):
            # Admissible now: stop the run of decode steps at the next step boundary.
            j = _steps_within(r.dec_u, r.dec_v, now - r.dec_start) + 1
            if j < r.dec_k:
                r.dec_k = j
                r.version += 1
                end = r.dec_start + j * r.dec_u + r.dec_v * j * (j - 1) / 2
                seq += 1
                heapq.heappush(events, (end, seq, ri, r.version))
        # _PREFILL and _BOUNDARY replicas schedule their queue when the iteration ends.

    def release_held(now: float) -> None:
        # The router's queue is ordered by the policy's hold key (arrival order on ties; FCFS
        # when the key is constant); its head blocks the rest, as a replica's does.
        assert holding is not None
        tick_until(now)
        while held:
            req = held[0][2]
            states = observe()
            decision = holding.release(
                RouteRequest(prompt_tokens=req.prompt, prefix_hashes=req.hashes),
                states,
                forecast,
                now,
            )
            if decision is None:
                return
            heapq.heappop(held)
            req.hold_s = now - req.arrival_s
            dispatch(req, decision, states, now)

    def scale_decision(now: float) -> None:
        assert scaler is not None
        starting = [i for i, r in enumerate(reps) if r.phase == _STARTING]
        draining = [i for i, r in enumerate(reps) if r.phase == _DRAINING]
        obs = FleetObservation(
            now_s=now,
            ready=tuple(observe()),
            starting=len(starting),
            draining=len(draining),
            arrivals=tuple(scale_arrivals),
            finished=scale_finished[0],
            finished_output_tokens=scale_finished[1],
            kv_used_tokens=sum(r.kv_used for r in reps if r.phase != _RETIRED),
            first_tokens=tuple(scale_first),
        )
        scale_first.clear()
        scale_arrivals.clear()
        scale_finished[0] = scale_finished[1] = 0
        want = max(1, min(max_replicas, scaler.desired(obs)))
        have = len(live) + len(starting)
        while have < want and draining:
            # A draining replica is warm: take it back before paying for a start-up.
            ri = max(draining, key=lambda i: reps[i].kv_used)
            draining.remove(ri)
            reps[ri].phase = _READY
            live.append(ri)
            have += 1
        while have < want:
            ri = len(reps)
            reps.append(_Replica(f"r{ri}", started_s=now, phase=_STARTING))
            ids.append(reps[ri].name)
            arrivals_tick.append(0)
            heapq.heappush(pending, (now + startup_s, ri))
            have += 1
        while have > want and starting:
            r = reps[starting.pop()]  # the newest start-up is the furthest from ready
            retire(r, now)
            have -= 1
        while have > want and len(live) > 1:
            ri = min(live, key=lambda i: (len(reps[i].queue) + len(reps[i].running), -i))
            live.remove(ri)
            r = reps[ri]
            r.phase = _DRAINING
            if r.mode == _IDLE and not r.queue:
                retire(r, now)
            have -= 1
        timeline.append((now, have))

    def advance(now: float) -> None:
        """Process iteration ends, replicas becoming ready and scaler ticks up to `now`."""
        nonlocal next_scale
        while True:
            ready_at = pending[0][0] if pending else math.inf
            t = min(next_scale, ready_at)
            if t > now:
                break
            run_events_until(t)
            if ready_at <= next_scale:
                _, ri = heapq.heappop(pending)
                if reps[ri].phase == _STARTING:
                    reps[ri].phase = _READY
                    live.append(ri)
            else:
                scale_decision(t)
                next_scale += scaler.tick_s if scaler is not None else math.inf
        run_events_until(now)

    reqs = [_Req(i, t) for i, t in enumerate(trace)]
    replica_of = [-1] * len(reqs)
    ids = [r.name for r in reps]
    holding = policy if isinstance(policy, HoldingPolicy) else None
    held: list[tuple[float, int, _Req]] = []  # heap of (hold key, arrival index, request)
    for req in reqs:
        now = req.arrival_s
        advance(now)
        tick_until(now)
        last_event_s = max(last_event_s, now)
        if scaler is not None:
            scale_arrivals.append((now, req.prompt))
        if req.kv_need > p.kv_capacity_tokens:
            # Could never be admitted anywhere: an engine rejects it at validation.
            rejected += 1
            continue
        if holding is not None:
            key = holding.hold_key(RouteRequest(prompt_tokens=req.prompt), now)
            heapq.heappush(held, (key, req.idx, req))
            release_held(now)
            continue
        states = observe()
        decision = policy.choose(
            RouteRequest(prompt_tokens=req.prompt, prefix_hashes=req.hashes), states, forecast, now
        )
        dispatch(req, decision, states, now)
    run_events_until(math.inf)
    if held:
        raise RuntimeError(
            f"policy {policy.name!r} still holds {len(held)} requests with every replica idle"
        )

    end_s = last_event_s
    replica_seconds = sum(
        (end_s if math.isnan(r.ended_s) else r.ended_s) - r.started_s for r in reps
    )
    return SimResult(
        replica_seconds=replica_seconds,
        fleet_timeline=tuple(timeline),
        ttft_s=tuple(q.ttft_s for q in reqs),
        e2e_s=tuple(q.e2e_s for q in reqs),
        replica_of=tuple(replica_of),
        reasons=reasons,
        max_kv_used_frac=max_kv / p.kv_capacity_tokens,
        rejected=rejected,
        prefix_hit_tokens=sum(q.cached for q in reqs),
        prompt_tokens=sum(q.prompt for q in reqs if not math.isnan(q.ttft_s)),
        hold_s=tuple(q.hold_s for q in reqs),
    )
