"""MIG geometry: profiles, start slots, slot choice and repartition plans.

This module owns the static MIG geometry of the GPUs Seedance places on (A100-40GB, A100-80GB,
H100-80GB, H200-141GB) and the pure decisions that follow from it: which profile a request
needs, which start slot an instance takes on a GPU's current layout, and how a draining GPU is
re-cut for a target demand. It must not talk to NVML, the bus or a clock: the shell applies a
`MigPlan` with `nvidia-smi mig` / NVML and reports the resulting layout back.

Source of the tables: the profiles' names and sizes are the GPU identity's, read from
`seedance.events.gpus` (`GpuIdentity.mig_profiles`: NVIDIA Multi-Instance GPU User Guide,
"Supported MIG Profiles"), never copied here; the geometry is this module's, from the same
guide and the placements that `nvidia-smi mig -lgipp` prints for H100 (`19:{0..6}:1,
20:{0..6}:1, 15:{0,2,4,6}:2, 14:{0,2,4}:2, 9:{0,4}:4, 5:{0}:4, 0:{0}:8`); A100 and H200 have
the same slot geometry.
A placement is (start, size) in memory slices, as in NVML's `nvmlGpuInstancePlacement_t`;
creating an instance fails when its memory slices overlap an existing one.

Geometry model: 8 memory slices and 7 compute slices per GPU, at most 7 instances, at most one
instance with media extensions (`+me`). An instance occupies memory slices
[start, start + memory_slices). The compute slices of all instances add up to at most 7.

Memory sizes: `mem_mib` is the profile's nominal size (the "10gb" of `1g.10gb`) converted from
decimal GB to MiB, rounded down. The driver reports slightly different usable sizes (e.g. about
4864 MiB for A100-40GB 1g.5gb); the nominal figure errs on the small side, so a request judged to
fit does fit. Not verified on MIG hardware here (the only GPU at hand has MIG disabled).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from seedance.events.gpus import GpuIdentity, identify, mig_resource_suffix, parse_mig_profile

__all__ = [
    "COMPUTE_SLICES",
    "MAX_INSTANCES",
    "MEMORY_SLICES",
    "MIG_PROFILES",
    "GpuModel",
    "MigInstance",
    "MigLayout",
    "MigPlan",
    "MigProfile",
    "choose_start",
    "mig_model",
    "naive_start",
    "placeable_counts",
    "plan_repartition",
    "profile",
    "profiles",
    "smallest_profile",
]

MEMORY_SLICES = 8
COMPUTE_SLICES = 7
MAX_INSTANCES = 7

_MIB_PER_GB = 1_000_000_000 / (1024 * 1024)


class GpuModel(enum.StrEnum):
    """The MIG-capable GPU products whose geometry this module knows."""

    A100_40GB = "A100-40GB"
    A100_80GB = "A100-80GB"
    H100_80GB = "H100-80GB"
    H200_141GB = "H200-141GB"


@dataclass(frozen=True, slots=True, kw_only=True)
class MigProfile:
    """One GPU-instance profile of one GPU model.

    `profile_id` is NVML's GPU-instance profile id (what `nvidia-smi mig -lgip` prints), the same
    on every model for the same shape. `start_slots` are the memory-slice indices at which an
    instance of this profile may start.
    """

    model: GpuModel
    name: str
    profile_id: int
    compute_slices: int
    memory_slices: int
    mem_gb: int
    start_slots: tuple[int, ...]
    max_count: int
    media_extensions: bool = False

    @property
    def mem_mib(self) -> int:
        return int(self.mem_gb * _MIB_PER_GB)

    @property
    def resource_name(self) -> str:
        """The Kubernetes extended resource of this profile under the "mixed" MIG strategy."""
        return f"nvidia.com/mig-{mig_resource_suffix(self.name)}"


# (profile_id, compute slices, memory slices, start slots, max count, media extensions), in
# the order of NVIDIA's profile tables (1g, 1g+me, 1g of two memory slices, 2g, 3g, 4g, 7g:
# ``GpuIdentity.mig_profiles``), smallest first, which `smallest_profile` relies on. The names
# and memory sizes are the GPU identity's, read in `_build_profiles`: no second copy here.
_SHAPES: tuple[tuple[int, int, int, tuple[int, ...], int, bool], ...] = (
    (19, 1, 1, (0, 1, 2, 3, 4, 5, 6), 7, False),
    (20, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1, True),
    (15, 1, 2, (0, 2, 4, 6), 4, False),
    (14, 2, 2, (0, 2, 4), 3, False),
    (9, 3, 4, (0, 4), 2, False),
    (5, 4, 4, (0,), 1, False),
    (0, 7, 8, (0,), 1, False),
)


def _identity(model: GpuModel) -> GpuIdentity:
    gpu = identify(model.value).identity
    assert gpu is not None, model  # each value is a short name the identity knows
    return gpu


def _build_profiles() -> dict[GpuModel, tuple[MigProfile, ...]]:
    """Each model's profiles: NVIDIA's names from the GPU identity's table (``GpuIdentity.
    mig_profiles``), on this module's shapes; a table of another shape is refused at import."""
    table: dict[GpuModel, tuple[MigProfile, ...]] = {}
    for model in GpuModel:
        names = _identity(model).mig_profiles
        rows = []
        for (pid, compute, memory, starts, max_count, me), name in zip(_SHAPES, names, strict=True):
            read = parse_mig_profile(name)
            if read is None or (read.gi_slices, read.engines == "+me") != (compute, me):
                raise ValueError(f"{model}'s MIG profile {name!r} is not the shape {pid} here")
            rows.append(
                MigProfile(
                    model=model,
                    name=name,
                    profile_id=pid,
                    compute_slices=compute,
                    memory_slices=memory,
                    mem_gb=read.memory_gb,
                    start_slots=starts,
                    max_count=max_count,
                    media_extensions=me,
                )
            )
        table[model] = tuple(rows)
    return table


