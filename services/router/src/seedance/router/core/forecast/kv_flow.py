"""KV occupancy forecast by a flow model of the server: batch slots, a FIFO queue, output lengths.

Owns the physical KV head and nothing else. At ``t`` it reads only ``RequestLog.observable_at(t)``
(the causal view of ``kv_occupancy``), the KV in use at t, and optionally the server's own counts
at t (running, queued, arrivals per second), and computes the expected change of KV in use by
``t + H``:

* each running request survives to ``t + H`` with P(output > decoded by t + H | output > decoded
  by t); decoded so far = 1 + (t − first token) / the decode step of recently finished requests,
  or, where the server reports its decode-token counter (``DecodeClock``), 1 + the tokens one
  sequence decoded between the first token and t (see ``DecodeClock`` for why). The step ahead
  is the finished requests' either way.
  The output-length survival is a Kaplan–Meier curve of the view (finished requests are events,
  running ones censored at what they have decoded: no in-flight output length is read), one per
  prompt-size class, because output length depends on the prompt (in the conversation trace
  short prompts get short answers and so do very long ones, and a batch's survivors are the long
  answers: one curve for all over-states their prompts by ~10 %);
* the slots they free are filled from the queue head in arrival order (FIFO), then by expected
  arrivals at the recent rate and class mix; an admitted request survives the same way after a
  prefill delay (the recent median). The batch is capped at ``max_batch`` sequences: a
  saturated plateau is a queue, and the queue is what the next minute's batch is made of;
* a request holds prompt + its whole output from admission when the server reserves the output
  (``reserves_output``), else prompt + decoded so far; ``mib_per_token`` converts.

``fit_kv_flow_params`` learns the cap, the reservation mode and the MiB per token on a training
span, from requests finished by its end; ``choose_change_weight`` the weight of the change
(1 = the model as is, 0 = the last value) on the same span. The
forecast is the KV in use at t plus the weighted change, so requests the log does not list do
not bias its level. No clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from seedance.router.core.forecast.kv_clock import DecodeClock
from seedance.router.core.forecast.kv_occupancy import ObservedRequests, RequestLog, decode_step_s

__all__ = [
    "KvFlowParams",
    "KvModeFit",
    "ServerCounts",
    "arrival_rate_window_s",
    "choose_change_weight",
    "expected_kv_change_tokens",
    "fit_kv_flow_params",
    "fit_kv_modes",
    "forecast_kv_mib",
    "has_seen_a_batch",
    "kv_pool_bound",
    "output_survival",
    "prefill_delay_s",
]

# The model's time step: finer than matters against a 5-s horizon, coarse enough for 30 s.
_DT_S = 0.25
# Arrivals and prompts of the recent past stand for the next ones.
_RECENT_S = 30.0
_DEFAULT_PREFILL_S = 0.05
# A prompt class needs this many finished requests for its own survival curve.
# The model speaks once this many requests have finished (and at least a batch, see
# ``has_seen_a_batch``).
_MIN_FINISHED = 50

# A server is bound by its KV pool when the median KV in use while requests wait is within
# this share of the most KV seen (``kv_pool_bound``). On the simulated pool-bound servers of
# ``seedance.bench.kv_proxies`` it is 0.993-0.996; on the H200 recording, bound by its 256
# sequences, 0.891-0.934 over nine train/test splits (the batch's prompts and outputs vary;
# nothing pins KV); on the simulated Mooncake one (19 long prompts at once) 0.923-0.940.
POOL_BOUND_SHARE = 0.98

# The weights of the change ``choose_change_weight`` tries, besides 0 (the last value): on the
# H200 recording the model's change correlates 0.7 with the real one, with a spread as large as
# the real one's, so a shrunk change can score better than the whole one.
CHANGE_WEIGHTS: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
# A weight must beat the last value by this much on the training span (as ``kv_occupancy``'s
# online head: a margin against the luck of the best of several choices).
SELECTION_MARGIN = 0.005


@dataclass(frozen=True, slots=True, kw_only=True)
class KvFlowParams:
    """What the flow model knows about the server (``fit_kv_flow_params``) and how it is used."""

    max_batch: int
    reserves_output: bool
    mib_per_token: float
    change_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"KvFlowParams.max_batch: {self.max_batch} (must be >= 1)")
        if not self.mib_per_token > 0:
            raise ValueError(f"KvFlowParams.mib_per_token: {self.mib_per_token} (must be > 0)")
        if not 0.0 <= self.change_weight <= 1.0:
            raise ValueError(f"KvFlowParams.change_weight: {self.change_weight} (0..1)")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerCounts:
    """The server's own counts at t, where it reports them (vLLM's running / waiting gauges, a
    completion counter's rate). A log that does not list every request (a recording that kept
    only finished ones) is completed by them: unlisted queued requests get the recent class mix."""

    running: int | None = None
    queued: int | None = None
    arrivals_per_s: float | None = None
    # The decode clock up to t (``DecodeClock.until``), where the server reports its counter.
    decode_clock: DecodeClock | None = None


def _decoded_by_now(
    obs: ObservedRequests, first_s: np.ndarray, step_s: float, clock: DecodeClock | None
) -> np.ndarray:
    """Tokens decoded by ``obs.now_s`` of sequences whose first token was at ``first_s``
    (<= now): 1 + the decode clock between the two where there is one, else their time over
    the step."""
    if clock is None or len(clock.sample_s) == 0:
        return np.asarray(1.0 + (obs.now_s - first_s) / step_s)
    now = clock.tokens(np.array([obs.now_s]), step_s=step_s)[0]
    return np.asarray(1.0 + np.maximum(now - clock.tokens(first_s, step_s=step_s), 0.0))


def output_survival(
    obs: ObservedRequests, *, step_s: float, clock: DecodeClock | None = None
) -> np.ndarray:
    """S[g] = P(output tokens > g), g = 0 .. M + 1, Kaplan–Meier over the view (S[M + 1] = 0).

    Events: finished requests' output lengths. Censored: running requests with a first token, at
    the tokens decoded so far. Without censoring the curve would be the finished requests'
    lengths, biased short while the long ones are still running.
    """
    fin = obs.finished & ~np.isnan(obs.generated_tokens)
    gen = np.maximum(obs.generated_tokens[fin], 1.0).astype(int)
    run = obs.running & ~np.isnan(obs.first_token_s)
    cens = np.floor(_decoded_by_now(obs, obs.first_token_s[run], step_s, clock)).astype(int)
    if gen.size == 0:
        return np.array([1.0, 0.0])  # nothing finished yet: every output one token long
    m = int(max(gen.max(), cens.max(initial=0)))
    deaths = np.bincount(gen, minlength=m + 1).astype(float)
    censored = np.bincount(cens, minlength=m + 1).astype(float)
    at_risk = deaths[::-1].cumsum()[::-1] + censored[::-1].cumsum()[::-1]
    hazard = np.divide(deaths, at_risk, out=np.zeros_like(deaths), where=at_risk > 0)
    hazard[0] = 0.0
    return np.concatenate([np.cumprod(1.0 - hazard), [0.0]])


def prefill_delay_s(obs: ObservedRequests) -> float:
    """Median admission → first token over the last ``_RECENT_S`` (all if fewer than five)."""
    seen = ~np.isnan(obs.first_token_s) & ~np.isnan(obs.admit_s)
    recent = seen & (obs.first_token_s > obs.now_s - _RECENT_S)
    use = recent if int(recent.sum()) >= 5 else seen
    if not bool(use.any()):
        return _DEFAULT_PREFILL_S
    return float(np.median(obs.first_token_s[use] - obs.admit_s[use]))


@dataclass(frozen=True, slots=True)
class _Curve:
    """S(g) and E[output · 1{output > g}] at fractional g (linear between integers)."""

    s: np.ndarray
    tail: np.ndarray

    @classmethod
    def of(cls, s: np.ndarray) -> _Curve:
        g = np.arange(len(s), dtype=float)
        pmf = np.concatenate([[0.0], s[:-1] - s[1:]])  # pmf[g] = P(output = g)
        tail = (g * pmf)[::-1].cumsum()[::-1]  # sum over k >= g
        return cls(s=s, tail=np.concatenate([tail[1:], [0.0]]))  # sum over k > g

    def alive(self, g: np.ndarray) -> np.ndarray:
        return np.asarray(np.interp(g, np.arange(len(self.s), dtype=float), self.s, right=0.0))

    def tail_mass(self, g: np.ndarray) -> np.ndarray:
        grid = np.arange(len(self.tail), dtype=float)
        return np.asarray(np.interp(g, grid, self.tail, right=0.0))


def _prompt_classes(
    obs: ObservedRequests, step_s: float, clock: DecodeClock | None
) -> tuple[np.ndarray, list[_Curve]]:
    """Each arrived request's class and each class's curve. Classes are quantiles of the
    finished requests' prompts, √(finished) of them with √(finished) outputs each (the
    square-root rule of histogram bins): finer classes bring each curve closer to P(output |
    this prompt), fewer outputs per class make it noisier. On the H200 recording one curve for
    all, or 2–4 classes, over-state the survivors' prompts and lose to the last value; 25–200
    outputs per class all beat it (docs/router.md)."""
    fin = obs.finished & ~np.isnan(obs.generated_tokens)
    n = max(1, math.isqrt(int(fin.sum())))
    edges = (
        np.quantile(obs.context_tokens[fin], np.linspace(0.0, 1.0, n + 1)[1:-1])
        if n > 1
        else np.array([])
    )
    cls = np.searchsorted(edges, obs.context_tokens, side="right")
    curves = [
        _Curve.of(output_survival(obs.subset(cls == b), step_s=step_s, clock=clock))
        for b in range(n)
    ]
    return cls, curves


def _decoded(at_s: np.ndarray, first_s: np.ndarray | float, step_s: float) -> np.ndarray:
    """Tokens decoded by ``at_s`` of a sequence whose first token is at ``first_s`` (0 before)."""
    return np.where(at_s < first_s, 0.0, 1.0 + (at_s - first_s) / step_s)


@dataclass(frozen=True, slots=True)
class _Running:
    """The running requests' part: expected finishes per step and tokens held now / at H."""

    finishes: np.ndarray
    held_now: float
    held_h: float


