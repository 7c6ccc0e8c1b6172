"""Benchmark the request forecaster against moving-average baselines on a real trace (issue 5).

Protocol: the series is the whole trace's request count per second with the first and last
60 s trimmed; the last 30 % (time order) is held out. At every second t of the tail the model
predicts the requests in (t, t+H] for H = 5 s and 30 s from what arrived up to t (the same
streaming FeatureBuilder the router runs); WAPE = Σ|error| / Σ actual. The baseline is the best
of last-value (previous H seconds), 30-s and 60-s moving averages scaled to H, on the same tail.
The model is trained on the first 70 % only. Prediction latency is the fast single-row path.

Usage: bench_predictor.py TRACE [--format auto|azure|mooncake]
  azure: CSV with TIMESTAMP,ContextTokens,GeneratedTokens (TIMESTAMP a date-time or seconds);
  mooncake: JSONL with timestamp (ms), input_length, output_length.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from seedance.router.core.forecast import (
    ArrivalHistory,
    ForecastModel,
    TrainParams,
    build_feature_rows,
    train_forecast_model,
)

HORIZONS_S = (5, 30)
TRIM_S = 60
HOLDOUT_FRAC = 0.30


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _parse_ts(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    text = text.strip()
    # Azure writes 7 fractional digits; datetime takes at most 6.
    if "." in text:
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    d = datetime.fromisoformat(text)
    if d.tzinfo is None:
        d = d.replace(tzinfo=UTC)  # Azure traces are UTC
    return d.timestamp()


def load_trace(path: Path, fmt: str) -> ArrivalHistory:
    if fmt == "auto":
        with path.open() as f:
            first = f.readline().lstrip()
        fmt = "mooncake" if first.startswith("{") else "azure"
    ts: list[float] = []
    ctx: list[float] = []
    gen: list[float] = []
    with path.open() as f:
        if fmt == "mooncake":
            for line in f:
                if line.strip():
                    rec = json.loads(line)
                    ts.append(float(rec["timestamp"]) / 1000.0)
                    ctx.append(float(rec.get("input_length", 0)))
                    gen.append(float(rec.get("output_length", 0)))
        else:
            header = [h.strip() for h in f.readline().split(",")]
            it, ic, ig = (
                header.index(k) for k in ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
            )
            for line in f:
                parts = line.rstrip("\n").split(",")
                if len(parts) > max(it, ic, ig):
                    ts.append(_parse_ts(parts[it]))
                    ctx.append(float(parts[ic]))
                    gen.append(float(parts[ig]))
    t = np.asarray(ts)
    order = np.argsort(t, kind="stable")
    return ArrivalHistory(
        arrival_s=t[order],
        context_tokens=np.asarray(ctx)[order],
        generated_tokens=np.asarray(gen)[order],
    )


def wape(pred: np.ndarray, actual: np.ndarray) -> float:
    return float(np.abs(pred - actual).sum() / actual.sum())


def measure_predict_us(model: ForecastModel, rows: np.ndarray, n: int = 20_000) -> dict[str, float]:
    """Median/p99 of one horizon's single-row forecast, and of the raw booster call."""
    head_pred = model._heads[0].predictor  # the raw C-API call, for the breakdown
    sel = rows[np.random.default_rng(0).integers(0, len(rows), size=n)]
    sel = np.ascontiguousarray(sel)
    full = np.empty(n)
    raw = np.empty(n)
    pc = time.perf_counter_ns
    for i in range(200):
        model.predict_horizon(0, sel[i])
    for i in range(n):
        r = sel[i]
        t0 = pc()
        model.predict_horizon(0, r)
        full[i] = pc() - t0
    for i in range(n):
        np.copyto(head_pred.row, sel[i])
        t0 = pc()
        head_pred.predict_row()
        raw[i] = pc() - t0
    # For comparison: the plain Python path on a 1-row array (not what the router uses).
    plain = np.empty(2_000)
    booster = model._heads[0].booster
    for i in range(2_000):
        r = sel[i].reshape(1, -1)
        t0 = pc()
        booster.predict(r, num_threads=1)
        plain[i] = pc() - t0
    return {
        "plain_booster_predict_us_p50": float(np.median(plain)) / 1e3,
        "predict_us_p50": float(np.median(full)) / 1e3,
        "predict_us_p99": float(np.percentile(full, 99)) / 1e3,
        "raw_booster_us_p50": float(np.median(raw)) / 1e3,
    }