MIG_PROFILES: Mapping[GpuModel, tuple[MigProfile, ...]] = _build_profiles()


# A GPU carves as one of the models above where its identity's published profile table and its
# architecture are that model's: the China market's A800 / H800 as their siblings (the tables
# group them, as mig-parted does), the A100 and H100 80 GB apart though their tables agree.
# Parts with another table (the 94 GB H100s, the H800 NVL) or none (H20, GH200, Blackwell) get
# no MIG plan.
_GEOMETRY: Mapping[tuple[tuple[str, ...], str], GpuModel] = {
    (_identity(m).mig_profiles, _identity(m).architecture): m for m in GpuModel
}


def mig_model(model: str) -> GpuModel | None:
    """The MIG geometry of a GPU as its inventory names it (``NVIDIA H100 80GB HBM3``,
    ``NVIDIA-A100-SXM4-40GB``, ``NVIDIA H200``, the short ``A100``): the one GPU identity
    (``seedance.events.gpus``) says which model it is, so ``A100`` is the 80 GB part the
    replayed fleets and the price book mean, and an unknown name has none."""
    gpu = identify(model).identity
    if gpu is None or not gpu.mig_profiles:
        return None
    return _GEOMETRY.get((gpu.mig_profiles, gpu.architecture))


def profiles(model: GpuModel) -> tuple[MigProfile, ...]:
    """All profiles of `model`, smallest first."""
    return MIG_PROFILES[model]


def profile(model: GpuModel, name: str) -> MigProfile:
    """The profile called `name` on `model`; KeyError naming both when there is none."""
    for p in MIG_PROFILES[model]:
        if p.name == name:
            return p
    known = ", ".join(p.name for p in MIG_PROFILES[model])
    raise KeyError(f"no MIG profile {name!r} on {model}: known profiles are {known}")


