"""The slicer's MIG plans as mig-parted's named layouts (``core.migparted``): the node's layout
with the plan applied, grouped as mig-parted writes device groups, named by content, added to
the ConfigMap's text without touching its other layouts; the slicer's start slots paired with
those mig-manager created."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import yaml

from seedance.events.base import new_event_id
from seedance.events.slicing import MigInstanceChange, MigLayoutPlan
from seedance.node_agent.core.mig import MigInstance
from seedance.node_agent.core.migparted import (
    GpuLayout,
    LayoutError,
    layout_entry,
    layout_name,
    mig_manager_present,
    pair_slots,
    target_layouts,
    with_layout,
)

T0 = datetime(2026, 12, 2, tzinfo=UTC)
#: The GPU operator's default layouts file, as its ConfigMap ships it (abridged).
OPERATOR_CONFIG = """version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
"""


def plan(gpu: int, destroy: list[tuple[str, int]], create: list[tuple[str, int]]) -> MigLayoutPlan:
    return MigLayoutPlan(
        id=new_event_id(), at=T0, node="gpu-1", gpu_index=gpu,
        destroy=[MigInstanceChange(profile=p, start_slot=s) for p, s in destroy],
        create=[MigInstanceChange(profile=p, start_slot=s) for p, s in create],
    )  # fmt: skip


def inst(profile: str, slot: int) -> MigInstance:
    return MigInstance(profile, slot, gi_id=slot + 1, ci_ids=(0,))


def test_mig_manager_is_recognised_by_its_labels() -> None:
    assert mig_manager_present({"nvidia.com/mig.config": "all-disabled"})
    assert mig_manager_present({"nvidia.com/mig.config.state": "success"})
    assert not mig_manager_present({"nvidia.com/mig.capable": "true"})


def test_the_plan_becomes_the_nodes_layout_with_the_other_gpus_as_they_are() -> None:
    current = {
        0: (True, [inst("3g.40gb", 0), inst("1g.10gb", 4)]),
        1: (True, [inst("3g.40gb", 0), inst("3g.40gb", 4)]),
        2: (False, []),
        3: (True, [inst("3g.40gb", 0), inst("3g.40gb", 4)]),
    }
    layouts = target_layouts(current, plan(0, [("1g.10gb", 4)], [("3g.40gb", 4)]))
    assert layouts == (
        GpuLayout(0, True, (("3g.40gb", 2),)),
        GpuLayout(1, True, (("3g.40gb", 2),)),
        GpuLayout(2, False, ()),
        GpuLayout(3, True, (("3g.40gb", 2),)),
    )
    entry = layout_entry(layouts)
    assert entry == [
        {"devices": [0, 1, 3], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
        {"devices": [2], "mig-enabled": False},
    ]
    name = layout_name(entry)
    assert name.startswith("seedance-")
    assert len(name) == len("seedance-") + 10
    assert name == layout_name([dict(g) for g in entry])  # by content: the same everywhere
    other = layout_entry(target_layouts(current, plan(0, [], [("1g.10gb", 5)])))
    assert layout_name(other) != name


def test_a_plan_for_a_gpu_the_node_does_not_have_is_refused() -> None:
    with pytest.raises(LayoutError, match="GPU 7 is not a GPU of this node"):
        target_layouts({0: (True, [])}, plan(7, [], [("1g.10gb", 0)]))


def test_a_layout_is_added_once_and_the_operators_layouts_are_kept() -> None:
    entry = [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 2}}]
    name = layout_name(entry)
    text = with_layout(OPERATOR_CONFIG, name, entry)
    assert text is not None
    doc = yaml.safe_load(text)
    assert doc["version"] == "v1"
    assert doc["mig-configs"][name] == entry
    assert (
        doc["mig-configs"]["all-1g.10gb"]
        == yaml.safe_load(OPERATOR_CONFIG)["mig-configs"]["all-1g.10gb"]
    )
    assert with_layout(text, name, entry) is None  # there already: nothing to write
    with pytest.raises(LayoutError, match="exists with other content"):
        with_layout(text, name, [{"devices": [0], "mig-enabled": False}])
    assert yaml.safe_load(with_layout("", name, entry) or "")["mig-configs"] == {name: entry}


@pytest.mark.parametrize("text", ["[1, 2]", "mig-configs: [1]", "a: [b"])
def test_a_configmap_not_in_mig_parteds_format_is_refused(text: str) -> None:
    with pytest.raises(LayoutError):
        with_layout(text, "seedance-0", [])


def test_the_slicers_slots_are_paired_with_the_created_ones_per_profile_in_order() -> None:
    planned = [("3g.71gb", 0), ("1g.18gb", 6), ("1g.18gb", 5)]
    actual = [inst("3g.71gb", 0), inst("1g.18gb", 4), inst("1g.18gb", 5)]
    assert pair_slots(planned, actual) == {
        ("3g.71gb", 0): 0,
        ("1g.18gb", 5): 4,
        ("1g.18gb", 6): 5,
    }
    # One mig-manager did not create: that planned instance stays unpaired.
    assert pair_slots(planned, actual[:2]) == {("3g.71gb", 0): 0, ("1g.18gb", 5): 4}
