"""The slicer's MIG plans as mig-parted's named layouts, for nodes where NVIDIA's mig-manager
owns MIG: pure.

Where the GPU operator runs mig-manager on a node (the node carries its ``nvidia.com/mig.config``
label, and mig-manager writes ``nvidia.com/mig.config.state``), MIG layouts are mig-manager's:
it applies the named layout the node's ``nvidia.com/mig.config`` label names, from a ConfigMap
of named layouts in mig-parted's format::

    version: v1
    mig-configs:
      <name>:
        - devices: [0, 1]          # GPU indices (NVML's order), or ``all``
          mig-enabled: true
          mig-devices: {"1g.10gb": 2, "3g.40gb": 1}
        - devices: [2]
          mig-enabled: false

Creating instances through NVML beside it would be undone at its next apply, so the agent
expresses each plan as such a layout instead: ``target_layouts`` (every GPU of the node as it
is, the plan's GPU with the plan's instances destroyed and created), ``layout_entry`` (GPUs with
equal layouts grouped), ``layout_name`` (``seedance-`` and a hash of the entry: the same layout
has the same name on every node, so node agents only ever add entries) and ``with_layout`` (the
ConfigMap's text with the entry added).

What mig-parted's format cannot say, and what the agent does about it:

- **Start slots.** A layout counts instances per profile; mig-parted creates them and the
  driver places them. The slicer's plan places each instance at a start slot (its
  fragmentation view); after mig-manager applied a layout the agent pairs the slicer's
  instances with those created, per profile in slot order (``pair_slots``), and Allocate
  resolves the slicer's (profile, slot) through that pairing. The GPU's real placement may
  thus differ from the one the slicer planned.
- **One GPU at a time.** A layout is the whole node's: the other GPUs are written as they are
  (mig-parted reconfigures only the GPUs whose layout differs), but mig-manager pauses the GPU
  operator's own operands on the node while it applies any layout.
- **Compute instances.** One compute instance spanning each GPU instance (mig-parted's default,
  as the NVML path creates); other compute-instance layouts are not expressed.
- **MIG mode.** A plan for a GPU not in MIG mode is refused as on the NVML path (the operator
  decides MIG mode, through mig-manager's own layouts).

Must not do I/O: the shell reads NVML and the API server and passes their answers in.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from seedance.events.slicing import MigLayoutPlan
from seedance.node_agent.core.mig import MigInstance

__all__ = [
    "CONFIG_KEY",
    "LAYOUT_PREFIX",
    "MIG_CONFIG_LABEL",
    "MIG_STATE_LABEL",
    "GpuLayout",
    "LayoutError",
    "layout_entry",
    "layout_name",
    "mig_manager_present",
    "pair_slots",
    "target_layouts",
    "with_layout",
]

#: mig-manager applies the named layout this node label names.
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
#: mig-manager's progress: ``pending``, ``rebooting``, ``success``, ``failed``.
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
#: The ConfigMap key mig-manager reads its layouts from.
CONFIG_KEY = "config.yaml"
LAYOUT_PREFIX = "seedance-"


class LayoutError(ValueError):
    """A layout that cannot be written (the ConfigMap's text is not mig-parted's format)."""


def mig_manager_present(labels: Mapping[str, str]) -> bool:
    """Whether NVIDIA's mig-manager owns MIG on a node with these labels."""
    return MIG_CONFIG_LABEL in labels or MIG_STATE_LABEL in labels


@dataclass(frozen=True, slots=True)
class GpuLayout:
    """One GPU's layout: MIG on or off, and its instances counted per profile (sorted)."""

    index: int
    mig_enabled: bool
    devices: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def of(index: int, mig_enabled: bool, profiles: Sequence[str]) -> GpuLayout:
        return GpuLayout(index, mig_enabled, tuple(sorted(Counter(profiles).items())))


