"""The simulated fleet: samples follow placements; power between idle and TDP; energy adds up."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from seedance.telemetry_collector.fleet import GPU_MODELS, FleetNode, FleetSim, load_node_list
from seedance.telemetry_collector.sample import NodeSample
from seedance.testing.paths import data_dir

NODES = [FleetNode("n-t4", "T4", 2), FleetNode("n-v100", "V100M32", 8), FleetNode("n-g2", "G2", 8)]


def gpu(sim: FleetSim, now: float, node: str, index: int):
    by_node = {s.node: s for s in sim.sample(now)}
    return by_node[node].gpus[index]


def test_idle_fleet_sits_at_idle_power_and_is_marked_simulated() -> None:
    sim = FleetSim(NODES)
    samples = sim.sample(0.0)
    assert [s.node for s in samples] == ["n-t4", "n-v100", "n-g2"]
    assert all(s.simulated for s in samples)
    t4 = samples[0].gpus[0]
    assert t4.power_w == GPU_MODELS["T4"].idle_w
    assert t4.mem_used_mib == 0.0
    assert t4.mem_total_mib == GPU_MODELS["T4"].mem_total_mib
    assert t4.sm_active_ratio == 0.0
    assert t4.sm_clock_mhz is None  # not simulated: absent, not invented


def test_memory_and_activity_follow_placements() -> None:
    sim = FleetSim(NODES, busy_ratio=0.8)
    assert sim.apply_placement("p1", "n-v100", [2, 3], 500, mem_mib_per_gpu=8000)
    assert sim.apply_placement("p2", "n-v100", [3], 250, mem_mib_per_gpu=1000)
    g2, g3, g4 = (gpu(sim, 1.0, "n-v100", i) for i in (2, 3, 4))
    assert (g2.mem_used_mib, g3.mem_used_mib, g4.mem_used_mib) == (8000.0, 9000.0, 0.0)
    assert g2.sm_active_ratio == pytest.approx(0.4)
    assert g3.sm_active_ratio == pytest.approx(0.6)
    spec = GPU_MODELS["V100M32"]
    assert g3.power_w == pytest.approx(spec.idle_w + (spec.tdp_w - spec.idle_w) * 0.6)
    assert g4.power_w == spec.idle_w
    assert sim.free_milli("n-v100")[3] == 250
    assert sim.release("p2")
    assert gpu(sim, 2.0, "n-v100", 3).mem_used_mib == 8000.0


def test_placements_are_idempotent_by_id() -> None:
    sim = FleetSim(NODES)
    assert sim.apply_placement("p", "n-t4", [0], 400, mem_mib_per_gpu=100)
    assert not sim.apply_placement("p", "n-t4", [0], 400, mem_mib_per_gpu=100)
    assert sim.free_milli("n-t4") == [600, 1000]
    assert sim.release("p")
    assert not sim.release("p")
    assert sim.free_milli("n-t4") == [1000, 1000]


@pytest.mark.parametrize(
    ("node", "gpus", "milli", "mem", "match"),
    [
        ("nope", [0], 100, 0, "node 'nope'"),
        ("n-t4", [2], 100, 0, "gpu_indices"),
        ("n-t4", [0, 0], 100, 0, "gpu_indices"),
        ("n-t4", [0], 0, 0, "gpu_milli"),
        ("n-t4", [0, 1], 700, 0, "gpu_milli 700 over capacity"),
        ("n-t4", [1], 100, 20000, "mem_mib_per_gpu"),
    ],
)
def test_bad_placements_are_refused_whole(node, gpus, milli, mem, match) -> None:
    sim = FleetSim(NODES)
    sim.apply_placement("base", "n-t4", [0], 500, mem_mib_per_gpu=0)
    before = sim.sample_arrays(0.0)["mem_used_mib"].copy(), list(sim.free_milli("n-t4"))
    with pytest.raises(ValueError, match=match):
        sim.apply_placement("bad", node, gpus, milli, mem_mib_per_gpu=mem)
    assert np.array_equal(before[0], sim.sample_arrays(0.0)["mem_used_mib"])
    assert sim.free_milli("n-t4") == before[1]
    assert sim.apply_placement("bad", "n-t4", [1], 100, mem_mib_per_gpu=0)  # id not burnt


def test_power_stays_within_idle_and_tdp_and_energy_integrates() -> None:
    sim = FleetSim(NODES, busy_ratio=1.0)
    rng = np.random.default_rng(0)
    k = 0
    for n in NODES:
        for i in range(n.gpus):
            sim.apply_placement(f"p{k}", n.name, [i], int(rng.integers(1, 1001)), 0)
            k += 1
    cols = sim.sample_arrays(0.0)
    idle = np.array([GPU_MODELS[n.model].idle_w for n in NODES for _ in range(n.gpus)])
    tdp = np.array([GPU_MODELS[n.model].tdp_w for n in NODES for _ in range(n.gpus)])
    power = cols["power_w"].copy()
    assert np.all(power >= idle)
    assert np.all(power <= tdp)
    e0 = cols["energy_j"].copy()
    cols = sim.sample_arrays(10.0)
    assert np.allclose(cols["energy_j"] - e0, power * 10.0)
    with pytest.raises(ValueError, match="backwards"):
        sim.sample_arrays(5.0)


def test_samples_encode_and_decode() -> None:
    sim = FleetSim(NODES)
    sim.apply_placement("p", "n-g2", [0, 1, 2, 3], 1000, mem_mib_per_gpu=12000)
    enc = msgspec.msgpack.Encoder()
    dec = msgspec.msgpack.Decoder(NodeSample)
    for s in sim.sample(3.0):
        assert dec.decode(enc.encode(s)) == s


def test_unknown_model_is_refused() -> None:
    with pytest.raises(ValueError, match="H900"):
        FleetSim([FleetNode("x", "H900", 1)])


def test_alibaba_node_list_loads_as_the_paper_fleet() -> None:
    path = data_dir() / "alibaba-gpu-v2023" / "openb_node_list_gpu_node.csv"
    if not path.exists():
        pytest.skip(f"shared data not present at {path} (set SEEDANCE_DATA_DIR)")
    nodes = load_node_list(path)
    sim = FleetSim(nodes)
    assert len(nodes) == 1213
    assert sim.gpu_count == 6212
    assert sum(len(s.gpus) for s in sim.sample(0.0)) == 6212
    assert len(sim.inventory()) == 1213
