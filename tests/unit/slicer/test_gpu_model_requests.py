"""A request's ``gpu_models`` mean what a user means, and the answer says what matched."""

from __future__ import annotations

from seedance.events.gpus import GPU_MODELS, identify
from seedance.slicer.core import GpuSpec, JobSpec, NodeSpec, Placed, Scheduler, Waiting
from seedance.slicer.core.mig import GpuModel, mig_model, profiles


def node(name: str, model: str, gpus: int = 4, **kw: object) -> NodeSpec:
    return NodeSpec(
        name=name, cpu_milli=32_000, memory_mib=256_000,
        gpus=tuple(GpuSpec(model=model, **kw) for _ in range(gpus)),  # type: ignore[arg-type]
    )  # fmt: skip


def job(jid: str, **kw: object) -> JobSpec:
    return JobSpec(job_id=jid, tenant="a", cause_id=f"c-{jid}", **kw)  # type: ignore[arg-type]


def fleet() -> Scheduler:
    s = Scheduler()
    s.upsert_node(node("t4-node", "T4"), 0)  # a replayed fleet's short name
    s.upsert_node(node("a100-node", "NVIDIA A100-SXM4-80GB"), 0)  # as NVML reports it
    return s


def test_a_family_finds_the_fleets_gpus_however_they_are_named() -> None:
    s = fleet()
    for jid, models, where in (
        ("j1", ("t4",), "t4-node"),
        ("j2", ("Tesla-T4",), "t4-node"),
        ("j3", ("a100",), "a100-node"),
        ("j4", ("NVIDIA-A100-SXM4-80GB",), "a100-node"),
        ("j5", ("a100-80gb", "b200"), "a100-node"),
    ):
        (placed,) = s.submit(job(jid, gpu_models=models), 1)
        assert isinstance(placed, Placed), (jid, placed)
        assert placed.node == where, jid


def test_a_model_the_fleet_lacks_is_unsatisfiable_naming_what_the_fleet_has() -> None:
    (waiting,) = fleet().submit(job("b", gpu_models=("b200",)), 1)
    assert isinstance(waiting, Waiting)
    assert waiting.reason == "unsatisfiable"
    assert waiting.detail == (
        "gpu_models [b200] match none of the fleet's models: "
        "NVIDIA A100-SXM4-80GB (A100-SXM4-80GB), T4 (T4-PCIE-16GB)"
    )


def test_mig_geometry_comes_from_the_gpu_identity() -> None:
    assert mig_model("NVIDIA A100-SXM4-80GB") == GpuModel.A100_80GB
    assert mig_model("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb") == GpuModel.A100_40GB
    assert mig_model("NVIDIA A800-SXM4-80GB") == GpuModel.A100_80GB
    assert mig_model("NVIDIA H800") == GpuModel.H100_80GB
    assert mig_model("NVIDIA H200") == GpuModel.H200_141GB
    # the short name means what the price book bills it as: the 80 GB A100
    assert mig_model("A100") == GpuModel.A100_80GB
    # geometries not tabled (NVL's 94 GB, H20) and unknown names: no MIG plan
    for name in ("NVIDIA H100 NVL", "NVIDIA H20", "GPU-series-1", "T4"):
        assert mig_model(name) is None, name


#: Which geometry each GPU of the identity's table carves as: the A100/A800 and H100/H800 by
#: memory, the H200s; every other part (the 94 GB H100s, H800 NVL, H20, GH200, Blackwell) none.
GEOMETRY = {
    "A100-PCIE-40GB": GpuModel.A100_40GB, "A100-SXM4-40GB": GpuModel.A100_40GB,
    "A800-PCIE-40GB": GpuModel.A100_40GB, "A100-PCIE-80GB": GpuModel.A100_80GB,
    "A100-SXM4-80GB": GpuModel.A100_80GB, "A800-PCIE-80GB": GpuModel.A100_80GB,
    "A800-SXM4-80GB": GpuModel.A100_80GB, "H100-PCIE-80GB": GpuModel.H100_80GB,
    "H100-SXM5-80GB": GpuModel.H100_80GB, "H800-PCIE-80GB": GpuModel.H100_80GB,
    "H800-SXM5-80GB": GpuModel.H100_80GB, "H200-SXM-141GB": GpuModel.H200_141GB,
    "H200-NVL-141GB": GpuModel.H200_141GB,
}  # fmt: skip


def test_each_gpu_carves_as_its_published_table_says() -> None:
    """The slicer reads the GPU identity's MIG tables (no copy of its own): each part's
    geometry, and each geometry's profile names, are the identity's."""
    for gpu in GPU_MODELS:
        assert mig_model(gpu.model) == GEOMETRY.get(gpu.model), gpu.model
    for model in GpuModel:
        table = identify(model.value).identity
        assert table is not None
        assert tuple(p.name for p in profiles(model)) == table.mig_profiles