def target_layouts(
    current: Mapping[int, tuple[bool, Sequence[MigInstance]]], plan: MigLayoutPlan
) -> tuple[GpuLayout, ...]:
    """Every GPU of ``current`` (index -> MIG on, its instances) as it is, and the plan's GPU
    with the plan applied (its destroyed instances removed, its created ones added).

    Raises:
        LayoutError: the plan's GPU is not a GPU of ``current``.
    """
    if plan.gpu_index not in current:
        raise LayoutError(f"MIG plan {plan.id}: GPU {plan.gpu_index} is not a GPU of this node")
    out = []
    for index in sorted(current):
        enabled, instances = current[index]
        profiles = [(i.profile, i.start_slot) for i in instances]
        if index == plan.gpu_index:
            gone = {(d.profile, d.start_slot) for d in plan.destroy}
            profiles = [p for p in profiles if p not in gone]
            profiles += [
                (c.profile, c.start_slot)
                for c in plan.create
                if (c.profile, c.start_slot) not in profiles
            ]
        out.append(GpuLayout.of(index, enabled, [p for p, _slot in profiles]))
    return tuple(out)


def layout_entry(layouts: Sequence[GpuLayout]) -> list[dict[str, Any]]:
    """The layouts as one named layout's device groups (GPUs with equal layouts together)."""
    groups: dict[tuple[bool, tuple[tuple[str, int], ...]], list[int]] = {}
    for g in sorted(layouts, key=lambda g: g.index):
        groups.setdefault((g.mig_enabled, g.devices), []).append(g.index)
    out: list[dict[str, Any]] = []
    for (enabled, devices), indices in groups.items():
        group: dict[str, Any] = {"devices": indices, "mig-enabled": enabled}
        if enabled:
            group["mig-devices"] = dict(devices)
        out.append(group)
    return out


def layout_name(entry: Sequence[Mapping[str, Any]]) -> str:
    """``seedance-`` and 10 hex digits of the entry's hash: a valid label value (63 at most)."""
    canonical = json.dumps(list(entry), sort_keys=True, separators=(",", ":"))
    return LAYOUT_PREFIX + hashlib.sha256(canonical.encode()).hexdigest()[:10]


def with_layout(config_text: str, name: str, entry: list[dict[str, Any]]) -> str | None:
    """The ConfigMap's ``config.yaml`` with layout ``name`` added; None when it holds it already.

    Raises:
        LayoutError: the text is not mig-parted's format, or ``name`` holds another layout.
    """
    try:
        doc = yaml.safe_load(config_text) if config_text.strip() else {}
    except yaml.YAMLError as exc:
        raise LayoutError(f"{CONFIG_KEY} is not YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise LayoutError(f"{CONFIG_KEY} is not a mig-parted config (a mapping)")
    doc.setdefault("version", "v1")
    configs = doc.setdefault("mig-configs", {})
    if not isinstance(configs, dict):
        raise LayoutError(f"{CONFIG_KEY}: mig-configs is not a mapping of named layouts")
    if name in configs:
        if configs[name] != entry:
            raise LayoutError(f"{CONFIG_KEY}: layout {name} exists with other content")
        return None
    configs[name] = entry
    return str(yaml.safe_dump(doc, sort_keys=False, default_flow_style=None))


def pair_slots(
    planned: Sequence[tuple[str, int]], actual: Sequence[MigInstance]
) -> dict[tuple[str, int], int]:
    """The slicer's instances ``planned`` ((profile, start slot)) paired with the GPU's
    ``actual`` ones per profile in slot order: planned (profile, slot) -> actual slot. A planned
    instance with no actual one of its profile left is not paired."""
    out: dict[tuple[str, int], int] = {}
    by_profile: dict[str, list[int]] = {}
    for inst in actual:
        by_profile.setdefault(inst.profile, []).append(inst.start_slot)
    for profile in {p for p, _ in planned}:
        slots = sorted(s for p, s in planned if p == profile)
        for want, got in zip(slots, sorted(by_profile.get(profile, [])), strict=False):
            out[(profile, want)] = got
    return out