def smallest_profile(
    model: GpuModel,
    mem_mib: int,
    *,
    compute_slices: int = 1,
    media_extensions: bool = False,
) -> MigProfile | None:
    """The smallest profile with at least `mem_mib` memory and `compute_slices` compute slices.

    "Smallest" means fewest memory slices, then fewest compute slices: memory slices are the
    scarcer resource (8 against 7 compute, and the position rules apply to them). `+me`
    profiles are only returned when `media_extensions` is asked for, since only one instance
    per GPU may have them. None when no profile is big enough.
    """
    if mem_mib < 0 or compute_slices < 0:
        raise ValueError(f"mem_mib={mem_mib} and compute_slices={compute_slices} must be >= 0")
    fits = [
        p
        for p in MIG_PROFILES[model]
        if p.media_extensions == media_extensions
        and p.mem_mib >= mem_mib
        and p.compute_slices >= compute_slices
    ]
    if not fits:
        return None
    return min(fits, key=lambda p: (p.memory_slices, p.compute_slices, p.profile_id))


@dataclass(frozen=True, slots=True, kw_only=True)
class MigInstance:
    """A GPU instance: a profile at a start slot, with its UUID once the driver created it."""

    profile: MigProfile
    start: int
    uuid: str | None = None

    @property
    def slots(self) -> range:
        return range(self.start, self.start + self.profile.memory_slices)

    @property
    def key(self) -> tuple[int, int]:
        """Identity for planning: (profile id, start). Two instances with it are the same cut."""
        return (self.profile.profile_id, self.start)


@dataclass(frozen=True, slots=True)
class MigLayout:
    """The instances on one GPU. Immutable: `place` and `remove` return new layouts."""

    model: GpuModel
    instances: tuple[MigInstance, ...] = ()

    @property
    def used_mask(self) -> int:
        """Bit i set when memory slice i is taken."""
        mask = 0
        for inst in self.instances:
            for s in inst.slots:
                mask |= 1 << s
        return mask

    @property
    def used_compute_slices(self) -> int:
        return sum(i.profile.compute_slices for i in self.instances)

    @property
    def free_compute_slices(self) -> int:
        return COMPUTE_SLICES - self.used_compute_slices

    @property
    def free_memory_slices(self) -> int:
        return MEMORY_SLICES - self.used_mask.bit_count()

    def can_place(self, prof: MigProfile, start: int) -> bool:
        """Whether an instance of `prof` can be created at `start` now."""
        if prof.model != self.model or start not in prof.start_slots:
            return False
        if len(self.instances) >= MAX_INSTANCES:
            return False
        if prof.compute_slices > self.free_compute_slices:
            return False
        if prof.media_extensions and any(i.profile.media_extensions for i in self.instances):
            return False
        if sum(1 for i in self.instances if i.profile == prof) >= prof.max_count:
            return False
        want = ((1 << prof.memory_slices) - 1) << start
        return not (self.used_mask & want)

    def feasible_starts(self, prof: MigProfile) -> tuple[int, ...]:
        return tuple(s for s in prof.start_slots if self.can_place(prof, s))

    def place(self, prof: MigProfile, start: int, *, uuid: str | None = None) -> MigLayout:
        if not self.can_place(prof, start):
            raise ValueError(
                f"cannot place {prof.name} at slot {start} on {self.model} "
                f"(used slices mask {self.used_mask:08b}, "
                f"free compute {self.free_compute_slices})"
            )
        inst = MigInstance(profile=prof, start=start, uuid=uuid)
        return MigLayout(self.model, (*self.instances, inst))

    def remove(self, start: int) -> MigLayout:
        kept = tuple(i for i in self.instances if i.start != start)
        if len(kept) == len(self.instances):
            raise ValueError(f"no instance starts at slot {start} on this {self.model}")
        return MigLayout(self.model, kept)