def _running_part(
    obs: ObservedRequests,
    cls: np.ndarray,
    curves: list[_Curve],
    tau: np.ndarray,
    *,
    step_s: float,
    prefill_s: float,
    reserves_output: bool,
    clock: DecodeClock | None,
) -> _Running:
    run = obs.running
    ctx, c_run = obs.context_tokens[run], cls[run]
    first = obs.first_token_s[run]
    started = ~np.isnan(first)
    first = np.where(started, first, np.maximum(obs.admit_s[run] + prefill_s, obs.now_s))
    dec = _decoded(obs.now_s + tau[None, :], first[:, None], step_s)  # (running, τ)
    # Started sequences: what they decoded by now, then one token per step.
    so_far = _decoded_by_now(obs, first[started], step_s, clock)
    dec[started] = so_far[:, None] + tau[None, :] / step_s
    s_dec = np.empty_like(dec)
    tail_now, tail_h = np.empty(len(ctx)), np.empty(len(ctx))
    for b, c in enumerate(curves):
        m = c_run == b
        s_dec[m] = c.alive(dec[m])
        tail_now[m], tail_h[m] = c.tail_mass(dec[m, 0]), c.tail_mass(dec[m, -1])
    s0 = np.maximum(s_dec[:, 0], 1e-12)
    alive = s_dec / s0[:, None]
    if reserves_output:
        held_now = float((ctx + tail_now / s0).sum())
        held_h = float((ctx * alive[:, -1] + tail_h / s0).sum())
    else:
        held_now = float((ctx + dec[:, 0]).sum())
        held_h = float((alive[:, -1] * (ctx + dec[:, -1])).sum())
    return _Running(finishes=-np.diff(alive.sum(axis=0)), held_now=held_now, held_h=held_h)


