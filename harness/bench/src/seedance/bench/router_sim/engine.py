"""Event-driven replay of LLM replicas with continuous batching, in virtual time.

Owns the event loop and each replica's scheduling (a replica's state and its decode steps'
closed form are `replica`'s; what plugs in and what comes out, `interfaces`'). Each replica runs
a prefill-first iteration scheduler (vLLM V0's default, no chunked prefill):

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
engine start; one time, or a sequence the k-th started replica takes the k-th of, so start-ups
can follow a measured distribution); one it removes first cancels replicas still starting
(newest first), then stops routing to the least-loaded ready ones, which finish what they hold
and are billed until they are empty. A removal is undone by reviving a draining replica before
any new one is started.

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
from collections import Counter
from collections.abc import Callable, Sequence

from seedance.bench.router_sim.interfaces import (
    FleetObservation,
    ForecastSource,
    ReplicaSnapshot,
    Scaler,
    SimResult,
)
from seedance.bench.router_sim.params import ReplicaParams
from seedance.bench.router_sim.replica import (
    BOUNDARY,
    DECODE,
    DRAINING,
    IDLE,
    PREFILL,
    READY,
    RETIRED,
    STARTING,
    SimReplica,
    SimRequest,
    steps_within,
)
from seedance.router.core.policy.state import (
    Decision,
    Forecast,
    HoldingPolicy,
    ReplicaState,
    RouteRequest,
    RoutingPolicy,
)
from seedance.traces.llm_requests import PREFIX_BLOCK_TOKENS, TraceRequest

__all__ = ["simulate"]


def simulate(
    trace: Sequence[TraceRequest],
    policy: RoutingPolicy,
    n_replicas: int,
    params: ReplicaParams,
    forecast_source: ForecastSource | None = None,
    on_decision: Callable[[int, ReplicaState], None] | None = None,
    *,
    scaler: Scaler | None = None,
    startup_s: float | Sequence[float] = 0.0,
    max_replicas: int = 1024,
) -> SimResult:
    """Replay `trace` through `n_replicas` replicas (the starting fleet, with a `scaler`)."""
    if n_replicas < 1:
        raise ValueError(f"n_replicas must be >= 1, got {n_replicas}")
    if scaler is not None and isinstance(policy, HoldingPolicy):
        raise ValueError("a holding policy cannot be replayed with a scaler")
    times = (startup_s,) if isinstance(startup_s, int | float) else tuple(startup_s)
    if not times or min(times) < 0:
        raise ValueError(
            f"startup_s must be >= 0 (one time or a non-empty sequence), got {startup_s}"
        )
    replay = _Replay(
        trace,
        policy,
        n_replicas,
        params,
        forecast_source,
        on_decision,
        scaler=scaler,
        startup_s=times,
        max_replicas=max_replicas,
    )
    return replay.run()


class _Replay:
    """One replay's state and its event handlers (`simulate` is the only way in)."""

    def __init__(
        self,
        trace: Sequence[TraceRequest],
        policy: RoutingPolicy,
        n_replicas: int,
        params: ReplicaParams,
        forecast_source: ForecastSource | None,
        on_decision: Callable[[int, ReplicaState], None] | None,
        *,
        scaler: Scaler | None,
        startup_s: tuple[float, ...],
        max_replicas: int,
    ) -> None:
        self.policy = policy
        self.p = params
        self.forecast_source = forecast_source
        self.on_decision = on_decision
        self.scaler = scaler
        # The k-th replica the scaler starts takes startup_s[k] (cycling): one constant, or
        # draws from a measured distribution, the same sequence for every policy compared.
        self.startup_s = startup_s
        self.started = 0
        self.max_replicas = max_replicas
        self.reps = [SimReplica(f"r{i}") for i in range(n_replicas)]
        self.ids = [r.name for r in self.reps]
        # Indices of the replicas taking traffic, in the order policies see them.
        self.live = list(range(n_replicas))
        self.pending: list[tuple[float, int]] = []  # (ready at, replica index) of starting ones
        self.next_scale = scaler.tick_s if scaler is not None else math.inf
        self.scale_arrivals: list[tuple[float, int]] = []
        self.scale_finished = [0, 0]  # requests, output tokens
        self.scale_first: list[tuple[float, int, float]] = []
        self.decoded_tokens = 0  # decode steps ended, times the sequences in each
        self.timeline: list[tuple[float, int]] = []
        self.last_event_s = 0.0
        self.events: list[tuple[float, int, int, int]] = []  # (time, seq, replica, version)
        self.seq = 0
        self.reasons: Counter[str] = Counter()
        self.max_kv = 0
        self.rejected = 0
        self.arrivals_tick = [0] * n_replicas
        self.forecast: Forecast | None = None
        self.next_tick = 0.0
        self.tick_s = forecast_source.tick_s if forecast_source is not None else math.inf
        self.cache_cap_blocks = params.kv_capacity_tokens // PREFIX_BLOCK_TOKENS
        self.caching = params.prefix_caching
        self.reqs = [SimRequest(i, t) for i, t in enumerate(trace)]
        self.replica_of = [-1] * len(self.reqs)
        self.holding = policy if isinstance(policy, HoldingPolicy) else None
        # A heap of (hold key, arrival index, request).
        self.held: list[tuple[float, int, SimRequest]] = []

    # --- the prefix cache -----------------------------------------------------------------

    def cached_tokens(self, r: SimReplica, req: SimRequest) -> int:
        if not self.caching or not req.hashes:
            return 0
        cache = r.cache
        hit = 0
        for h in req.hashes:
            if h not in cache:
                break
            cache.move_to_end(h)
            hit += 1
        return min(hit * PREFIX_BLOCK_TOKENS, req.prompt - 1)

    def insert_blocks(self, r: SimReplica, req: SimRequest) -> None:
        cache = r.cache
        for h in req.hashes:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > self.cache_cap_blocks:
            cache.popitem(last=False)

    # --- one replica's iterations ---------------------------------------------------------

    def push_event(self, end: float, ri: int, version: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (end, self.seq, ri, version))

    def admit(self, r: SimReplica) -> tuple[list[SimRequest], int, int, int]:
        """The prefill batch the queue head allows: (batch, tokens to compute, whole prompts,
        KV left free)."""
        p = self.p
        q = r.queue
        free = p.kv_capacity_tokens - r.kv_used
        n_seqs = len(r.running)
        batch: list[SimRequest] = []
        tokens = 0  # prompt tokens to compute (cache hits excluded)
        full = 0  # whole prompts, as counted in queued_tokens
        while q:
            head = q[0]
            if head.kv_need > free or n_seqs >= p.max_num_seqs:
                break
            head.cached = self.cached_tokens(r, head)
            work = head.prompt - head.cached
            if batch and tokens + work > p.max_prefill_tokens_per_iter:
                break
            q.popleft()
            batch.append(head)
            tokens += work
            full += head.prompt
            free -= head.kv_need
            n_seqs += 1
        return batch, tokens, full, free

    def schedule(self, r: SimReplica, ri: int, now: float) -> None:
        p = self.p
        batch, tokens, full, free = self.admit(r)
        r.version += 1
        if batch:
            for req in batch:
                req.admit_s = now
            r.queued_tokens -= full
            r.kv_used = p.kv_capacity_tokens - free
            self.max_kv = max(self.max_kv, r.kv_used)
            r.prefill_batch = batch
            r.prefill_tokens = tokens
            r.mode = PREFILL
            end = now + p.prefill_overhead_s + tokens / p.prefill_tokens_per_s
        elif r.running:
            bsz = len(r.running)
            u = p.decode_base_s + p.decode_per_seq_s * bsz + p.decode_per_ctx_token_s * r.ctx_tokens
            v = p.decode_per_ctx_token_s * bsz
            k = r.running[0][0] - r.steps_done
            r.mode = DECODE
            r.dec_start, r.dec_u, r.dec_v, r.dec_k = now, u, v, k
            end = now + k * u + v * k * (k - 1) / 2
        else:
            r.mode = IDLE
            return
        self.push_event(end, ri, r.version)

    def finish(self, req: SimRequest) -> None:
        self.scale_finished[0] += 1
        self.scale_finished[1] += req.output

    def end_prefill(self, r: SimReplica, now: float) -> None:
        for req in r.prefill_batch:
            req.ttft_s = now - req.arrival_s
            if self.scaler is not None:
                self.scale_first.append((req.ttft_s, req.prompt, req.arrival_s))
            if self.caching and req.hashes:
                self.insert_blocks(r, req)
            if req.output == 1:
                req.e2e_s = req.ttft_s
                r.kv_used -= req.kv_need
                self.finish(req)
            else:
                heapq.heappush(r.running, (r.steps_done + req.output - 1, req.idx, req))
                r.ctx_tokens += req.prompt + 1
        r.prefill_batch = []
        r.prefill_tokens = 0

    def end_decode(self, r: SimReplica, now: float) -> None:
        k = r.dec_k
        self.decoded_tokens += len(r.running) * k
        r.steps_done += k
        r.ctx_tokens += len(r.running) * k
        running = r.running
        while running and running[0][0] <= r.steps_done:
            _, _, req = heapq.heappop(running)
            req.e2e_s = now - req.arrival_s
            r.kv_used -= req.kv_need
            r.ctx_tokens -= req.prompt + req.output
            self.finish(req)

    def iteration_end(self, r: SimReplica, ri: int, now: float) -> None:
        self.last_event_s = now
        if r.mode == PREFILL:
            self.end_prefill(r, now)
        elif r.mode == DECODE:
            self.end_decode(r, now)
        if self.held:
            # The router sees the boundary (KV freed, batch done) and may release held requests,
            # to this replica or another, before this replica schedules its next iteration.
            r.mode = BOUNDARY
            self.release_held(now)
        self.schedule(r, ri, now)
        if r.phase == DRAINING and r.mode == IDLE and not r.queue:
            self.retire(r, now)

    @staticmethod
    def retire(r: SimReplica, now: float) -> None:
        r.phase = RETIRED
        r.ended_s = now

    def run_events_until(self, t: float) -> None:
        # Iteration ends at the same instant as an arrival are processed first.
        events, reps = self.events, self.reps
        while events and events[0][0] <= t:
            end, _, ri, ver = heapq.heappop(events)
            r = reps[ri]
            if ver == r.version:
                self.iteration_end(r, ri, end)

    # --- what the router sees, and its decisions ------------------------------------------

    def tick_until(self, now: float) -> None:
        source = self.forecast_source
        if source is None:
            return
        while self.next_tick <= now:
            snaps = [
                ReplicaSnapshot(
                    replica_id=self.ids[i],
                    kv_used_tokens=self.reps[i].kv_used,
                    arrivals_since_last_tick=self.arrivals_tick[i],
                )
                for i in self.live
            ]
            self.arrivals_tick = [0] * len(self.reps)
            self.forecast = source.observe(self.next_tick, snaps)
            self.next_tick += self.tick_s

    def observe(self) -> list[ReplicaState]:
        cap = self.p.kv_capacity_tokens
        return [
            ReplicaState(
                replica_id=r.name,
                waiting=len(r.queue),
                running=len(r.running) + len(r.prefill_batch),
                prefill_tokens_waiting=r.queued_tokens,
                prefill_tokens_in_progress=r.prefill_tokens,
                kv_used_tokens=r.kv_used,
                kv_capacity_tokens=cap,
            )
            for r in (self.reps[i] for i in self.live)
        ]

    def dispatch(
        self, req: SimRequest, decision: Decision, states: list[ReplicaState], now: float
    ) -> None:
        ri = self.live[decision.replica_index]
        self.reasons[decision.reason.value] += 1
        self.arrivals_tick[ri] += 1
        self.replica_of[req.idx] = ri
        if self.on_decision is not None:
            self.on_decision(req.idx, states[decision.replica_index])
        r = self.reps[ri]
        was_empty = not r.queue
        r.queue.append(req)
        r.queued_tokens += req.prompt
        if r.mode == IDLE:
            self.schedule(r, ri, now)
        elif (
            r.mode == DECODE
            and was_empty
            and req.kv_need <= self.p.kv_capacity_tokens - r.kv_used
            and len(r.running) < self.p.max_num_seqs
        ):
            self.cut_decode(r, ri, now)
        # PREFILL and BOUNDARY replicas schedule their queue when the iteration ends.

    def cut_decode(self, r: SimReplica, ri: int, now: float) -> None:
        """Admissible now: stop the run of decode steps at the next step boundary."""
        j = steps_within(r.dec_u, r.dec_v, now - r.dec_start) + 1
        if j < r.dec_k:
            r.dec_k = j
            r.version += 1
            end = r.dec_start + j * r.dec_u + r.dec_v * j * (j - 1) / 2
            self.push_event(end, ri, r.version)

    def release_held(self, now: float) -> None:
        # The router's queue is ordered by the policy's hold key (arrival order on ties; FCFS
        # when the key is constant); its head blocks the rest, as a replica's does.
        holding, held = self.holding, self.held
        assert holding is not None
        self.tick_until(now)
        while held:
            req = held[0][2]
            states = self.observe()
            decision = holding.release(
                RouteRequest(prompt_tokens=req.prompt, prefix_hashes=req.hashes),
                states,
                self.forecast,
                now,
            )
            if decision is None:
                return
            heapq.heappop(held)
            req.hold_s = now - req.arrival_s
            self.dispatch(req, decision, states, now)

    # --- the fleet's size -----------------------------------------------------------------

    def fleet_observation(self, now: float, starting: int, draining: int) -> FleetObservation:
        obs = FleetObservation(
            now_s=now,
            ready=tuple(self.observe()),
            starting=starting,
            draining=draining,
            arrivals=tuple(self.scale_arrivals),
            finished=self.scale_finished[0],
            finished_output_tokens=self.scale_finished[1],
            kv_used_tokens=sum(r.kv_used for r in self.reps if r.phase != RETIRED),
            first_tokens=tuple(self.scale_first),
            decoded_tokens_total=self.decoded_tokens
            + sum(
                len(r.running) * min(steps_within(r.dec_u, r.dec_v, now - r.dec_start), r.dec_k)
                for r in self.reps
                if r.mode == DECODE
            ),
        )
        self.scale_first.clear()
        self.scale_arrivals.clear()
        self.scale_finished[0] = self.scale_finished[1] = 0
        return obs

    def scale_decision(self, now: float) -> None:
        assert self.scaler is not None
        reps = self.reps
        starting = [i for i, r in enumerate(reps) if r.phase == STARTING]
        draining = [i for i, r in enumerate(reps) if r.phase == DRAINING]
        obs = self.fleet_observation(now, len(starting), len(draining))
        want = max(1, min(self.max_replicas, self.scaler.desired(obs)))
        have = len(self.live) + len(starting)
        if have < want:
            have = self.grow(now, have, want, draining)
        if have > want:
            have = self.shrink(now, have, want, starting)
        self.timeline.append((now, have))

    def grow(self, now: float, have: int, want: int, draining: list[int]) -> int:
        reps = self.reps
        while have < want and draining:
            # A draining replica is warm: take it back before paying for a start-up.
            ri = max(draining, key=lambda i: reps[i].kv_used)
            draining.remove(ri)
            reps[ri].phase = READY
            self.live.append(ri)
            have += 1
        while have < want:
            ri = len(reps)
            reps.append(SimReplica(f"r{ri}", started_s=now, phase=STARTING))
            self.ids.append(reps[ri].name)
            self.arrivals_tick.append(0)
            startup = self.startup_s[self.started % len(self.startup_s)]
            self.started += 1
            heapq.heappush(self.pending, (now + startup, ri))
            have += 1
        return have

    def shrink(self, now: float, have: int, want: int, starting: list[int]) -> int:
        reps, live = self.reps, self.live
        while have > want and starting:
            self.retire(reps[starting.pop()], now)  # the newest start-up is furthest from ready
            have -= 1
        while have > want and len(live) > 1:
            ri = min(live, key=lambda i: (len(reps[i].queue) + len(reps[i].running), -i))
            live.remove(ri)
            r = reps[ri]
            r.phase = DRAINING
            if r.mode == IDLE and not r.queue:
                self.retire(r, now)
            have -= 1
        return have

    def advance(self, now: float) -> None:
        """Process iteration ends, replicas becoming ready and scaler ticks up to `now`."""
        pending = self.pending
        while True:
            ready_at = pending[0][0] if pending else math.inf
            t = min(self.next_scale, ready_at)
            if t > now:
                break
            self.run_events_until(t)
            if ready_at <= self.next_scale:
                _, ri = heapq.heappop(pending)
                if self.reps[ri].phase == STARTING:
                    self.reps[ri].phase = READY
                    self.live.append(ri)
            else:
                self.scale_decision(t)
                self.next_scale += self.scaler.tick_s if self.scaler is not None else math.inf
        self.run_events_until(now)

    # --- the replay -----------------------------------------------------------------------

    def arrive(self, req: SimRequest) -> None:
        now = req.arrival_s
        self.advance(now)
        self.tick_until(now)
        self.last_event_s = max(self.last_event_s, now)
        if self.scaler is not None:
            self.scale_arrivals.append((now, req.prompt))
        if req.kv_need > self.p.kv_capacity_tokens:
            # Could never be admitted anywhere: an engine rejects it at validation.
            self.rejected += 1
            return
        if self.holding is not None:
            key = self.holding.hold_key(RouteRequest(prompt_tokens=req.prompt), now)
            heapq.heappush(self.held, (key, req.idx, req))
            self.release_held(now)
            return
        states = self.observe()
        decision = self.policy.choose(
            RouteRequest(prompt_tokens=req.prompt, prefix_hashes=req.hashes),
            states,
            self.forecast,
            now,
        )
        self.dispatch(req, decision, states, now)

    def run(self) -> SimResult:
        for req in self.reqs:
            self.arrive(req)
        self.run_events_until(math.inf)
        if self.held:
            raise RuntimeError(
                f"policy {self.policy.name!r} still holds {len(self.held)} requests with every "
                "replica idle"
            )
        end_s = self.last_event_s
        reqs = self.reqs
        replica_seconds = sum(
            (end_s if math.isnan(r.ended_s) else r.ended_s) - r.started_s for r in self.reps
        )
        return SimResult(
            replica_seconds=replica_seconds,
            fleet_timeline=tuple(self.timeline),
            ttft_s=tuple(q.ttft_s for q in reqs),
            e2e_s=tuple(q.e2e_s for q in reqs),
            replica_of=tuple(self.replica_of),
            reasons=self.reasons,
            max_kv_used_frac=self.max_kv / self.p.kv_capacity_tokens,
            rejected=self.rejected,
            prefix_hit_tokens=sum(q.cached for q in reqs),
            prompt_tokens=sum(q.prompt for q in reqs if not math.isnan(q.ttft_s)),
            hold_s=tuple(q.hold_s for q in reqs),
            admit_s=tuple(q.admit_s for q in reqs),
        )