def placeable_counts(layout: MigLayout) -> tuple[int, ...]:
    """For each non-`+me` profile, largest first: how many more instances of it alone would fit.

    Each profile's start slots are aligned to its size, so candidate placements of one profile
    never overlap one another and taking them greedily is exact.
    """
    counts = []
    for prof in reversed(MIG_PROFILES[layout.model]):
        if prof.media_extensions:
            continue
        cur = layout
        n = 0
        for s in prof.start_slots:
            if cur.can_place(prof, s):
                cur = cur.place(prof, s)
                n += 1
        counts.append(n)
    return tuple(counts)


def _future_score(layout: MigLayout, demand: Mapping[str, float] | None) -> tuple[float, ...]:
    counts = placeable_counts(layout)
    if demand is None:
        return tuple(float(c) for c in counts)
    names = [p.name for p in reversed(MIG_PROFILES[layout.model]) if not p.media_extensions]
    weighted = sum(demand.get(n, 0.0) * c for n, c in zip(names, counts, strict=True))
    # The lexicographic counts break ties between equally good weighted choices.
    return (weighted, *(float(c) for c in counts))


def choose_start(
    layout: MigLayout,
    prof: MigProfile,
    *,
    demand: Mapping[str, float] | None = None,
) -> int | None:
    """The start slot for a new `prof` instance that keeps the most future placements possible.

    Each feasible start is scored by what stays placeable afterwards (`placeable_counts`):
    without `demand`, lexicographically from the largest profile down (keep a 7g, then a 4g,
    then two 3g, ...); with `demand` (profile name -> expected weight), by the demand-weighted
    count first. Ties go to the highest start, which keeps slot 0, where 4g and 7g must start,
    free for longest. None when no start is feasible.

    Drivers place at the first free start; that is `naive_start`, kept for comparison.
    """
    best: tuple[tuple[float, ...], int] | None = None
    for s in layout.feasible_starts(prof):
        score = (_future_score(layout.place(prof, s), demand), s)
        if best is None or score > best:
            best = score
    return None if best is None else best[1]


def naive_start(layout: MigLayout, prof: MigProfile) -> int | None:
    """The lowest feasible start slot: what a driver does when no placement is given."""
    starts = layout.feasible_starts(prof)
    return starts[0] if starts else None


@dataclass(frozen=True, slots=True, kw_only=True)
class MigPlan:
    """How to re-cut one GPU: destroy these instances, then create those, in that order.

    `kept` instances stay as they are (no drain needed for them). `unmet` counts the demanded
    instances, by profile name, that the plan could not fit.
    """

    model: GpuModel
    destroy: tuple[MigInstance, ...]
    create: tuple[MigInstance, ...]
    kept: tuple[MigInstance, ...]
    unmet: Mapping[str, int]

    @property
    def target(self) -> MigLayout:
        return MigLayout(self.model, (*self.kept, *self.create))

    @property
    def is_noop(self) -> bool:
        return not self.destroy and not self.create