class _Queue:
    """The queue in FIFO order: listed requests (known prompts and classes), then unlisted and
    future ones with the recent class mix and per-class mean prompt."""

    def __init__(self, obs: ObservedRequests, cls: np.ndarray, n_cls: int, rate_s: float) -> None:
        q_ctx, q_cls = obs.context_tokens[obs.queued], cls[obs.queued]
        onehot = np.zeros((len(q_ctx), n_cls))
        onehot[np.arange(len(q_ctx)), q_cls] = 1.0
        self.n_listed = len(q_ctx)
        self._cnt = np.vstack([np.zeros(n_cls), np.cumsum(onehot, axis=0)])
        self._ctx = np.vstack([np.zeros(n_cls), np.cumsum(onehot * q_ctx[:, None], axis=0)])
        recent = obs.arrival_s > obs.now_s - _RECENT_S
        self.recent_rate_per_s = float((obs.arrival_s > obs.now_s - rate_s).sum()) / rate_s
        # The mix of the next arrivals: the recent ones', else all arrived so far.
        pool = recent if int(recent.sum()) >= 5 * n_cls else np.ones(len(cls), dtype=bool)
        self._mix = np.bincount(cls[pool], minlength=n_cls) / max(int(pool.sum()), 1)
        self._mean_ctx = np.array(
            [
                float(obs.context_tokens[pool & (cls == b)].mean())
                if bool((pool & (cls == b)).any())
                else 0.0
                for b in range(n_cls)
            ]
        )

    def head(self, n: float) -> tuple[np.ndarray, np.ndarray]:
        """Counts and prompt tokens per class of the first ``n`` entries (fractional)."""
        k = min(n, float(self.n_listed))
        i = math.floor(k)
        j = min(i + 1, self.n_listed)
        cnt = self._cnt[i] + (self._cnt[j] - self._cnt[i]) * (k - i)
        ctx = self._ctx[i] + (self._ctx[j] - self._ctx[i]) * (k - i)
        beyond = max(0.0, n - self.n_listed)
        return cnt + beyond * self._mix, ctx + beyond * self._mix * self._mean_ctx


