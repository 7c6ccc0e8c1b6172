"""Is NVML's power draw (``nvmlDeviceGetPowerUsage``) a 1 s average on this GPU?

The collector reads it once a second because NVML documents it as "power averaged over 1 sec
interval" on Ampere and newer except GA100; this checks that claim on the hardware at hand.
Run on a GPU machine (``make bench-nvml-power``) under the load of ``seedance.bench.nvml_shares``
(its two matmul workers, 70 % and 20 % of each 100 ms), it reads ``nvmlDeviceGetPowerUsage``
every 20 ms for ``--seconds`` and, each second, the driver's own power samples over the same span
(``nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES)``, one each ~20 ms on an H200), and compares
each reading with (a) the mean of the driver's samples over the second before it and (b) the
latest driver sample before it. A 1 s average tracks (a) and not (b); an instantaneous reading
the other way round. Last line:

    nvml_power: usage_vs_1s_mean_w_p50=<n> usage_vs_latest_sample_w_p50=<n> \
                usage_step_w_p50=<n> sample_step_w_p50=<n> usage_changes_every_ms_p50=<n> \
                readings=<n> samples=<n>

(``*_step_*``: the median change between successive readings, 20 ms apart, and between
successive driver samples; ``usage_changes_every_ms_p50``: the median time between changes of
the reading, i.e. how often NVML refreshes the average.) Same ``PYTHONPATH`` as
``make bench-nvml-shares``.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from typing import Any

from seedance.bench.nvml_shares import _imports, _start_workers


def _read(n: Any, h: Any, seconds: float) -> tuple[list[tuple[int, float]], list[Any]]:
    """(unix µs, W) every 20 ms, and the driver's samples over the same span, fetched each
    second (its buffer holds ~2.4 s of them on an H200)."""
    readings: list[tuple[int, float]] = []
    samples: list[Any] = []
    last_us = int(time.time() * 1e6) - 1_100_000  # from a second before the first reading
    deadline = time.perf_counter() + seconds
    fetch_at = time.perf_counter() + 1.0
    while True:
        now = time.perf_counter()
        if now >= fetch_at or now >= deadline:
            fetch_at += 1.0
            _, got = n.nvmlDeviceGetSamples(h, n.NVML_TOTAL_POWER_SAMPLES, last_us)
            samples += got
            last_us = max([last_us, *(int(s.timeStamp) for s in got)])
            if now >= deadline:
                return readings, samples
        readings.append((int(time.time() * 1e6), n.nvmlDeviceGetPowerUsage(h) / 1000.0))
        time.sleep(0.02)


def _steps(values: list[float]) -> float:
    return statistics.median(abs(b - a) for a, b in itertools.pairwise(values))


def _change_ms(readings: list[tuple[int, float]]) -> float:
    """Median time between changes of the reading (ms): how often NVML refreshes it."""
    at = [t for (t, w), (_, prev) in zip(readings[1:], readings, strict=False) if w != prev]
    gaps = [(b - a) / 1000.0 for a, b in itertools.pairwise(at)]
    return statistics.median(gaps) if gaps else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="how long to read")
    ap.add_argument("--n", type=int, default=4096, help="matmul size of the load (bf16)")
    args = ap.parse_args()
    n, _ = _imports()
    h = n.nvmlDeviceGetHandleByIndex(0)
    load = argparse.Namespace(duty=[0.7, 0.2], worker_s=args.seconds + 12.0, n=args.n)
    procs = _start_workers(load)
    try:
        time.sleep(2.0)
        readings, samples = _read(n, h, args.seconds)
    except n.NVMLError as exc:
        raise SystemExit(f"nvml_power: NVML's power readings or samples: {exc}") from None
    finally:
        for p in procs:
            p.kill()
    driver = sorted({(int(s.timeStamp), s.sampleValue.uiVal / 1000.0) for s in samples})
    if not driver:
        raise SystemExit("nvml_power: the driver returned no power samples")
    vs_mean, vs_latest = [], []
    for at, watts in readings:
        window = [w for t, w in driver if at - 1_000_000 <= t <= at]
        if not window or at - 1_000_000 < driver[0][0]:
            continue  # the samples do not reach a whole second back from this reading
        vs_mean.append(abs(watts - statistics.fmean(window)))
        vs_latest.append(abs(watts - window[-1]))
    if not vs_mean:
        raise SystemExit("nvml_power: the driver's samples cover under a second")
    print(
        f"nvml_power: usage_vs_1s_mean_w_p50={statistics.median(vs_mean):.1f} "
        f"usage_vs_latest_sample_w_p50={statistics.median(vs_latest):.1f} "
        f"usage_step_w_p50={_steps([w for _, w in readings]):.1f} "
        f"sample_step_w_p50={_steps([w for _, w in driver]):.1f} "
        f"usage_changes_every_ms_p50={_change_ms(readings):.0f} "
        f"readings={len(vs_mean)} samples={len(driver)}"
    )


if __name__ == "__main__":
    main()
