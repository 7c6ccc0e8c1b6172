"""Seedance's routing policy: lowest predicted time to first token, steering clear of replicas
whose KV cache has no headroom now or in the forecast, with least-outstanding as the fallback.

For each replica it estimates the request's TTFT on a prefill-first continuous-batching engine:
the prompt work queued ahead of it plus its own uncached prompt at the replica's prefill rate,
plus a wait for KV space when the replica cannot reserve the request's tokens. The uncached part
comes from an approximate prefix index the policy keeps of the prefix blocks it has sent to each
replica (the approximate mode of SGLang's cache-aware router and llm-d's prefix scorer: no
engine events needed), bounded per replica by its KV pool and evicted least recently used.
A replica whose projected KV use (now, or forecast 5 s ahead) would pass the high-water mark is
ranked after every replica with headroom. When the forecast is missing or older than
`max_forecast_age_s` the policy does exactly what least-outstanding does, and says so in the
decision's reason.

Must not do: I/O, clocks, learning; the replica profile (prefill rate, step time) comes in
through `PredictiveConfig`, measured on the replica's hardware, never fitted to a trace.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from seedance.router.core.policy.baselines import least_outstanding_index
from seedance.router.core.policy.state import (
    Decision,
    Forecast,
    Reason,
    ReplicaForecast,
    ReplicaState,
    RouteRequest,
)

__all__ = ["PredictiveConfig", "PredictiveSloPolicy", "PrefixIndex"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PredictiveConfig:
    """The replica profile and the policy's few knobs (fixed a priori, not per trace)."""

    prefill_tokens_per_s: float
    prefill_overhead_s: float
    decode_step_s: float
    # Output length is unknown at routing time; the KV estimate reserves this many tokens.
    # 256 is vLLM benchmark_serving's default `--random-output-len` scale, not a trace fit.
    expected_output_tokens: int = 256
    max_forecast_age_s: float = 5.0
    # Projected KV use above this fraction of the pool counts as exhaustion risk.
    kv_high_water_frac: float = 0.95
    ttft_slo_s: float = 2.0
    # Replicas whose predicted TTFT is within this of the best count as equally good for the
    # SLO; among them the one with the least decode load (running now plus forecast arrivals
    # over the next 5 s) wins, so TTFT-greedy routing does not pile decode onto one replica.
    ttft_tie_s: float = 0.2
    # Tokens per prefix block of `RouteRequest.prefix_hashes` (Mooncake's hash_ids: 512).
    prefix_block_tokens: int = 512


class PrefixIndex:
    """Which replica was last sent which prefix blocks: one LRU per replica, capped at the blocks
    its KV pool holds, plus a block -> replica-bitmask map so a lookup walks the request's blocks
    once, whatever the fleet size. Approximate: it mirrors routing, not the engines' caches.
    """

    def __init__(self) -> None:
        self._bit: dict[str, int] = {}
        self._owners: dict[int, int] = {}
        self._lru: list[OrderedDict[int, None]] = []

    def _slot(self, replica_id: str) -> int:
        slot = self._bit.get(replica_id)
        if slot is None:
            slot = self._bit[replica_id] = len(self._lru)
            self._lru.append(OrderedDict())
        return slot

    def matched_blocks(self, hashes: Sequence[int], replica_ids: Sequence[str]) -> list[int]:
        """Leading blocks of `hashes` recorded for each replica, in `replica_ids` order."""
        slots = [self._slot(r) for r in replica_ids]
        depth = dict.fromkeys(slots, len(hashes))
        alive = 0
        for s in slots:
            alive |= 1 << s
        owners = self._owners
        for d, h in enumerate(hashes):
            held = owners.get(h, 0) & alive
            dropped = alive & ~held
            while dropped:
                low = dropped & -dropped
                depth[low.bit_length() - 1] = d
                dropped ^= low
            alive = held
            if not alive:
                break
        return [depth[s] for s in slots]

    def record(self, replica_id: str, hashes: Sequence[int], capacity_blocks: int) -> None:
        """Note that `replica_id` now holds `hashes`; evict its least recently used beyond cap."""
        slot = self._slot(replica_id)
        bit = 1 << slot
        lru = self._lru[slot]
        owners = self._owners
        for h in hashes:
            lru[h] = None
            lru.move_to_end(h)
            owners[h] = owners.get(h, 0) | bit
        while len(lru) > capacity_blocks:
            h, _ = lru.popitem(last=False)
            left = owners[h] & ~bit
            if left:
                owners[h] = left
            else:
                del owners[h]