def arrival_rate_window_s(horizon_s: float) -> float:
    """The trailing window of the arrival rate that stands for the next ``horizon_s``: as long
    as the horizon (at least 5 s). On a server whose load swells and ebbs within a minute a
    30-s rate lags the swell and a 5-s forecast then loses to the last value (1.35× on the
    unit test's server); a 5-s rate is too noisy for 30 s ahead. On the H200 recording the
    queue is thousands deep and no arrival within 30 s is admitted: the window does not matter."""
    return max(5.0, horizon_s)


def expected_kv_change_tokens(
    obs: ObservedRequests,
    params: KvFlowParams,
    *,
    horizon_s: float,
    counts: ServerCounts | None = None,
) -> float:
    """Expected KV tokens held at ``obs.now_s + horizon_s`` minus those held at now_s; 0 (the
    last value) until ``has_seen_a_batch``."""
    if horizon_s <= 0:
        raise ValueError(f"horizon_s: {horizon_s} (must be > 0)")
    counts = counts or ServerCounts()
    if not has_seen_a_batch(obs, counts):
        return 0.0
    clock = counts.decode_clock
    step = decode_step_s(obs)
    if clock is not None and not (len(clock.sample_s) > 0 and clock.agrees_with(obs)):
        clock = None
    prefill = prefill_delay_s(obs)
    cls, curves = _prompt_classes(obs, step, clock)
    n_steps = max(1, math.ceil(horizon_s / _DT_S))
    tau = np.linspace(0.0, horizon_s, n_steps + 1)
    running = _running_part(
        obs,
        cls,
        curves,
        tau,
        step_s=step,
        prefill_s=prefill,
        reserves_output=params.reserves_output,
        clock=clock,
    )
    # One admitted request of each class, by age in steps: first token after the prefill.
    dec_age = _decoded(tau, prefill, step)
    fin_age = -np.diff(np.array([c.alive(dec_age) for c in curves]), axis=1)  # (class, age)

    queue = _Queue(obs, cls, len(curves), arrival_rate_window_s(horizon_s))
    rate = queue.recent_rate_per_s if counts.arrivals_per_s is None else counts.arrivals_per_s
    unlisted = max(0, (counts.queued or 0) - queue.n_listed)
    n_run = int(obs.running.sum())
    free = float(max(0, params.max_batch - max(counts.running or 0, n_run)))
    later = np.zeros(n_steps + 1)  # finishes of requests admitted within the horizon
    adm_cnt, adm_ctx = np.zeros((n_steps, len(curves))), np.zeros((n_steps, len(curves)))
    cum = 0.0
    prev_cnt, prev_ctx = queue.head(0.0)
    for k in range(n_steps):
        free += running.finishes[k] + later[k]
        n_k = max(0.0, min(free, queue.n_listed + unlisted + rate * tau[k + 1] - cum))
        if n_k <= 0.0:
            continue
        free -= n_k
        cum += n_k
        cnt, ctx = queue.head(cum)
        adm_cnt[k], adm_ctx[k] = cnt - prev_cnt, ctx - prev_ctx
        prev_cnt, prev_ctx = cnt, ctx
        later[k + 1 :] += (adm_cnt[k] @ fin_age)[: n_steps - k]

    g_h = dec_age[np.arange(n_steps - 1, -1, -1)]  # admitted at τ_{k+1}: its decoded at H
    alive_h = np.array([c.alive(g_h) for c in curves]).T  # (step, class)
    if params.reserves_output:
        tail_h = np.array([c.tail_mass(g_h) for c in curves]).T
        held_q = float((adm_ctx * alive_h + adm_cnt * tail_h).sum())
    else:
        held_q = float((alive_h * (adm_ctx + adm_cnt * g_h[:, None])).sum())
    return running.held_h + held_q - running.held_now


