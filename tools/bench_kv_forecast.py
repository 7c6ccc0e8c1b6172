"""KV-occupancy forecast on real serving telemetry: the router's online KV head vs baselines.

Usage: bench_kv_forecast.py TELEMETRY_CSV REQUESTS_CSV [--train-frac 0.6]
(the h200-llm-telemetry recording's two files; see its README for the columns).

Protocol. Target: the KV cache in use (`kv_cache_mib`) at t + H, H = 5 s and 30 s, forecast at the
end of every one-second bin t. Inputs are strictly what was observable at t: telemetry samples
stamped <= t, and the request log as `RequestLog.observable_at(t)` shows it (arrivals up to t with
their prompt sizes; admissions, first tokens and finishes up to t; generated tokens only of
requests finished by t), on the telemetry's clock: the requests file's times are shifted by the
offset that matches the telemetry's completion counter on the training span (1.00 s on the
shared recording; see `clock_offset_s`). The model (`seedance.router.core.forecast.kv_occupancy`):
kv(t + H) = kv(t) + β · Δ, Δ = the change of tokens in flight (prompt + decoded so far) over the
last second, β an online ridge fit on the rows whose target had been observed by t; its
forgetting and ridge weight, or no correction at all, are chosen per horizon on the first
`train_frac` of the recording only. Split in time: scored on the rest, from the first t whose
target lies past the training span. Reference (not the model): the forecaster's LightGBM KV
heads (`train_forecast_model`, trained once on the training span). Baselines on the same t: last
value and the 10 s and 30 s trailing means of the samples. WAPE = sum |error| / sum actual.
ratio = the larger of the two horizons' model WAPE / best-baseline WAPE. Last line key=value.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from seedance.router.core.forecast import (
    ArrivalHistory,
    ForecastTarget,
    RequestLog,
    TelemetrySample,
    TrainParams,
    build_feature_rows,
    choose_kv_forecaster,
    kv_change_features,
    replay_kv_forecaster,
    train_forecast_model,
)

HORIZONS_S = (5, 30)
# The occupancy fraction's denominator; any constant gives the same WAPE. An H200's 141 GB.
H200_MEM_MIB = 143_771.0
# Leaves may hold fewer rows than the router's default (200): a recording of minutes has only a
# few hundred one-second rows to train on.
PARAMS = TrainParams(min_data_in_leaf=20, num_leaves=4, num_threads=1)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def read_telemetry(path: Path) -> tuple[np.ndarray, np.ndarray, list[TelemetrySample]]:
    t, kv, samples = [], [], []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            ts, kv_mib = float(row["t_s"]), float(row["kv_cache_mib"])
            t.append(ts)
            kv.append(kv_mib)
            samples.append(
                TelemetrySample(
                    sample_s=ts,
                    kv_occupancy_frac=kv_mib / H200_MEM_MIB,
                    mem_used_mib=float(row["mem_used_mib"]),
                    queue_depth=float(row["queued_reqs"]),
                )
            )
    return np.array(t), np.array(kv), samples


def arrivals_of(log_: RequestLog) -> ArrivalHistory:
    return ArrivalHistory(
        arrival_s=log_.arrival_s,
        context_tokens=log_.context_tokens,
        # Not observable when a request arrives: the forecast must not see it.
        generated_tokens=np.zeros(len(log_.arrival_s)),
    )


def read_done_total(path: Path) -> np.ndarray:
    with path.open(newline="") as f:
        return np.array([float(row["done_total"]) for row in csv.DictReader(f)])


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
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))

    def col(name: str) -> np.ndarray:
        return np.array([float(r[name]) if r[name] not in ("", "nan") else math.nan for r in rows])

    order = np.argsort(col("arrival_s"), kind="stable")
    return RequestLog(
        arrival_s=col("arrival_s")[order],
        context_tokens=col("context_tokens")[order],
        admit_s=col("admit_s")[order],
        first_token_s=col("first_token_s")[order],
        finish_s=col("finish_s")[order],
        generated_tokens=col("generated_tokens")[order],
    )


def value_at(t: np.ndarray, v: np.ndarray, at_s: np.ndarray) -> np.ndarray:
    """The latest sample at or before each time."""
    i = np.searchsorted(t, at_s, side="right") - 1
    return v[np.clip(i, 0, len(v) - 1)]


def trailing_mean(t: np.ndarray, v: np.ndarray, at_s: np.ndarray, window_s: float) -> np.ndarray:
    cum = np.concatenate([[0.0], np.cumsum(v)])
    hi = np.searchsorted(t, at_s, side="right")
    lo = np.searchsorted(t, at_s - window_s, side="right")
    return (cum[hi] - cum[lo]) / np.maximum(hi - lo, 1)


def wape(pred: np.ndarray, actual: np.ndarray) -> float:
    return float(np.abs(pred - actual).sum() / max(float(np.abs(actual).sum()), 1e-9))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("telemetry", type=Path)
    ap.add_argument("requests", type=Path)
    ap.add_argument("--train-frac", type=float, default=0.6)
    args = ap.parse_args()

    t, kv, samples = read_telemetry(args.telemetry)
    origin_s = math.floor(t[0])
    end_s = float(t[-1])
    until_s = origin_s + math.floor(args.train_frac * (end_s - origin_s))
    log(f"recording {end_s - origin_s:.0f} s, {len(samples)} samples; train until {until_s} s")
    raw_log = read_log(args.requests)
    offset_s = clock_offset_s(raw_log, t, read_done_total(args.telemetry), until_s)
    log(f"requests file clock + {offset_s:.2f} s = telemetry clock (from done_total)")
    log_ = shifted(raw_log, offset_s)
    arrivals = arrivals_of(log_)
    model = train_forecast_model(
        arrivals,
        samples,
        target=ForecastTarget.KV_OCCUPANCY,
        horizons_s=HORIZONS_S,
        origin_s=origin_s,
        until_s=until_s,
        params=PARAMS,
    )
    n_bins = math.floor(end_s - origin_s)
    rows, _, _ = build_feature_rows(arrivals, samples, origin_s=origin_s, n_bins=n_bins)
    lgbm_frac = model.predict_rows(rows)  # (rows, horizons): KV fraction at t + H
    row_t = origin_s + np.arange(1, n_bins + 1, dtype=float)

    # The online head: one feature row per t, each from the log as seen at that row's t.
    x = np.array([kv_change_features(log_, float(at)) for at in row_t])
    kv_now = value_at(t, kv, row_t)
    configs = {
        h: choose_kv_forecaster(row_t, x, kv_now, horizon_s=float(h), until_s=float(until_s))
        for h in HORIZONS_S
    }
    for h, cfg in configs.items():
        log(f"H={h}s: chosen on the training span: half_life_s={cfg.half_life_s} ridge={cfg.ridge}")

    print(
        f"telemetry={args.telemetry.name} requests={args.requests.name} "
        f"train_s=[{origin_s},{until_s}) rows={n_bins} lgbm={model.version.model_id}"
    )
    print(f"{'horizon':>8}{'test_n':>8}{'model':>9}{'last':>9}{'ma10s':>9}{'ma30s':>9}{'lgbm':>9}")
    result: dict[int, tuple[float, float]] = {}
    for j, h in enumerate(HORIZONS_S):
        pred = replay_kv_forecaster(configs[h], row_t, x, kv_now)
        # Scored rows: the target lies past the training span and inside the recording.
        keep = (row_t + h > until_s) & (row_t >= until_s) & (row_t + h <= end_s)
        at = row_t[keep]
        actual = value_at(t, kv, at + h)
        model_w = wape(pred[keep], actual)
        base = {
            "last": wape(value_at(t, kv, at), actual),
            "ma10s": wape(trailing_mean(t, kv, at, 10.0), actual),
            "ma30s": wape(trailing_mean(t, kv, at, 30.0), actual),
        }
        lgbm_w = wape(lgbm_frac[keep, j] * H200_MEM_MIB, actual)
        best = min(base.values())
        result[h] = (model_w, best)
        print(
            f"{h:>7}s{int(keep.sum()):>8}{model_w:>9.4f}{base['last']:>9.4f}"
            f"{base['ma10s']:>9.4f}{base['ma30s']:>9.4f}{lgbm_w:>9.4f}"
        )
    ratio = max(m / b for m, b in result.values())
    (w5, b5), (w30, b30) = result[5], result[30]
    print(
        f"kv_forecast: horizon_s=5 wape={w5:.4f} baseline_wape={b5:.4f} wape_30s={w30:.4f} "
        f"baseline_wape_30s={b30:.4f} ratio={ratio:.3f}"
    )


if __name__ == "__main__":
    main()