class PredictiveSloPolicy:
    """Minimises predicted TTFT; avoids KV exhaustion; falls back on stale forecasts."""

    name = "predictive_slo"

    def __init__(self, config: PredictiveConfig) -> None:
        self._cfg = config
        self._s_per_token = 1.0 / config.prefill_tokens_per_s
        self._prefix = PrefixIndex()

    def predicted_ttft_s(
        self, request: RouteRequest, s: ReplicaState, cached_tokens: int = 0
    ) -> float:
        """TTFT if `request` joins replica `s` now, assuming FCFS prefill-first scheduling and
        `cached_tokens` of its prompt already in that replica's prefix cache."""
        cfg = self._cfg
        tokens_ahead = s.prefill_tokens_waiting + s.prefill_tokens_in_progress
        own = max(request.prompt_tokens - cached_tokens, 1)
        # One prefill iteration's fixed cost per waiting request is an upper bound (several
        # short prompts share an iteration); it keeps deep queues of tiny prompts honest.
        ttft = (tokens_ahead + own) * self._s_per_token + (s.waiting + 1) * cfg.prefill_overhead_s
        deficit = self._kv_projected(request, s) - s.kv_capacity_tokens
        if deficit > 0:
            # Tokens are freed as running requests finish; a running request lives about
            # expected_output_tokens decode steps, so the pool drains kv_used per that time.
            drain_s = cfg.expected_output_tokens * cfg.decode_step_s
            ttft += drain_s * deficit / max(s.kv_used_tokens, 1)
        return ttft

    def _kv_projected(self, request: RouteRequest, s: ReplicaState) -> int:
        out = self._cfg.expected_output_tokens
        return (
            s.kv_used_tokens
            + s.prefill_tokens_waiting
            + s.waiting * out
            + request.prompt_tokens
            + out
        )

    def choose(
        self,
        request: RouteRequest,
        replicas: Sequence[ReplicaState],
        forecast: Forecast | None,
        now_s: float,
    ) -> Decision:
        cfg = self._cfg
        if forecast is None:
            return Decision(
                replica_index=least_outstanding_index(replicas),
                reason=Reason.FALLBACK_NO_FORECAST,
            )
        if now_s - forecast.made_at_s > cfg.max_forecast_age_s:
            return Decision(
                replica_index=least_outstanding_index(replicas),
                reason=Reason.FALLBACK_STALE_FORECAST,
            )
        decision = self._choose(request, replicas, forecast, now_s)
        if request.prefix_hashes:
            chosen = replicas[decision.replica_index]
            self._prefix.record(
                chosen.replica_id,
                request.prefix_hashes,
                chosen.kv_capacity_tokens // cfg.prefix_block_tokens,
            )
        return decision

    def _choose(
        self,
        request: RouteRequest,
        replicas: Sequence[ReplicaState],
        forecast: Forecast,
        now_s: float,
    ) -> Decision:
        cfg = self._cfg
        fc_map = forecast.replicas
        n = len(replicas)
        cached = self._cached_tokens(request, replicas)
        safe = self._kv_safe(request, replicas, fc_map)
        ttfts = [0.0] * n
        best_i = best_safe_i = -1
        best = best_safe = float("inf")
        for i, s in enumerate(replicas):
            ttft = self.predicted_ttft_s(request, s, cached[i])
            ttfts[i] = ttft
            if ttft < best:
                best, best_i = ttft, i
            if safe[i] and ttft < best_safe:
                best_safe, best_safe_i = ttft, i
        if best_safe_i >= 0 and cfg.ttft_tie_s > 0:
            best_safe_i = _least_loaded(
                replicas, fc_map, safe, ttfts, best_safe + cfg.ttft_tie_s, best_safe_i
            )
        if best_safe_i < 0:
            # Every replica is at risk: the least bad TTFT (which includes the KV wait) wins.
            return Decision(
                replica_index=best_i, reason=Reason.PREDICTED_SLO, predicted_ttft_s=best
            )
        # KV_HEADROOM: the replica with the lowest predicted TTFT was passed over for KV risk.
        reason = Reason.PREDICTED_SLO if safe[best_i] else Reason.KV_HEADROOM
        return Decision(
            replica_index=best_safe_i, reason=reason, predicted_ttft_s=ttfts[best_safe_i]
        )

    def _cached_tokens(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> list[int]:
        """Prompt tokens of `request` already in each replica's prefix cache (as the index
        mirrors it); at least one token is always left to prefill."""
        if not request.prefix_hashes:
            return [0] * len(replicas)
        block = self._cfg.prefix_block_tokens
        blocks = self._prefix.matched_blocks(
            request.prefix_hashes, [s.replica_id for s in replicas]
        )
        return [min(b * block, request.prompt_tokens - 1) for b in blocks]

    def _kv_safe(
        self,
        request: RouteRequest,
        replicas: Sequence[ReplicaState],
        fc_map: Mapping[str, ReplicaForecast],
    ) -> list[bool]:
        """Per replica, whether `request` there stays under the KV high-water mark, now and in
        the forecast (one call per decision, not per replica: this is the hot path)."""
        cfg = self._cfg
        need = request.prompt_tokens + cfg.expected_output_tokens
        safe = []
        for s in replicas:
            high_water = cfg.kv_high_water_frac * s.kv_capacity_tokens
            risky = self._kv_projected(request, s) > high_water
            fc = fc_map.get(s.replica_id)
            if fc is None:
                # A replica without a forecast gets no benefit of the doubt on KV.
                risky = risky or s.kv_used_tokens + need > high_water
            elif fc.kv_used_tokens_5s + need > high_water:
                risky = True
            safe.append(not risky)
        return safe


def _least_loaded(
    replicas: Sequence[ReplicaState],
    fc_map: Mapping[str, ReplicaForecast],
    safe: Sequence[bool],
    ttfts: Sequence[float],
    limit_s: float,
    default_i: int,
) -> int:
    """Among the safe replicas predicted within `limit_s`, the one with the least decode load
    (running now plus forecast arrivals over the next 5 s); `default_i` if none is lighter."""
    chosen, load_best = default_i, float("inf")
    for i, s in enumerate(replicas):
        if safe[i] and ttfts[i] <= limit_s:
            fc = fc_map.get(s.replica_id)
            load = s.running + s.waiting + (5.0 * fc.qps_5s if fc is not None else 0.0)
            if load < load_best:
                load_best, chosen = load, i
    return chosen
