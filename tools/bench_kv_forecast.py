"""KV-occupancy forecast on real serving telemetry: the router's LightGBM KV heads vs baselines.

Usage: bench_kv_forecast.py TELEMETRY_CSV REQUESTS_CSV [--train-frac 0.6]
(the h200-llm-telemetry recording's two files; see its README for the columns).

Protocol. Target: the KV cache in use (`kv_cache_mib`) at t + H, H = 5 s and 30 s, forecast at the
end of every one-second bin t. Inputs are strictly what was observable at t, fed through the
router's own `FeatureBuilder` (the code the live router runs): telemetry samples stamped <= t
(KV in use, device memory, queued requests) and requests that had arrived by t with their
context tokens. Never a request's generated tokens or finish time (the builder's generated-token
input is left at zero), never a later arrival. Split in time: the model trains on the first
`train_frac` of the recording through `train_forecast_model` (one LightGBM booster per horizon,
`num_threads=1`, trained on the change from the current value); it is scored on the rest, from
the first t whose target lies past the training span. Baselines on the same t: last value and
the 10 s and 30 s trailing means of the samples. WAPE = sum |error| / sum actual.
ratio = the larger of the two horizons' model WAPE / best-baseline WAPE. Last line key=value.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import numpy as np

from seedance.router.forecast import (
    ArrivalHistory,
    ForecastTarget,
    TelemetrySample,
    TrainParams,
    build_feature_rows,
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


def read_arrivals(path: Path) -> ArrivalHistory:
    with path.open(newline="") as f:
        rows = sorted(
            (float(row["arrival_s"]), float(row["context_tokens"])) for row in csv.DictReader(f)
        )
    arrival = np.array([r[0] for r in rows])
    return ArrivalHistory(
        arrival_s=arrival,
        context_tokens=np.array([r[1] for r in rows]),
        # Not observable when a request arrives: the forecast must not see it.
        generated_tokens=np.zeros(len(rows)),
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
    arrivals = read_arrivals(args.requests)
    origin_s = math.floor(t[0])
    end_s = float(t[-1])
    until_s = origin_s + math.floor(args.train_frac * (end_s - origin_s))
    log(f"recording {end_s - origin_s:.0f} s, {len(samples)} samples; train until {until_s} s")
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
    pred_frac = model.predict_rows(rows)  # (rows, horizons): KV fraction at t + H
    row_t = origin_s + np.arange(1, n_bins + 1, dtype=float)

    print(
        f"telemetry={args.telemetry.name} requests={args.requests.name} "
        f"train_s=[{origin_s},{until_s}) rows={n_bins} model={model.version.model_id}"
    )
    print(f"{'horizon':>8}{'test_n':>8}{'model':>9}{'last':>9}{'ma10s':>9}{'ma30s':>9}")
    result: dict[int, tuple[float, float]] = {}
    for j, h in enumerate(HORIZONS_S):
        # Scored rows: the target lies past the training span and inside the recording.
        keep = (row_t + h > until_s) & (row_t >= until_s) & (row_t + h <= end_s)
        at = row_t[keep]
        actual = value_at(t, kv, at + h)
        model_w = wape(pred_frac[keep, j] * H200_MEM_MIB, actual)
        base = {
            "last": wape(value_at(t, kv, at), actual),
            "ma10s": wape(trailing_mean(t, kv, at, 10.0), actual),
            "ma30s": wape(trailing_mean(t, kv, at, 30.0), actual),
        }
        best = min(base.values())
        result[h] = (model_w, best)
        print(
            f"{h:>7}s{int(keep.sum()):>8}{model_w:>9.4f}{base['last']:>9.4f}"
            f"{base['ma10s']:>9.4f}{base['ma30s']:>9.4f}"
        )
    ratio = max(m / b for m, b in result.values())
    (w5, b5), (w30, b30) = result[5], result[30]
    print(
        f"kv_forecast: horizon_s=5 wape={w5:.4f} baseline_wape={b5:.4f} wape_30s={w30:.4f} "
        f"baseline_wape_30s={b30:.4f} ratio={ratio:.3f}"
    )


if __name__ == "__main__":
    main()
