"""Streaming feature builder: request arrivals and telemetry samples in, one feature row out.

Owns the definition of every forecast feature and the one piece of code that computes them, so
the router (online, one row per decision) and training (offline, one row per second of history)
cannot drift apart. It must not read a clock, do I/O or know about models: callers pass times in.

Time is cut into one-second bins on a grid anchored at ``origin_s``; bin ``k`` holds arrivals in
``[origin_s + k, origin_s + k + 1)``. A row computed at ``now_s`` uses only the *completed* bins
(those ending at or before ``now_s``) and telemetry samples stamped at or before ``now_s``. That
is the no-leakage rule: nothing after ``now_s`` can change a row. Arrivals in the still-open bin
wait for the bin to close; on a one-second grid that costs at most one second of staleness.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

__all__ = [
    "COUNT_WINDOWS_S",
    "EWM_HALF_LIVES_S",
    "FEATURE_NAMES",
    "FEATURE_SCHEMA_VERSION",
    "FeatureBuilder",
    "TelemetrySample",
]

# Bumped whenever a feature is added, removed, reordered or redefined; a model trained on one
# schema must not be fed rows of another (the model object checks this on load).
FEATURE_SCHEMA_VERSION = 1

# Multi-scale trailing windows. Bursty arrivals are better predicted by a mix of short windows
# (is a burst on now?) and long ones (what is the level it decays back to?).
COUNT_WINDOWS_S: tuple[int, ...] = (5, 10, 20, 30, 60, 120, 300)
LAG_BINS: int = 6  # last six one-second counts: catch sub-10-s periodicity (quantised clocks)
EWM_HALF_LIVES_S: tuple[float, ...] = (3.0, 10.0, 30.0, 120.0, 600.0)
TOKEN_WINDOWS_S: tuple[int, ...] = (10, 60, 300)
STD_WINDOWS_S: tuple[int, ...] = (30, 120)
ZERO_WINDOW_S = 60
TELEMETRY_SLOPE_WINDOW_S = 30.0

# Ring length: enough for the longest window plus headroom; a power of two keeps indexing cheap.
_RING = 512
_LONGEST = max(max(COUNT_WINDOWS_S), max(TOKEN_WINDOWS_S), max(STD_WINDOWS_S), ZERO_WINDOW_S)
assert _LONGEST + LAG_BINS < _RING

FEATURE_NAMES: tuple[str, ...] = (
    *(f"count_lag{i}" for i in range(1, LAG_BINS + 1)),
    *(f"rate_{w}s" for w in COUNT_WINDOWS_S),
    *(f"ewm_rate_hl{int(h)}s" for h in EWM_HALF_LIVES_S),
    *(f"ctx_tokens_per_s_{w}s" for w in TOKEN_WINDOWS_S),
    *(f"gen_tokens_per_s_{w}s" for w in TOKEN_WINDOWS_S),
    "tokens_per_request_60s",
    *(f"count_std_{w}s" for w in STD_WINDOWS_S),
    f"zero_bins_frac_{ZERO_WINDOW_S}s",
    "ratio_rate_10s_120s",
    "ratio_rate_60s_300s",
    "ratio_ewm_hl10s_hl120s",
    "since_last_arrival_s",
    "time_of_day_sin",
    "time_of_day_cos",
    "kv_occupancy_frac",
    "kv_occupancy_slope_per_s",
    "mem_alloc_mib_per_s",
    "queue_depth",
    "in_flight_tokens",
)
N_FEATURES = len(FEATURE_NAMES)

_NAN = math.nan
_DAY_S = 86_400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TelemetrySample:
    """One telemetry reading for the forecast target (a replica or a model); None = not reported.

    ``kv_occupancy_frac`` is KV-cache blocks used / total (what must be forecast: servers that
    preallocate the KV pool show flat device memory). ``mem_used_mib`` is device memory used; its
    allocation rate is derived here. ``in_flight_tokens`` is prompt + generated tokens of requests
    admitted and not finished, if the server reports it.
    """

    sample_s: float
    kv_occupancy_frac: float | None = None
    mem_used_mib: float | None = None
    queue_depth: float | None = None
    in_flight_tokens: float | None = None


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0.0 else _NAN


class FeatureBuilder:
    """Fed in time order with arrivals and samples; ``row_at(now_s)`` returns the feature row.

    ``with_time_of_day`` switches the time-of-day features on; leave it off unless the training
    history spans days, since on an hour of history time of day is only a disguised time index
    that trees would split on and then extrapolate.
    """

    __slots__ = (
        "_cum_count",
        "_cum_ctx",
        "_cum_gen",
        "_cum_sq",
        "_cum_zero",
        "_done",
        "_ewm",
        "_ewm_decay",
        "_last_arrival_s",
        "_last_closed_arrival_s",
        "_open_count",
        "_open_ctx",
        "_open_gen",
        "_samples",
        "_tot",
        "origin_s",
        "with_time_of_day",
    )

    def __init__(self, *, origin_s: float, with_time_of_day: bool = False) -> None:
        if not math.isfinite(origin_s):
            raise ValueError(f"origin_s must be finite, got {origin_s!r}")
        self.origin_s = float(origin_s)
        self.with_time_of_day = with_time_of_day
        self._done = 0  # bins completed: 0 .. _done - 1
        # Cumulative totals at each bin boundary, ring-indexed by bin count: window sums are O(1).
        self._cum_count = [0.0] * _RING
        self._cum_ctx = [0.0] * _RING
        self._cum_gen = [0.0] * _RING
        self._cum_sq = [0.0] * _RING
        self._cum_zero = [0.0] * _RING
        self._tot = [0.0, 0.0, 0.0, 0.0, 0.0]  # count, ctx, gen, count², zero bins
        self._open_count = 0
        self._open_ctx = 0.0
        self._open_gen = 0.0
        self._ewm_decay = tuple(2.0 ** (-1.0 / h) for h in EWM_HALF_LIVES_S)
        # Per half-life: [weighted sum, weight] (bias-corrected like pandas' adjust=True).
        self._ewm = [[0.0, 0.0] for _ in EWM_HALF_LIVES_S]
        self._last_arrival_s = _NAN  # latest arrival seen, possibly in the open bin
        self._last_closed_arrival_s = _NAN  # latest arrival in a completed bin
        self._samples: deque[TelemetrySample] = deque()

    # -- input ---------------------------------------------------------------------------------

    @property
    def completed_bins(self) -> int:
        return self._done

    def observe_request(
        self, arrival_s: float, context_tokens: float = 0.0, generated_tokens: float = 0.0
    ) -> None:
        """Record one request arrival. Arrivals must not go back into an already completed bin."""
        k = math.floor(arrival_s - self.origin_s)
        if k < self._done:
            raise ValueError(
                f"arrival_s={arrival_s!r} falls in bin {k}, already completed (next open bin "
                f"{self._done}); arrivals must be fed in time order"
            )
        if k > self._done:
            self._close_until(k)
        self._open_count += 1
        self._open_ctx += float(context_tokens)
        self._open_gen += float(generated_tokens)
        if not arrival_s <= self._last_arrival_s:  # also true while it is NaN
            self._last_arrival_s = float(arrival_s)

    def observe_requests(
        self,
        arrival_s: np.ndarray,
        context_tokens: np.ndarray | None = None,
        generated_tokens: np.ndarray | None = None,
    ) -> None:
        """Batch form of ``observe_request`` (arrays sorted by time)."""
        n = len(arrival_s)
        ctx = np.zeros(n) if context_tokens is None else context_tokens
        gen = np.zeros(n) if generated_tokens is None else generated_tokens
        for a, c, g in zip(arrival_s.tolist(), ctx.tolist(), gen.tolist(), strict=True):
            self.observe_request(a, c, g)

    def observe_sample(self, sample: TelemetrySample) -> None:
        """Record a telemetry sample; samples must come in time order."""
        if self._samples and sample.sample_s < self._samples[-1].sample_s:
            raise ValueError(
                f"sample_s={sample.sample_s!r} is older than the previous sample "
                f"({self._samples[-1].sample_s!r}); samples must be fed in time order"
            )
        self._samples.append(sample)
        # Keep one sample older than the slope window so the slope always has a left anchor.
        horizon = sample.sample_s - TELEMETRY_SLOPE_WINDOW_S
        while len(self._samples) > 1 and self._samples[1].sample_s <= horizon:
            self._samples.popleft()

    # -- bins ----------------------------------------------------------------------------------

    def _close_until(self, k: int) -> None:
        """Complete bins ``_done .. k-1``: the open bin with its arrivals, then empty bins."""
        tot = self._tot
        c = float(self._open_count)
        if self._open_count:
            self._last_closed_arrival_s = self._last_arrival_s
        tot[0] += c
        tot[1] += self._open_ctx
        tot[2] += self._open_gen
        tot[3] += c * c
        tot[4] += 1.0 if c == 0.0 else 0.0
        self._open_count, self._open_ctx, self._open_gen = 0, 0.0, 0.0
        for i, a in enumerate(self._ewm_decay):
            s, w = self._ewm[i]
            self._ewm[i] = [a * s + (1.0 - a) * c, a * w + (1.0 - a)]
        self._done += 1
        self._store(self._done % _RING)
        gap = k - self._done
        if gap <= 0:
            return
        # A run of empty bins: closed form for the EWMs; only the last _RING boundaries matter.
        for i, a in enumerate(self._ewm_decay):
            s, w = self._ewm[i]
            d = a**gap
            self._ewm[i] = [s * d, w * d + (1.0 - d)]
        skipped = max(gap - _RING, 0)
        tot[4] += skipped
        for b in range(self._done + skipped + 1, k + 1):
            tot[4] += 1.0
            self._store(b % _RING)
        self._done = k

    def _store(self, idx: int) -> None:
        tot = self._tot
        self._cum_count[idx] = tot[0]
        self._cum_ctx[idx] = tot[1]
        self._cum_gen[idx] = tot[2]
        self._cum_sq[idx] = tot[3]
        self._cum_zero[idx] = tot[4]

    # -- output --------------------------------------------------------------------------------

    def row_at(self, now_s: float, out: np.ndarray | None = None) -> np.ndarray:
        """Feature row at ``now_s`` (float64, ``FEATURE_NAMES`` order); NaN marks missing values.

        Completes every bin that ends at or before ``now_s``, so later arrivals must be later
        than ``origin_s + completed_bins``. Writes into ``out`` when given (no allocation).
        """
        k = math.floor(now_s - self.origin_s)
        if k > self._done:
            self._close_until(k)
        row = np.empty(N_FEATURES) if out is None else out
        # Each part writes its features from index j on and returns where the next one starts.
        j, rates, ewms = self._counts_into(row)
        j = self._tokens_into(row, j)
        j = self._spread_into(row, j)
        row[j] = _ratio(rates[10], rates[120])
        row[j + 1] = _ratio(rates[60], rates[300])
        row[j + 2] = _ratio(ewms[1], ewms[3])
        j += 3
        row[j] = now_s - self._last_closed_arrival_s  # NaN until the first arrival's bin closes
        j += 1
        if self.with_time_of_day:
            phase = 2.0 * math.pi * ((now_s % _DAY_S) / _DAY_S)
            row[j], row[j + 1] = math.sin(phase), math.cos(phase)
        else:
            row[j] = row[j + 1] = _NAN
        j += 2
        self._telemetry_into(now_s, row, j)
        return row

    def _counts_into(self, row: np.ndarray) -> tuple[int, dict[int, float], list[float]]:
        """Lagged counts, trailing rates and EWM rates; returns the next index, the rates by
        window and the EWMs (the ratio features are built from them)."""
        n = self._done
        r = _RING
        cc = self._cum_count
        j = 0
        for lag in range(1, LAG_BINS + 1):
            row[j] = cc[(n - lag + 1) % r] - cc[(n - lag) % r] if n >= lag else _NAN
            j += 1
        c_top = cc[n % r]
        rates = {}
        for w in COUNT_WINDOWS_S:
            m = min(w, n)
            v = (c_top - cc[(n - m) % r]) / m if m > 0 else _NAN
            rates[w] = v
            row[j] = v
            j += 1
        ewms = []
        for s, wt in self._ewm:
            v = s / wt if wt > 0.0 else _NAN
            ewms.append(v)
            row[j] = v
            j += 1
        return j, rates, ewms

    def _tokens_into(self, row: np.ndarray, j: int) -> int:
        """Context and generated tokens per second over each token window, and tokens per
        request over the last minute."""
        n = self._done
        r = _RING
        top = n % r
        cc, cx, cg = self._cum_count, self._cum_ctx, self._cum_gen
        for cum in (cx, cg):
            t_top = cum[top]
            for w in TOKEN_WINDOWS_S:
                m = min(w, n)
                row[j] = (t_top - cum[(n - m) % r]) / m if m > 0 else _NAN
                j += 1
        m = min(60, n)
        if m > 0:
            lo = (n - m) % r
            cnt = cc[top] - cc[lo]
            row[j] = _ratio(cx[top] - cx[lo] + cg[top] - cg[lo], cnt)
        else:
            row[j] = _NAN
        return j + 1

    def _spread_into(self, row: np.ndarray, j: int) -> int:
        """Standard deviation of the per-second counts over each window, and the share of empty
        bins over the last `ZERO_WINDOW_S`."""
        n = self._done
        r = _RING
        top = n % r
        cc, cq, cz = self._cum_count, self._cum_sq, self._cum_zero
        c_top, q_top = cc[top], cq[top]
        for w in STD_WINDOWS_S:
            m = min(w, n)
            if m > 1:
                lo = (n - m) % r
                mean = (c_top - cc[lo]) / m
                var = (q_top - cq[lo]) / m - mean * mean
                row[j] = math.sqrt(var) if var > 0.0 else 0.0
            else:
                row[j] = _NAN
            j += 1
        m = min(ZERO_WINDOW_S, n)
        row[j] = (cz[top] - cz[(n - m) % r]) / m if m > 0 else _NAN
        return j + 1

    def _telemetry_into(self, now_s: float, row: np.ndarray, j: int) -> None:
        kv = queue = inflight = _NAN
        kv_slope = mem_rate = _NAN
        latest: TelemetrySample | None = None
        for smp in reversed(self._samples):
            if smp.sample_s <= now_s:
                latest = smp
                break
        if latest is not None:
            kv = _NAN if latest.kv_occupancy_frac is None else latest.kv_occupancy_frac
            queue = _NAN if latest.queue_depth is None else latest.queue_depth
            inflight = _NAN if latest.in_flight_tokens is None else latest.in_flight_tokens
            # Left anchor: the oldest retained sample at least one slope window back, else oldest.
            anchor = self._samples[0]
            dt = latest.sample_s - anchor.sample_s
            if dt > 0.0:
                if latest.kv_occupancy_frac is not None and anchor.kv_occupancy_frac is not None:
                    kv_slope = (latest.kv_occupancy_frac - anchor.kv_occupancy_frac) / dt
                if latest.mem_used_mib is not None and anchor.mem_used_mib is not None:
                    mem_rate = (latest.mem_used_mib - anchor.mem_used_mib) / dt
        row[j] = kv
        row[j + 1] = kv_slope
        row[j + 2] = mem_rate
        row[j + 3] = queue
        row[j + 4] = inflight
