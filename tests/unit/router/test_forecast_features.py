"""FeatureBuilder against a brute-force recomputation from the raw arrivals, and no leakage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from seedance.router.core.forecast import (
    FEATURE_NAMES,
    ArrivalHistory,
    FeatureBuilder,
    TelemetrySample,
    build_feature_rows,
)
from seedance.router.core.forecast.features import (
    COUNT_WINDOWS_S,
    EWM_HALF_LIVES_S,
    STD_WINDOWS_S,
    TOKEN_WINDOWS_S,
)

ORIGIN_S = 1_000.5


def _arrivals(seed: int) -> ArrivalHistory:
    """Bursty arrivals with a 700-s silence (longer than the builder's ring) in the middle."""
    rng = np.random.default_rng(seed)
    a = np.sort(ORIGIN_S + rng.uniform(0.0, 400.0, size=1_500))
    burst = np.sort(ORIGIN_S + 150.0 + rng.uniform(0.0, 3.0, size=200))
    late = np.sort(ORIGIN_S + 1_100.0 + rng.uniform(0.0, 200.0, size=600))
    t = np.sort(np.concatenate([a, burst, late]))
    return ArrivalHistory(
        arrival_s=t,
        context_tokens=rng.integers(10, 4_000, size=len(t)).astype(float),
        generated_tokens=rng.integers(1, 500, size=len(t)).astype(float),
    )


def _brute_force(hist: ArrivalHistory, now_s: float) -> dict[str, float]:
    k = math.floor(now_s - ORIGIN_S)
    b = np.floor(hist.arrival_s - ORIGIN_S).astype(int)
    keep = (b >= 0) & (b < k)
    c = np.bincount(b[keep], minlength=k).astype(float)[:k]
    ctx = np.bincount(b[keep], weights=hist.context_tokens[keep], minlength=k)[:k]
    gen = np.bincount(b[keep], weights=hist.generated_tokens[keep], minlength=k)[:k]
    nan = math.nan
    f: dict[str, float] = {}
    for lag in range(1, 7):
        f[f"count_lag{lag}"] = c[k - lag] if k >= lag else nan
    for w in COUNT_WINDOWS_S:
        m = min(w, k)
        f[f"rate_{w}s"] = c[k - m :].sum() / m if m else nan
    for h in EWM_HALF_LIVES_S:
        a = 2.0 ** (-1.0 / h)
        wts = (1 - a) * a ** np.arange(k - 1, -1, -1)
        f[f"ewm_rate_hl{int(h)}s"] = float((wts * c).sum() / wts.sum()) if k else nan
    for name, arr in (("ctx", ctx), ("gen", gen)):
        for w in TOKEN_WINDOWS_S:
            m = min(w, k)
            f[f"{name}_tokens_per_s_{w}s"] = arr[k - m :].sum() / m if m else nan
    m = min(60, k)
    n60 = c[k - m :].sum()
    f["tokens_per_request_60s"] = (ctx[k - m :].sum() + gen[k - m :].sum()) / n60 if n60 else nan
    for w in STD_WINDOWS_S:
        m = min(w, k)
        f[f"count_std_{w}s"] = float(np.std(c[k - m :])) if m > 1 else nan
    m = min(60, k)
    f["zero_bins_frac_60s"] = float((c[k - m :] == 0).mean()) if m else nan
    f["ratio_rate_10s_120s"] = f["rate_10s"] / f["rate_120s"] if f["rate_120s"] > 0 else nan
    f["ratio_rate_60s_300s"] = f["rate_60s"] / f["rate_300s"] if f["rate_300s"] > 0 else nan
    f["ratio_ewm_hl10s_hl120s"] = (
        f["ewm_rate_hl10s"] / f["ewm_rate_hl120s"] if f["ewm_rate_hl120s"] > 0 else nan
    )
    seen = hist.arrival_s[keep]
    f["since_last_arrival_s"] = now_s - seen.max() if len(seen) else nan
    return f


def test_streaming_rows_match_brute_force() -> None:
    hist = _arrivals(1)
    builder = FeatureBuilder(origin_s=ORIGIN_S)
    rng = np.random.default_rng(2)
    # Irregular query times, including inside the long silence and right after it.
    times = np.sort(
        np.concatenate([rng.uniform(ORIGIN_S, ORIGIN_S + 1_400, 60), [ORIGIN_S + 1_101]])
    )
    i = 0
    checked = 0
    for now_s in times:
        while (
            i < len(hist.arrival_s) and hist.arrival_s[i] < math.floor(now_s - ORIGIN_S) + ORIGIN_S
        ):
            builder.observe_request(
                hist.arrival_s[i], hist.context_tokens[i], hist.generated_tokens[i]
            )
            i += 1
        row = builder.row_at(float(now_s))
        expected = _brute_force(hist, float(now_s))
        for name, want in expected.items():
            got = row[FEATURE_NAMES.index(name)]
            if math.isnan(want):
                assert math.isnan(got), (name, now_s)
            else:
                assert got == pytest.approx(want, rel=1e-9, abs=1e-9), (name, now_s)
            checked += 1
    assert checked > 1_000


def test_arrivals_in_the_open_bin_do_not_count_yet() -> None:
    b = FeatureBuilder(origin_s=0.0)
    b.observe_request(0.2)
    b.observe_request(1.5)  # bin 1, still open at now_s = 1.9
    row = b.row_at(1.9)
    assert row[FEATURE_NAMES.index("count_lag1")] == 1.0
    assert row[FEATURE_NAMES.index("since_last_arrival_s")] == pytest.approx(1.7)


def test_out_of_order_arrival_is_refused_with_the_field_named() -> None:
    b = FeatureBuilder(origin_s=0.0)
    b.row_at(10.0)
    with pytest.raises(ValueError, match="arrival_s"):
        b.observe_request(5.0)


def test_telemetry_features_latest_and_slopes() -> None:
    b = FeatureBuilder(origin_s=0.0)
    for t in range(0, 100, 5):
        b.observe_sample(
            TelemetrySample(
                sample_s=float(t),
                kv_occupancy_frac=0.01 * t,
                mem_used_mib=1_000.0 + 2.0 * t,
                queue_depth=float(t % 3),
            )
        )
    row = b.row_at(97.0)
    assert row[FEATURE_NAMES.index("kv_occupancy_frac")] == pytest.approx(0.95)
    assert row[FEATURE_NAMES.index("kv_occupancy_slope_per_s")] == pytest.approx(0.01)
    assert row[FEATURE_NAMES.index("mem_alloc_mib_per_s")] == pytest.approx(2.0)
    assert row[FEATURE_NAMES.index("queue_depth")] == 95 % 3
    assert math.isnan(row[FEATURE_NAMES.index("in_flight_tokens")])


def test_time_of_day_only_when_switched_on() -> None:
    off = FeatureBuilder(origin_s=0.0).row_at(21_600.0)
    on = FeatureBuilder(origin_s=0.0, with_time_of_day=True).row_at(21_600.0)  # 06:00 UTC
    assert math.isnan(off[FEATURE_NAMES.index("time_of_day_sin")])
    assert on[FEATURE_NAMES.index("time_of_day_sin")] == pytest.approx(1.0)


def test_rows_before_t_do_not_change_when_the_future_changes() -> None:
    hist = _arrivals(3)
    cut_s = ORIGIN_S + 300.0
    past = hist.arrival_s < cut_s
    rng = np.random.default_rng(4)
    extra = np.sort(cut_s + rng.uniform(0.0, 500.0, size=3_000))
    other = ArrivalHistory(
        arrival_s=np.concatenate([hist.arrival_s[past], extra]),
        context_tokens=np.concatenate([hist.context_tokens[past], np.full(3_000, 9e3)]),
        generated_tokens=np.concatenate([hist.generated_tokens[past], np.full(3_000, 9e2)]),
    )
    rows_a, _, _ = build_feature_rows(hist, origin_s=ORIGIN_S, n_bins=800)
    rows_b, _, _ = build_feature_rows(other, origin_s=ORIGIN_S, n_bins=800)
    # Row i is the state at ORIGIN_S + i + 1: rows up to the cut see only the shared past.
    upto = 300
    np.testing.assert_array_equal(rows_a[:upto], rows_b[:upto])
    assert not np.array_equal(rows_a[upto + 5], rows_b[upto + 5])
