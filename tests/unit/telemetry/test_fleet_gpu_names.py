"""A replayed fleet may name its GPUs as NVML / GPU feature discovery report them."""

from __future__ import annotations

import pytest

from seedance.telemetry_collector.fleet import GPU_MODELS, FleetNode, FleetSim


def test_nvml_and_gfd_names_find_the_spec_of_their_model() -> None:
    sim = FleetSim(
        [
            FleetNode("a", "Tesla T4", 1),  # NVML
            FleetNode("b", "Tesla-V100-SXM2-32GB", 1),  # GFD
            FleetNode("c", "NVIDIA H200", 1),  # NVML on the H200 of the research note
            FleetNode("d", "T4", 1),  # the trace's short name
        ]
    )
    by_node = {s.node: s.gpus[0] for s in sim.sample(0.0)}
    assert by_node["a"].mem_total_mib == GPU_MODELS["T4"].mem_total_mib
    assert by_node["a"].power_w == GPU_MODELS["T4"].idle_w
    assert by_node["b"].mem_total_mib == GPU_MODELS["V100M32"].mem_total_mib
    assert by_node["c"].power_w == GPU_MODELS["H200"].idle_w
    assert by_node["d"].mem_total_mib == by_node["a"].mem_total_mib
    # the inventory keeps the name each node reports (what it observed)
    assert [g.model for inv in sim.inventory() for g in inv.gpus] == [
        "Tesla T4", "Tesla-V100-SXM2-32GB", "NVIDIA H200", "T4",
    ]  # fmt: skip


def test_a_model_without_a_spec_is_refused_by_its_name() -> None:
    with pytest.raises(ValueError, match=r"no GpuModelSpec for model\(s\) \['NVIDIA B200'\]"):
        FleetSim([FleetNode("x", "NVIDIA B200", 1)])