def has_seen_a_batch(obs: ObservedRequests, counts: ServerCounts | None = None) -> bool:
    """Whether the view holds at least as many finished requests as are running (and
    ``_MIN_FINISHED``): until a whole batch has turned over, the output-length curve is
    the short answers only (the long ones are censored, their tail unknown) and the decode step
    that of a server warming up; on the H200 recording's ramp the model then forecast KV
    falling while it rose. Before that the forecast is the last value."""
    running = int(obs.running.sum())
    if counts is not None and counts.running is not None:
        running = max(running, counts.running)
    return int(obs.finished.sum()) >= max(running, _MIN_FINISHED)


def forecast_kv_mib(
    obs: ObservedRequests,
    params: KvFlowParams,
    *,
    kv_now_mib: float,
    horizon_s: float,
    counts: ServerCounts | None = None,
) -> float:
    """KV in use at ``obs.now_s + horizon_s``: now plus the weighted expected change, >= 0."""
    change = expected_kv_change_tokens(obs, params, horizon_s=horizon_s, counts=counts)
    return max(0.0, kv_now_mib + params.change_weight * params.mib_per_token * change)


def _held_tokens(log: RequestLog, at_s: np.ndarray, *, reserves_output: bool) -> np.ndarray:
    """Tokens held at each time by the (complete) requests of ``log``."""
    out = np.empty(len(at_s))
    for i, x in enumerate(at_s):
        run = (log.admit_s <= x) & (log.finish_s > x)
        gen = log.generated_tokens[run]
        if reserves_output:
            out[i] = float((log.context_tokens[run] + gen).sum())
            continue
        first, fin = log.first_token_s[run], log.finish_s[run]
        step = np.maximum((fin - first) / np.maximum(gen - 1.0, 1.0), 1e-9)
        dec = np.where(x >= first, np.minimum(1.0 + (x - first) / step, gen), 0.0)
        out[i] = float((log.context_tokens[run] + dec).sum())
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class KvModeFit:
    """How well one KV mode reproduces the samples: least-squares MiB per token, mean |error|."""

    reserves_output: bool
    mib_per_token: float
    mean_abs_error_mib: float


