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

from seedance.router.policy.state import (
    Decision,
    Forecast,
    HoldingPolicy,
    ReplicaState,
    RouteRequest,
    RoutingPolicy,
)
from seedance.router.sim.params import ReplicaParams
from seedance.router.sim.trace import PREFIX_BLOCK_TOKENS, TraceRequest

__all__ = ["ForecastSource", "ReplicaSnapshot", "SimResult", "simulate"]

# _BOUNDARY: an iteration has just ended and the replica is about to schedule the next one.
_IDLE, _PREFILL, _DECODE, _BOUNDARY = 0, 1, 2, 3


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
        "kv_used",
        "mode",
        "name",
        "prefill_batch",
        "prefill_tokens",
        "queue",
        "queued_tokens",
        "running",
        "steps_done",
        "version",
    )

    def __init__(self, name: str) -> None:
        self.name = name
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
) -> SimResult:
    """Replay `trace` through `n_replicas` replicas routed by `policy`."""
    if n_replicas < 1:
        raise ValueError(f"n_replicas must be >= 1, got {n_replicas}")
    p = params
    reps = [_Replica(f"r{i}") for i in range(n_replicas)]
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

    def iteration_end(r: _Replica, ri: int, now: float) -> None:
        if r.mode == _PREFILL:
            for req in r.prefill_batch:
                req.ttft_s = now - req.arrival_s
                if caching and req.hashes:
                    insert_blocks(r, req)
                if req.output == 1:
                    req.e2e_s = req.ttft_s
                    r.kv_used -= req.kv_need
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
        if held:
            # The router sees the boundary (KV freed, batch done) and may release held requests,
            # to this replica or another, before this replica schedules its next iteration.
            r.mode = _BOUNDARY
            release_held(now)
        schedule(r, ri, now)

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
                for i in range(n_replicas)
            ]
            arrivals_tick = [0] * n_replicas
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
            for r in reps
        ]

    def dispatch(req: _Req, decision: Decision, states: list[ReplicaState], now: float) -> None:
        nonlocal seq
        ri = decision.replica_index
        reasons[decision.reason.value] += 1
        arrivals_tick[ri] += 1
        replica_of[req.idx] = ri
        if on_decision is not None:
            on_decision(req.idx, states[ri])
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

    reqs = [_Req(i, t) for i, t in enumerate(trace)]
    replica_of = [-1] * len(reqs)
    ids = [r.name for r in reps]
    holding = policy if isinstance(policy, HoldingPolicy) else None
    held: list[tuple[float, int, _Req]] = []  # heap of (hold key, arrival index, request)
    for req in reqs:
        now = req.arrival_s
        run_events_until(now)
        tick_until(now)
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

    return SimResult(
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
