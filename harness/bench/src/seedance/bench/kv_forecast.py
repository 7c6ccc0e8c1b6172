"""KV-occupancy forecast on real serving telemetry: the router's flow-model KV head vs baselines.

Usage: bench_kv_forecast.py TELEMETRY_CSV REQUESTS_CSV [--train-frac 0.6 | --splits 0.3,0.5,0.8]
[--span-s 30] [--fallback recent|test]
(the h200-llm-telemetry recording's two files; see its README for the columns).

Protocol. Target: the KV cache in use (`kv_cache_mib`) at t + H, H = 5 s and 30 s, forecast at the
end of every one-second bin t. Inputs are strictly what was observable at t: telemetry samples
stamped <= t (KV in use, the server's running / queued gauges, arrival and decode counters), the
request log as `RequestLog.observable_at(t)` shows it (arrivals up to t with their prompt sizes;
admissions, first tokens and finishes up to t; generated tokens only of requests finished by t),
on the telemetry's clock: the requests file's times are shifted by the offset that matches the
telemetry's completion counter on the training span (1.00 s on the shared recording; see
`clock_offset_s`). The requests file lists only requests that finished within the recording, so
from the first time it lists fewer arrivals than the server counted (`listed_until_s`) later
arrivals are dropped from the log and the queue behind reaches the model as a count only.
The model (`seedance.router.core.forecast.kv_flow`): kv(t + H) = kv(t) + w · the expected change
of KV held by a FIFO server with a capped batch (running requests' survival from a Kaplan–Meier
curve of output lengths per prompt class, the queue head admitted into the freed slots);
the cap, the KV mode and the MiB per token are fitted, and w (0 = the last value) chosen per
horizon, on the first `train_frac` of the recording only; then w is refitted at each t on the
targets already observed (`recent_change_weights`; a 0 stays 0), and a server the training span
shows bound by its KV pool (`kv_pool_bound`) gets w = 0. Split in time:
scored on the rest, from the first t whose target lies past the training span. References (not
the model): the online ridge head of `kv_occupancy` and the forecaster's LightGBM KV heads
(`train_forecast_model`, trained once on the training span). Baselines on the same t: last value
and the 10 s and 30 s trailing means of the samples. WAPE = sum |error| / sum actual. ratio =
the larger of the two horizons' model WAPE / best-baseline WAPE; also per phase (rows where the
server had a queue at t, a saturated plateau, and rows where it had none); ratio_last = the same
over the last value's WAPE (the issue's "never worse than the last value"). The forecast scored
is the fallback's: at each t the flow model or the last value, whichever had the lower recent error
once the recent targets hold four independent ones (before, the 5-s horizon's verdict at the 30-s
one, and the last value at 5 s), or with `--fallback
test` the last value unless the flow model's recent paired errors beat the last value's by more than
their noise (`kv_fallback.follow_if_better`); `kv_heads:` says which made the forecasts; the flow
model alone is printed too. Scores and tables: `kv_scores`.
Last line key=value. `--splits` runs all of it at each train fraction and ends with a sweep table
and a `kv_forecast_splits:` line; `--span-s` adds model / best baseline per sub-span of the test
span.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from seedance.bench.kv_scores import (
    HORIZONS_S,
    SplitResult,
    best_baseline,
    print_by_phase,
    print_by_subspan,
    print_splits,
    value_at,
    wape,
)
from seedance.router.core.forecast import (
    ArrivalHistory,
    ChangeWeightConfig,
    DecodeClock,
    ForecastTarget,
    HeadChoiceConfig,
    KvHead,
    PairedTestConfig,
    RequestLog,
    ServerCounts,
    TelemetrySample,
    TrainParams,
    arrival_rate_window_s,
    build_feature_rows,
    choose_change_weight,
    choose_kv_forecaster,
    expected_kv_change_tokens,
    fit_kv_flow_params,
    fit_kv_modes,
    follow_if_better,
    kv_change_features,
    kv_pool_bound,
    recent_change_weights,
    replay_kv_forecaster,
    select_heads,
    train_forecast_model,
)
from seedance.traces import h200

# The occupancy fraction's denominator; any constant gives the same WAPE. An H200's 141 GB.
H200_MEM_MIB = 143_771.0
# Leaves may hold fewer rows than the router's default (200): a recording of minutes has only a
# few hundred one-second rows to train on.
PARAMS = TrainParams(min_data_in_leaf=20, num_leaves=4, num_threads=1)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def read_telemetry(path: Path) -> tuple[np.ndarray, np.ndarray, list[TelemetrySample]]:
    rec = h200.read_telemetry(path)
    samples = [
        TelemetrySample(
            sample_s=float(ts),
            kv_occupancy_frac=float(kv_mib) / H200_MEM_MIB,
            mem_used_mib=float(mem),
            queue_depth=float(queued),
        )
        for ts, kv_mib, mem, queued in zip(
            rec.t_s, rec.kv_cache_mib, rec.mem_used_mib, rec.queued_reqs, strict=True
        )
    ]
    return rec.t_s, rec.kv_cache_mib, samples


def arrivals_of(log_: RequestLog) -> ArrivalHistory:
    return ArrivalHistory(
        arrival_s=log_.arrival_s,
        context_tokens=log_.context_tokens,
        # Not observable when a request arrives: the forecast must not see it.
        generated_tokens=np.zeros(len(log_.arrival_s)),
    )


def read_done_total(path: Path) -> np.ndarray:
    return h200.read_telemetry(path).done_total


def listed_until_s(log_: RequestLog, t: np.ndarray, arrived_total: np.ndarray) -> float:
    """The last time up to which the requests file lists every arrival the server counted.

    The recording's requests file keeps only requests that finished within it: a request still
    running or queued at its end is missing. Past this time, a view of the file would show a
    queue thinned by the future (exactly the requests that finish in time), so the bench drops
    later arrivals from the log and the queue behind them reaches the model as the server's
    count only (``ServerCounts.queued``). The server's counter lags the stamps by up to a
    sample; a gap of more than 3 requests marks the end.
    """
    listed = np.searchsorted(log_.arrival_s, t, side="right")
    short = np.flatnonzero(arrived_total - listed > 3)
    return float(t[short[0]]) if short.size else float("inf")


def server_counts(
    rec: h200.H200Telemetry, at_s: np.ndarray, horizon_s: float
) -> list[ServerCounts]:
    """The server's gauges at each t (samples stamped <= t): running, queued, the arrival rate
    over the window the flow model uses for this horizon (its counter, not the log), and its
    decode clock (`DecodeClock`; none where the recording's decode counter stays at 0)."""
    clock = DecodeClock.of_counters(rec.t_s, rec.decode_tokens_total, rec.active_reqs)
    window_s = arrival_rate_window_s(horizon_s)
    arrived = value_at(rec.t_s, rec.arrived_total, at_s)
    before = value_at(rec.t_s, rec.arrived_total, at_s - window_s)
    running = value_at(rec.t_s, rec.active_reqs, at_s)
    queued = value_at(rec.t_s, rec.queued_reqs, at_s)
    return [
        ServerCounts(
            running=int(r),
            queued=int(q),
            arrivals_per_s=float(a - b) / window_s,
            decode_clock=None if clock is None else clock.until(float(x)),
        )
        for x, r, q, a, b in zip(at_s, running, queued, arrived, before, strict=True)
    ]


def clock_offset_s(
    log_: RequestLog, t: np.ndarray, done_total: np.ndarray, until_s: float
) -> float:
    """Telemetry clock minus requests-file clock, from the training span only.

    The two files of the recording do not share a time origin: the telemetry's own completion
    counter (`done_total`) at t equals the number of requests with `finish_s` <= t - 1.00 s to
    the request (mean |error| 0.003 against 17 at no shift), while KV in use moves with NVML's
    device memory at zero lag. So a request event stamped x happened at telemetry time x + 1 s;
    reading the log unshifted would show a forecast at t one second of the future. The offset
    is the one that best matches the counter (a grid of 10 ms steps over ±5 s).
    """
    keep = t <= until_s
    fin = np.sort(log_.finish_s[~np.isnan(log_.finish_s)])
    grid = np.round(np.arange(-5.0, 5.0 + 1e-9, 0.01), 2)
    err = [
        float(np.abs(np.searchsorted(fin, t[keep] - d, side="right") - done_total[keep]).mean())
        for d in grid
    ]
    return float(grid[int(np.argmin(err))])


def shifted(log_: RequestLog, offset_s: float) -> RequestLog:
    return replace(
        log_,
        arrival_s=log_.arrival_s + offset_s,
        admit_s=log_.admit_s + offset_s,
        first_token_s=log_.first_token_s + offset_s,
        finish_s=log_.finish_s + offset_s,
    )


def read_log(path: Path) -> RequestLog:
    """The requests file as a log (NaN where a time is missing); views of it are taken per t."""
    rec = h200.read_requests(path)
    order = np.argsort(rec.arrival_s, kind="stable")
    return RequestLog(
        arrival_s=rec.arrival_s[order],
        context_tokens=rec.context_tokens[order],
        admit_s=rec.admit_s[order],
        first_token_s=rec.first_token_s[order],
        finish_s=rec.finish_s[order],
        generated_tokens=rec.generated_tokens[order],
    )


def flow_forecasts(
    log_: RequestLog,
    rec: h200.H200Telemetry,
    row_t: np.ndarray,
    kv_now: np.ndarray,
    until_s: float,
) -> dict[int, np.ndarray]:
    """The flow head's forecasts per horizon at every row (each from the view at its t): the
    last value plus a weight times the model's change. The server's parameters come from the
    training span; the weight too (0 = the last value) until targets have come due, then the
    least-squares weight on the recent ones (`recent_change_weights`; 0 stays 0). A server the
    training span shows bound by its KV pool (`kv_pool_bound`) is not the model's: w = 0."""
    for fit in fit_kv_modes(log_, rec.t_s, rec.kv_cache_mib, until_s=until_s)[0]:
        log(
            f"KV mode reserves_output={fit.reserves_output}: {fit.mib_per_token:.5f} MiB/token, "
            f"mean |error| {fit.mean_abs_error_mib:.1f} MiB on the training span"
        )
    params = fit_kv_flow_params(log_, rec.t_s, rec.kv_cache_mib, until_s=until_s)
    log(
        f"flow model, fitted on the training span: max_batch={params.max_batch} "
        f"reserves_output={params.reserves_output} mib_per_token={params.mib_per_token:.5f}"
    )
    pool_bound, share = kv_pool_bound(rec.t_s, rec.kv_cache_mib, rec.queued_reqs, until_s=until_s)
    log(
        f"median KV while requests wait: {share:.3f} of the most seen on the training span "
        + (
            "-> bound by its KV pool: the flow model does not describe it (w = 0)"
            if pool_bound
            else "-> not bound by its KV pool"
        )
    )
    clocked = DecodeClock.of_counters(rec.t_s, rec.decode_tokens_total, rec.active_reqs)
    log("decode clock: " + ("the server's decode counter" if clocked else "none (no counter)"))
    preds: dict[int, np.ndarray] = {}
    for h in HORIZONS_S:
        if pool_bound:
            preds[h] = kv_now.copy()
            continue
        counts = server_counts(rec, row_t, float(h))
        change = params.mib_per_token * np.array(
            [
                expected_kv_change_tokens(
                    log_.observable_at(float(at)), params, horizon_s=float(h), counts=counts[i]
                )
                for i, at in enumerate(row_t)
            ]
        )
        w = choose_change_weight(row_t, kv_now, change, horizon_s=float(h), until_s=until_s)
        log(f"H={h}s: change weight chosen on the training span: {w} (0 = the last value)")
        target = row_t + h
        actual = np.where(
            target <= rec.t_s[-1], value_at(rec.t_s, rec.kv_cache_mib, target), np.nan
        )
        weights = recent_change_weights(
            row_t, kv_now, change, actual, ChangeWeightConfig(horizon_s=float(h)), default=w
        )
        test = row_t >= until_s
        log(
            f"H={h}s: recent weight on the test rows: mean {weights[test].mean():.2f} "
            f"(min {weights[test].min():.2f}, max {weights[test].max():.2f})"
        )
        preds[h] = np.maximum(kv_now + weights * change, 0.0)
    return preds


def fallback_forecasts(
    t: np.ndarray,
    kv: np.ndarray,
    row_t: np.ndarray,
    flow: dict[int, np.ndarray],
    end_s: float,
    rule: str = "recent",
) -> tuple[dict[int, np.ndarray], dict[int, list[KvHead]]]:
    """Per horizon, each row's forecast from the flow model or the last value.

    ``rule="recent"`` (the default): whichever has the lower recent error (`select_heads` anchored
    on the last value: the flow model gives way as soon as its recent error exceeds the last
    value's, and is taken back only 10 % below it; until the last 120 s of due targets hold four
    independent ones, the verdict of the nearest shorter horizon at the same row, and at the
    shortest the last value: the training span is no evidence beyond the targets it puts in that
    window, so it licenses no head on its own, while the shorter horizon's targets are due from
    the start). ``rule="test"``: the last value, or the flow
    model where its errors against the last value's over the targets due in the last 240 s beat it
    by more than their noise (`follow_if_better`: a one-sided batch-means test at 5 %, one block per
    horizon); the same rule on the training span's rows as on the test span's, so a training span
    too short to judge means the last value. (The 10 s / 30 s means are not heads: chosen inside a
    plateau, a mean was kept into the next change of regime, 1.11 / 1.08 x the last value on two
    simulated recordings of other loads.)"""
    heads = (KvHead.FLOW, KvHead.LAST_VALUE)
    last = value_at(t, kv, row_t)
    out: dict[int, np.ndarray] = {}
    used: dict[int, list[KvHead]] = {}
    shorter: int | None = None
    for h in sorted(HORIZONS_S):
        target = row_t + h
        actual = np.where(target <= end_s, value_at(t, kv, target), np.nan)
        if rule == "test":
            out[h], used[h], _ = follow_if_better(
                row_t, flow[h], last, actual, PairedTestConfig(horizon_s=float(h))
            )
            continue
        out[h], used[h] = select_heads(
            row_t,
            {KvHead.FLOW: flow[h], KvHead.LAST_VALUE: last},
            actual,
            HeadChoiceConfig(horizon_s=float(h)),
            default=KvHead.LAST_VALUE,
            order=heads,
            anchor=KvHead.LAST_VALUE,
            # A flow head that is the last value throughout (w = 0) borrows nothing: the same
            # forecasts, and `kv_heads:` keeps saying so.
            borrowed=None if shorter is None or np.array_equal(flow[h], last) else used[shorter],
        )
        shorter = h
    return out, used


def head_shares(used: list[KvHead]) -> list[tuple[KvHead, float]]:
    n = max(len(used), 1)
    return [(head, sum(1 for u in used if u is head) / n) for head in KvHead if head in used]


def ridge_forecasts(
    log_: RequestLog, row_t: np.ndarray, kv_now: np.ndarray, until_s: float
) -> dict[int, np.ndarray]:
    """Reference: the online ridge head on the change of tokens in flight (``kv_occupancy``)."""
    x = np.array([kv_change_features(log_, float(at)) for at in row_t])
    out = {}
    for h in HORIZONS_S:
        cfg = choose_kv_forecaster(row_t, x, kv_now, horizon_s=float(h), until_s=until_s)
        out[h] = replay_kv_forecaster(cfg, row_t, x, kv_now)
    return out


def lgbm_forecasts(
    arrivals: ArrivalHistory,
    samples: list[TelemetrySample],
    origin_s: int,
    until_s: float,
    n_bins: int,
) -> tuple[str, np.ndarray]:
    """Reference: the forecaster's LightGBM KV heads, trained once on the training span (MiB);
    NaN where the span is too short to train them (a split at 0.3 of the shared recording)."""
    try:
        model = train_forecast_model(
            arrivals,
            samples,
            target=ForecastTarget.KV_OCCUPANCY,
            horizons_s=HORIZONS_S,
            origin_s=origin_s,
            until_s=until_s,
            params=PARAMS,
        )
    except ValueError as exc:
        log(f"LightGBM reference not trained on this span: {exc}")
        return "none", np.full((n_bins, len(HORIZONS_S)), np.nan)
    rows, _, _ = build_feature_rows(arrivals, samples, origin_s=origin_s, n_bins=n_bins)
    return model.version.model_id, model.predict_rows(rows) * H200_MEM_MIB


def evaluate(
    telemetry: Path,
    requests: Path,
    train_frac: float,
    span_s: float | None = None,
    fallback: str = "recent",
) -> SplitResult:
    """The whole bench on one split: the first ``train_frac`` of the recording trains, the rest
    is scored; prints the tables (with ``span_s``, also per sub-span of the test span), returns
    the scores."""
    rec = h200.read_telemetry(telemetry)
    t, kv, samples = read_telemetry(telemetry)
    origin_s = math.floor(t[0])
    end_s = float(t[-1])
    until_s = origin_s + math.floor(train_frac * (end_s - origin_s))
    log(f"recording {end_s - origin_s:.0f} s, {len(samples)} samples; train until {until_s} s")
    raw_log = read_log(requests)
    offset_s = clock_offset_s(raw_log, t, rec.done_total, until_s)
    log(f"requests file clock + {offset_s:.2f} s = telemetry clock (from done_total)")
    full_log = shifted(raw_log, offset_s)
    listed_s = listed_until_s(full_log, t, rec.arrived_total)
    log(f"requests file lists every arrival up to {listed_s:.1f} s (later ones: counts only)")
    log_ = full_log.subset(full_log.arrival_s <= listed_s)
    n_bins = math.floor(end_s - origin_s)
    row_t = origin_s + np.arange(1, n_bins + 1, dtype=float)
    kv_now = value_at(t, kv, row_t)

    flow_only = flow_forecasts(log_, rec, row_t, kv_now, float(until_s))
    flow, heads_used = fallback_forecasts(t, kv, row_t, flow_only, end_s, rule=fallback)
    ridge = ridge_forecasts(log_, row_t, kv_now, float(until_s))
    lgbm_id, lgbm_mib = lgbm_forecasts(arrivals_of(log_), samples, origin_s, until_s, n_bins)

    print(
        f"telemetry={telemetry.name} requests={requests.name} "
        f"train_s=[{origin_s},{until_s}) rows={n_bins} lgbm={lgbm_id}"
    )
    print(
        f"{'horizon':>8}{'test_n':>8}{'model':>9}{'last':>9}{'ma10s':>9}{'ma30s':>9}"
        f"{'ridge':>9}{'lgbm':>9}"
    )
    result = SplitResult(train_frac=train_frac, wape={}, best_baseline={}, last_value={})
    test_rows: dict[int, np.ndarray] = {}
    train_rows: dict[int, np.ndarray] = {}
    for j, h in enumerate(HORIZONS_S):
        # Scored rows: the target lies past the training span and inside the recording.
        keep = (row_t + h > until_s) & (row_t >= until_s) & (row_t + h <= end_s)
        test_rows[h], train_rows[h] = keep, row_t + h <= until_s
        at = row_t[keep]
        actual = value_at(t, kv, at + h)
        model_w = wape(flow[h][keep], actual)
        base = best_baseline(t, kv, at, actual)
        result.wape[h], result.best_baseline[h] = model_w, min(base.values())
        result.last_value[h] = base["last"]
        print(
            f"{h:>7}s{int(keep.sum()):>8}{model_w:>9.4f}{base['last']:>9.4f}"
            f"{base['ma10s']:>9.4f}{base['ma30s']:>9.4f}{wape(ridge[h][keep], actual):>9.4f}"
            f"{wape(lgbm_mib[keep, j], actual):>9.4f}"
        )
    queued = value_at(t, rec.queued_reqs, row_t)
    print_by_phase(t, kv, row_t, flow, queued, {"train": train_rows, "test": test_rows})
    if span_s:
        print_by_subspan(t, kv, row_t, flow, test_rows, span_s)
    alone = {
        h: wape(flow_only[h][test_rows[h]], value_at(t, kv, row_t[test_rows[h]] + h))
        for h in HORIZONS_S
    }
    print(
        "flow model alone (before the fallback): "
        + " ".join(f"H={h}s wape={w:.4f}" for h, w in alone.items())
    )
    print(
        "kv_heads: "
        + " ".join(
            f"h{h}="
            + "/".join(
                f"{head.value}:{100.0 * share:.0f}"
                for head, share in head_shares(
                    [heads_used[h][i] for i in np.flatnonzero(test_rows[h])]
                )
            )
            for h in HORIZONS_S
        )
    )
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("telemetry", type=Path)
    ap.add_argument("requests", type=Path)
    ap.add_argument("--train-frac", type=float, default=0.6)
    ap.add_argument(
        "--splits",
        type=lambda v: [float(x) for x in v.split(",")],
        default=None,
        help="comma-separated train fractions: run the bench at each, then a sweep table",
    )
    ap.add_argument(
        "--span-s",
        type=float,
        default=None,
        help="also print model / best baseline per sub-span of this many seconds of the test span",
    )
    ap.add_argument(
        "--fallback",
        choices=("recent", "test"),
        default="recent",
        help="recent: the head of the lower recent error (select_heads); test: the last value "
        "unless a batch-means test says the flow model is better (follow_if_better)",
    )
    args = ap.parse_args()
    if args.splits:
        results = []
        for frac in args.splits:
            print(f"== train_frac={frac:g}")
            results.append(
                evaluate(args.telemetry, args.requests, frac, args.span_s, args.fallback)
            )
        print_splits(results)
        return
    r = evaluate(args.telemetry, args.requests, args.train_frac, args.span_s, args.fallback)
    print(
        f"kv_forecast: horizon_s=5 wape={r.wape[5]:.4f} baseline_wape={r.best_baseline[5]:.4f} "
        f"wape_30s={r.wape[30]:.4f} baseline_wape_30s={r.best_baseline[30]:.4f} "
        f"ratio={r.ratio:.3f} ratio_last={r.ratio_last:.3f}"
    )
