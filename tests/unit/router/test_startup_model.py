"""Start-up times from measurement (`router_sim.startup`): the measured loads scaled by weight
size, their quantiles, and the same seeded draws for every policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from seedance.bench.router_sim import LLAMA31_8B_BF16_L4, LLAMA31_70B_FP8_H200
from seedance.bench.router_sim.startup import SDXL_BASE_BYTES, StartupModel
from seedance.testing.paths import data_dir

HEADER = "timestamp_anon,value,container_ip\n"


def test_every_load_is_scaled_by_the_weight_bytes(tmp_path: Path) -> None:
    path = tmp_path / "lat.csv"
    path.write_text(HEADER + "1,2000,a\n2,40000,b\n3,20000,c\n")
    m = StartupModel.measured(path, weight_bytes=2 * SDXL_BASE_BYTES)
    assert m.samples_s == (4.0, 80.0, 40.0)
    assert m.quantile(0.5) == 40.0
    assert m.quantile(1.0) == 80.0
    with pytest.raises(ValueError, match="weight_bytes"):
        StartupModel.measured(path, weight_bytes=0)


def test_draws_are_the_same_for_the_same_seed_and_come_from_the_samples() -> None:
    m = StartupModel((1.0, 2.0, 3.0))
    a = m.draws(50, seed=7)
    assert a == m.draws(50, seed=7)
    assert a != m.draws(50, seed=8)
    assert set(a) <= {1.0, 2.0, 3.0}
    with pytest.raises(ValueError, match="samples_s"):
        StartupModel(())


def test_the_profiles_scale_the_real_loads_to_minutes_for_70b() -> None:
    path = data_dir() / "alibaba-genai-2026" / "basemodel_update_latency_anon.csv"
    if not path.exists():
        pytest.skip(f"shared data not present at {path} (set SEEDANCE_DATA_DIR)")
    big = StartupModel.measured(path, weight_bytes=LLAMA31_70B_FP8_H200.weight_bytes)
    small = StartupModel.measured(path, weight_bytes=LLAMA31_8B_BF16_L4.weight_bytes)
    # Median 22.7 s measured: x10.2 for 70.6 GB, x2.3 for 16.1 GB (docs/router.md's ~53 s).
    assert big.quantile(0.5) == pytest.approx(231.0, rel=0.02)
    assert small.quantile(0.5) == pytest.approx(52.6, rel=0.02)
    assert big.quantile(0.95) > 2.0 * big.quantile(0.1)  # the tail, kept