def plan_repartition(
    current: MigLayout,
    demand: Mapping[str, int],
    *,
    pinned_starts: Iterable[int] = (),
) -> MigPlan:
    """Plan the layout of a draining GPU for a target demand (profile name -> instance count).

    The plan maximises, in this order: the compute slices of demand it satisfies, then its
    memory slices (a bigger profile asked for is worth more than a smaller one), the current
    instances it keeps in place (each one kept is one fewer destroy/create and one fewer
    workload to drain), and what stays placeable afterwards. Instances at `pinned_starts` are
    still busy and are kept whatever the demand; they count towards the demand of their
    profile. Every other current instance is destroyed unless the plan keeps it.

    The search is exact: a GPU has 8 memory slices, so the distinct layouts number in the low
    thousands and are memoised.
    """
    model = current.model
    pinned, remaining = _pinned_and_remaining(current, demand, pinned_starts)

    current_keys = {i.key for i in current.instances}
    # Largest demand first: big shapes have the fewest legal starts.
    groups = sorted(
        ((profile(model, n), c) for n, c in remaining.items() if c > 0),
        key=lambda pc: (-pc[0].memory_slices, -pc[0].compute_slices, pc[0].profile_id),
    )

    @functools.cache
    def best(
        group: int, left: int, placed: frozenset[tuple[int, int]]
    ) -> tuple[tuple[float, ...], frozenset[tuple[int, int]]]:
        layout = _layout_of(model, pinned, placed)
        if group == len(groups):
            shapes = [_profile_by_id(model, pid) for pid, _ in placed]
            compute = sum(p.compute_slices for p in shapes)
            memory = sum(p.memory_slices for p in shapes)
            kept = len(placed & current_keys)
            return ((compute, memory, kept, *_future_score(layout, None)), placed)
        prof, _ = groups[group]
        next_left = groups[group + 1][1] if group + 1 < len(groups) else 0
        options = [best(group + 1, next_left, placed)]  # place no more of this profile
        if left > 0:
            for s in layout.feasible_starts(prof):
                key = (prof.profile_id, s)
                # Same-profile instances are interchangeable: only try starts in increasing
                # order so each set of starts is explored once.
                if any(p == prof.profile_id and st > s for p, st in placed):
                    continue
                options.append(best(group, left - 1, placed | {key}))
        return max(options, key=lambda o: o[0])

    placed: frozenset[tuple[int, int]] = frozenset()
    if groups:
        _, placed = best(0, groups[0][1], placed)
    target = _layout_of(model, pinned, placed)
    current_by_key = {i.key: i for i in current.instances}
    kept = tuple(current_by_key[i.key] for i in target.instances if i.key in current_by_key)
    kept_keys = {i.key for i in kept}
    create = tuple(i for i in target.instances if i.key not in current_by_key)
    destroy = tuple(i for i in current.instances if i.key not in kept_keys)
    got: dict[str, int] = {}
    for inst in target.instances:
        got[inst.profile.name] = got.get(inst.profile.name, 0) + 1
    unmet = {n: c - got.get(n, 0) for n, c in demand.items() if c - got.get(n, 0) > 0}
    return MigPlan(model=model, destroy=destroy, create=create, kept=kept, unmet=unmet)


def _pinned_and_remaining(
    current: MigLayout, demand: Mapping[str, int], pinned_starts: Iterable[int]
) -> tuple[tuple[MigInstance, ...], dict[str, int]]:
    """The pinned instances, and the demand they leave (ValueError on a bad input)."""
    pinned_set = set(pinned_starts)
    by_start = {i.start: i for i in current.instances}
    missing = pinned_set - by_start.keys()
    if missing:
        raise ValueError(f"pinned_starts {sorted(missing)} have no instance on this GPU")
    pinned = tuple(by_start[s] for s in sorted(pinned_set))
    remaining: dict[str, int] = {}
    for name, count in demand.items():
        if count < 0:
            raise ValueError(f"demand for {name!r} is {count}; counts must be >= 0")
        profile(current.model, name)  # raises with the known names
        remaining[name] = count
    for inst in pinned:
        if remaining.get(inst.profile.name, 0) > 0:
            remaining[inst.profile.name] -= 1
    return pinned, remaining


def _profile_by_id(model: GpuModel, profile_id: int) -> MigProfile:
    for p in MIG_PROFILES[model]:
        if p.profile_id == profile_id:
            return p
    raise KeyError(f"no MIG profile id {profile_id} on {model}")


def _layout_of(
    model: GpuModel, pinned: tuple[MigInstance, ...], placed: frozenset[tuple[int, int]]
) -> MigLayout:
    layout = MigLayout(model, pinned)
    for pid, start in sorted(placed, key=lambda k: (k[1], k[0])):
        layout = layout.place(_profile_by_id(model, pid), start)
    return layout