def fit_kv_modes(
    log: RequestLog, sample_s: np.ndarray, kv_mib: np.ndarray, *, until_s: float
) -> tuple[list[KvModeFit], int]:
    """Both KV modes fitted on the span up to ``until_s``, and the most requests seen running.

    Uses the requests finished by ``until_s`` and the KV samples taken before the first
    admission of a request not finished by then (so every request held at a sample is known).
    The scale is the server's bytes per token (2 × layers × KV heads × head size × dtype size).
    """
    done = log.finish_s <= until_s
    past = RequestLog(
        arrival_s=log.arrival_s[done],
        context_tokens=log.context_tokens[done],
        admit_s=log.admit_s[done],
        first_token_s=log.first_token_s[done],
        finish_s=log.finish_s[done],
        generated_tokens=log.generated_tokens[done],
    )
    open_admit = log.admit_s[(log.admit_s <= until_s) & ~done]
    complete_until = float(open_admit.min()) if open_admit.size else until_s
    keep = (sample_s <= min(until_s, complete_until)) & np.isfinite(kv_mib)
    at, kv = sample_s[keep], kv_mib[keep]
    if at.size < 10:
        raise ValueError(f"fit_kv_modes: {at.size} complete KV samples before {until_s} s")
    fits = []
    for reserves in (True, False):
        held = _held_tokens(past, at, reserves_output=reserves)
        scale = float(held @ kv / max(float(held @ held), 1e-12))
        err = float(np.abs(kv - scale * held).mean())
        fits.append(
            KvModeFit(reserves_output=reserves, mib_per_token=scale, mean_abs_error_mib=err)
        )
    running = [int(((past.admit_s <= x) & (past.finish_s > x)).sum()) for x in at]
    return fits, max(running)


def fit_kv_flow_params(
    log: RequestLog, sample_s: np.ndarray, kv_mib: np.ndarray, *, until_s: float
) -> KvFlowParams:
    """Cap, KV mode and MiB per token from the span up to ``until_s`` only (``fit_kv_modes``):
    the mode that reproduces the samples better, the cap the most requests seen running."""
    fits, max_batch = fit_kv_modes(log, sample_s, kv_mib, until_s=until_s)
    best = min(fits, key=lambda f: f.mean_abs_error_mib)
    return KvFlowParams(
        max_batch=max_batch, reserves_output=best.reserves_output, mib_per_token=best.mib_per_token
    )


def kv_pool_bound(
    sample_s: np.ndarray, kv_mib: np.ndarray, queued: np.ndarray, *, until_s: float
) -> tuple[bool, float]:
    """Whether the server was bound by its KV pool on the span up to ``until_s``, and the median
    KV in use while requests waited as a share of the most KV seen there.

    The flow model frees slots of a batch capped by sequences (``max_batch``) and admits the
    queue into them; a server whose KV pool is what fills first (vLLM's waiting queue when its
    blocks run out) keeps KV pinned at the pool whenever requests wait, and there the model
    forecasts rises the full pool cannot take (+10-17 GB on the simulated on/off recording,
    where it was worse than the last value: docs/router.md). No queue seen: not pool-bound.
    """
    keep = (sample_s <= until_s) & np.isfinite(kv_mib) & np.isfinite(queued)
    waiting = keep & (queued > 0)
    top = float(kv_mib[keep].max()) if bool(keep.any()) else 0.0
    if not bool(waiting.any()) or top <= 0.0:
        return False, 0.0
    share = float(np.median(kv_mib[waiting])) / top
    return share >= POOL_BOUND_SHARE, share


def choose_change_weight(
    times_s: np.ndarray,
    kv_now_mib: np.ndarray,
    change_mib: np.ndarray,
    *,
    horizon_s: float,
    until_s: float,
) -> float:
    """The weight of the model's change (``CHANGE_WEIGHTS``) with the lowest WAPE on the rows
    whose target lies at or before ``until_s``; 0 (the last value) unless one beats the last
    value there by ``SELECTION_MARGIN``. ``change_mib[i]`` is the expected change at
    ``times_s[i]`` (from the view at that t); ``kv_now_mib`` the KV in use at each t."""
    rows = np.flatnonzero(times_s + horizon_s <= until_s)
    at = np.searchsorted(times_s, times_s[rows] + horizon_s, side="right") - 1
    actual, now = kv_now_mib[at], kv_now_mib[rows]
    best, best_wape = 0.0, _wape(now, actual) * (1.0 - SELECTION_MARGIN)
    for w in CHANGE_WEIGHTS:
        score = _wape(np.maximum(now + w * change_mib[rows], 0.0), actual)
        if score < best_wape:
            best, best_wape = w, score
    return best


def _wape(pred: np.ndarray, actual: np.ndarray) -> float:
    return float(np.abs(pred - actual).sum() / max(float(np.abs(actual).sum()), 1e-12))