def measure_row_at_us(model: ForecastModel, hist: ArrivalHistory, origin_s: float) -> float:
    """Median cost of FeatureBuilder.row_at, the other half of an online forecast."""
    builder = model.new_feature_builder(origin_s=origin_s)
    row = np.empty(len(model._heads[0].predictor.row))
    pc = time.perf_counter_ns
    cost: list[int] = []
    ts = hist.arrival_s.tolist()
    i = 0
    now_s = origin_s + 1.0
    end_s = min(ts[-1], origin_s + 2_000.0)
    while now_s < end_s:
        while i < len(ts) and ts[i] < now_s:
            if ts[i] >= origin_s:
                builder.observe_request(ts[i], 0.0, 0.0)
            i += 1
        t0 = pc()
        builder.row_at(now_s, out=row)
        cost.append(pc() - t0)
        now_s += 0.25  # four decisions a second: most calls find no bin to close
    return float(np.median(cost)) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--format", choices=("auto", "azure", "mooncake"), default="auto")
    ap.add_argument("--rounds", type=int, default=TrainParams().num_boost_round)
    args = ap.parse_args()

    t_start = time.perf_counter()
    hist = load_trace(args.trace, args.format)
    t_first = float(hist.arrival_s[0])
    n_total = int(np.floor(hist.arrival_s[-1] - t_first)) + 1
    origin_s = t_first + TRIM_S
    n = n_total - 2 * TRIM_S
    if n < 600:
        raise SystemExit(f"trace {args.trace} spans {n_total} s; need at least {600 + 2 * TRIM_S}")
    split = int((1.0 - HOLDOUT_FRAC) * n)
    log(
        f"trace={args.trace.name} requests={len(hist.arrival_s)} series_s={n} "
        f"train_s={split} holdout_s={n - split}"
    )
    rows, counts, _ = build_feature_rows(hist, origin_s=origin_s, n_bins=n)
    log(
        f"mean_rate_per_s={counts.mean():.3f} "
        f"features built in {time.perf_counter() - t_start:.1f}s"
    )

    t0 = time.perf_counter()
    model = train_forecast_model(
        hist,
        horizons_s=HORIZONS_S,
        origin_s=origin_s,
        until_s=origin_s + split,
        params=TrainParams(num_boost_round=args.rounds),
    )
    log(
        f"trained {model.version.model_id} on {model.version.n_train_rows} rows in "
        f"{time.perf_counter() - t0:.1f}s (fast path: {model.uses_fast_path})"
    )

    cum = np.concatenate([[0.0], np.cumsum(counts)])
    preds = model.predict_rows(rows)
    results: dict[int, tuple[float, float]] = {}
    for j, h in enumerate(HORIZONS_S):
        # Row i is the state at the end of bin i (t); the target is bins i+1 .. i+h.
        idx = np.arange(split, n - h)
        actual = cum[idx + 1 + h] - cum[idx + 1]
        base = {
            "last_value": cum[idx + 1] - cum[idx + 1 - h],
            "ma30": (cum[idx + 1] - cum[idx + 1 - 30]) / 30.0 * h,
            "ma60": (cum[idx + 1] - cum[idx + 1 - 60]) / 60.0 * h,
        }
        base_wape = {k: wape(v, actual) for k, v in base.items()}
        best = min(base_wape, key=base_wape.__getitem__)
        w_model = wape(preds[idx, j], actual)
        results[h] = (w_model, base_wape[best])
        # Not a baseline: a centred 60-s average that sees the future, to show the noise floor.
        lo, hi = np.maximum(idx + 1 + h // 2 - 60, 0), np.minimum(idx + 1 + h // 2 + 60, n)
        oracle = (cum[hi] - cum[lo]) / (hi - lo) * h
        booster = model._heads[j].booster
        gain = booster.feature_importance(importance_type="gain")
        top = [booster.feature_name()[k] for k in np.argsort(gain)[::-1][:4] if gain[k] > 0]
        log(
            f"H={h}s level={model._heads[j].level_feature} trees={booster.num_trees()} "
            f"top_features={','.join(top) or '-'} "
            f"non_causal_centred_60s_wape={wape(oracle, actual):.4f}"
        )
        log(
            f"H={h}s points={len(idx)} model_wape={w_model:.4f} "
            + " ".join(f"{k}_wape={v:.4f}" for k, v in base_wape.items())
            + f" best_baseline={best} ratio={w_model / base_wape[best]:.3f}"
        )
    lat = measure_predict_us(model, rows[split:])
    lat["row_at_us_p50"] = measure_row_at_us(model, hist, origin_s)
    log(
        f"latency: forecast(1 horizon) p50={lat['predict_us_p50']:.2f}us "
        f"p99={lat['predict_us_p99']:.2f}us raw booster p50={lat['raw_booster_us_p50']:.2f}us "
        f"feature row_at p50={lat['row_at_us_p50']:.2f}us "
        f"plain Booster.predict(1 row, 1 thread) p50={lat['plain_booster_predict_us_p50']:.1f}us"
    )
    ratio = max(results[h][0] / results[h][1] for h in HORIZONS_S)
    print(
        f"predictor: wape_5s={results[5][0]:.4f} best_baseline_wape_5s={results[5][1]:.4f} "
        f"wape_30s={results[30][0]:.4f} best_baseline_wape_30s={results[30][1]:.4f} "
        f"ratio={ratio:.3f} predict_us_p50={lat['predict_us_p50']:.2f}"
    )


if __name__ == "__main__":
    main()
