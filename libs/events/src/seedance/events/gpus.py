"""One GPU identity: the canonical model behind any name a real system reports.

Owns the table of NVIDIA data-center GPU models from Volta to Blackwell (family, memory, form
factor, architecture, MIG) and the one function that maps a reported name onto it,
``identify``: NVML names (``NVIDIA A100-SXM4-80GB``, ``Tesla T4``, ``NVIDIA H100 80GB HBM3``,
older drivers without the vendor prefix), NVML MIG device names (``... MIG 3g.40gb``), GPU
feature discovery's ``nvidia.com/gpu.product`` labels (``NVIDIA-A100-SXM4-80GB``, older
``A100-SXM4-80GB``, ``Tesla-T4``, the MIG single strategy's ``...-MIG-1g.5gb``, time-slicing's
``...-SHARED``), NVML compute-instance names (``... MIG 1c.3g.20gb``: the GPU instance
``3g.20gb`` and one of its compute slices), cloud names (``A10G``, Google Cloud's accelerator
types ``GKE_ACCELERATORS``), the China-market parts in real traces (``H800``,
``A800-SXM4-80GB``, ``H20``) and the short names the replayed fleets carry (``T4``, ``A100``,
``V100M32``, the Alibaba trace's anonymised ``G1``-``G3``). It also owns what a request's
``--gpu-model`` means (``match_models``: ``a100`` is any A100, ``a100-80gb`` an 80 GB one) so
the slicer, the ledger, the collector and the bridge agree on one reading.

Why here, beside ``tokens.py``: ``gpu_model`` is a field of the bus's events and every service
and the SDK already depend on this package; the identity is plain data and pure functions (no
I/O, no service), which is what this package may hold. Must not price anything (the ledger's
price book is keyed by ``GpuIdentity.model``) nor hold a fleet's state.

Names are matched exactly after normalisation, never by guessing: case, ``-``/``_``/spaces, the
vendor prefixes ``NVIDIA`` / ``Tesla`` and the order of the tokens after the family
(``A100 80GB PCIe`` = ``A100-PCIE-80GB``) do not matter; anything else unknown stays unknown, so
a new part is billed at the price book's fallback and flagged rather than silently taken for its
neighbour. The short names keep the meaning the bundled price book always gave them (``A100``
was priced as the A100 SXM4 80 GB, ``H100`` as the SXM5): an A100 40 GB fleet should report its
real name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "GKE_ACCELERATORS",
    "GPU_MODELS",
    "GpuIdentity",
    "ModelMatch",
    "ReportedGpu",
    "canonical_model",
    "families",
    "identify",
    "match_models",
    "name_key",
]


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """One canonical GPU model. ``model`` is the key every price and report uses."""

    model: str
    family: str
    memory_gb: int | None
    form_factor: str  # SXM2/SXM4/SXM5/SXM6/SXM/PCIe/NVL/"" (one form only, or undisclosed)
    architecture: str
    mig_capable: bool = False
    #: Other spellings that name exactly this model (normalised as ``identify`` does).
    aliases: tuple[str, ...] = ()
    #: The model is anonymised by a trace's publisher (no public facts about it).
    anonymised: bool = False
    #: Compute slices of the whole GPU in MIG mode: 7 on A100/H100/H200/B200, 4 on the A30 and
    #: the RTX PRO 6000 Blackwell (MIG user guide, "Supported MIG Profiles": 1g is 1/4 there).
    mig_compute_slices: int = 7


@dataclass(frozen=True, slots=True)
class ReportedGpu:
    """What one reported name means: its model (None: unknown) and what the name adds."""

    name: str
    identity: GpuIdentity | None
    #: The MIG profile a MIG device's name carries (NVML ``MIG 3g.40gb``, GFD ``-MIG-3g.40gb``):
    #: for a compute instance smaller than its GPU instance (NVML ``MIG 1c.3g.20gb``), the
    #: profile of the GPU instance it runs in (``3g.20gb``), its compute slices in ``ci_slices``.
    mig_profile: str | None = None
    #: GFD's time-slicing suffix ``-SHARED`` (the GPU is shared; the model is the same).
    shared: bool = False
    #: The compute slices of a compute instance smaller than its GPU instance (``1c.3g.20gb``:
    #: 1); None where the MIG device is a whole GPU instance (or no MIG device at all).
    ci_slices: int | None = None
    #: The name's MIG suffix names a compute instance (``<c>c.<g>g.<m>gb``), valid or not: the
    #: ledger refuses such devices (one cannot tell from names which share a GPU instance).
    compute_instance: bool = False
    #: The name ends in a MIG device suffix, valid or not (``mig_profile`` only where valid).
    mig_named: bool = False

    @property
    def mig_device(self) -> str | None:
        """The MIG device as NVML names it, without ``MIG``: ``3g.20gb``, ``1c.3g.20gb``."""
        if self.mig_profile is None or self.ci_slices is None:
            return self.mig_profile
        return f"{self.ci_slices}c.{self.mig_profile}"

    @property
    def model(self) -> str:
        """The canonical model, or the name as reported (stripped) where unknown."""
        return self.identity.model if self.identity else self.name.strip()

    @property
    def known(self) -> bool:
        return self.identity is not None


def _gpu(
    model: str, family: str, memory_gb: int | None, form: str, arch: str, *aliases: str,
    mig: bool = False, anonymised: bool = False, mig_slices: int = 7,
) -> GpuIdentity:  # fmt: skip
    return GpuIdentity(
        model=model, family=family, memory_gb=memory_gb, form_factor=form, architecture=arch,
        mig_capable=mig, aliases=aliases, anonymised=anonymised, mig_compute_slices=mig_slices,
    )  # fmt: skip


# The aliases are the names real systems report, each seen where the test corpus
# (tests/fixtures/gpu_names/corpus.toml) says; the canonical id is itself an alias. Memory is the
# datasheet's GB figure (MIG profiles are named after it); MIG-capable parts per NVIDIA's MIG
# user guide (A30, A100/A800, H100/H800/H20, H200, GH200, B200/B300 and GB200/GB300).
GPU_MODELS: tuple[GpuIdentity, ...] = (
    # Pascal: only because the Alibaba 2023 trace's fleet holds P100s.
    _gpu("P100-PCIE-16GB", "P100", 16, "PCIe", "Pascal", "P100"),
    _gpu("P100-SXM2-16GB", "P100", 16, "SXM2", "Pascal"),
    # Volta
    _gpu("V100-SXM2-16GB", "V100", 16, "SXM2", "Volta", "V100M16"),
    _gpu("V100-SXM2-32GB", "V100", 32, "SXM2", "Volta", "V100M32"),
    _gpu("V100-PCIE-16GB", "V100", 16, "PCIe", "Volta", "V100-FHHL-16GB"),
    _gpu("V100-PCIE-32GB", "V100", 32, "PCIe", "Volta"),
    _gpu("V100S-PCIE-32GB", "V100S", 32, "PCIe", "Volta"),
    # Turing
    _gpu("T4-PCIE-16GB", "T4", 16, "PCIe", "Turing", "T4"),
    _gpu("T4G-16GB", "T4G", 16, "", "Turing", "T4G"),
    # Ampere
    _gpu("A2-PCIE-16GB", "A2", 16, "PCIe", "Ampere", "A2"),
    _gpu("A10-PCIE-24GB", "A10", 24, "PCIe", "Ampere", "A10"),
    _gpu("A10G-PCIE-24GB", "A10G", 24, "PCIe", "Ampere", "A10G"),
    _gpu("A16-PCIE-16GB", "A16", 16, "PCIe", "Ampere", "A16"),
    _gpu("A30-PCIE-24GB", "A30", 24, "PCIe", "Ampere", "A30", mig=True, mig_slices=4),
    _gpu("A40-PCIE-48GB", "A40", 48, "PCIe", "Ampere", "A40"),
    _gpu("A100-PCIE-40GB", "A100", 40, "PCIe", "Ampere", mig=True),
    _gpu("A100-PCIE-80GB", "A100", 80, "PCIe", "Ampere", mig=True),
    # ``A100-40GB`` / ``A100-80GB`` / ``H100-80GB`` / ``H200-141GB``: the short names the
    # slicer's MIG tables, its fixtures and golden messages carry (the SXM parts, as the
    # bundled book priced them).
    _gpu("A100-SXM4-40GB", "A100", 40, "SXM4", "Ampere", "A100-40GB", mig=True),
    # ``A100`` (short) is what the bundled book priced as this part; ``A100-SXM-80GB`` is how
    # some HGX A100 80 GB boards report themselves.
    _gpu(
        "A100-SXM4-80GB",
        "A100",
        80,
        "SXM4",
        "Ampere",
        "A100",
        "A100-SXM-80GB",
        "A100-80GB",
        mig=True,
    ),
    _gpu("A800-PCIE-40GB", "A800", 40, "PCIe", "Ampere", mig=True),
    _gpu("A800-PCIE-80GB", "A800", 80, "PCIe", "Ampere", mig=True),
    _gpu("A800-SXM4-80GB", "A800", 80, "SXM4", "Ampere", mig=True),
    # Workstation and GeForce boards rented by GPU clouds and marketplaces (NVML names them
    # ``NVIDIA RTX A6000``, ``NVIDIA RTX 6000 Ada Generation``, ``NVIDIA GeForce RTX 4090``).
    _gpu("RTX-A6000-48GB", "RTX-A6000", 48, "PCIe", "Ampere", "RTX-A6000"),
    _gpu("RTX-3090-24GB", "RTX-3090", 24, "PCIe", "Ampere", "GeForce-RTX-3090"),
    _gpu("RTX-6000-ADA-48GB", "RTX-6000-Ada", 48, "PCIe", "Ada", "RTX-6000-Ada-Generation"),
    _gpu("RTX-4090-24GB", "RTX-4090", 24, "PCIe", "Ada", "GeForce-RTX-4090"),
    # Ada Lovelace
    _gpu("L4-PCIE-24GB", "L4", 24, "PCIe", "Ada", "L4"),
    _gpu("L20-PCIE-48GB", "L20", 48, "PCIe", "Ada", "L20"),
    _gpu("L40-PCIE-48GB", "L40", 48, "PCIe", "Ada", "L40"),
    _gpu("L40S-PCIE-48GB", "L40S", 48, "PCIe", "Ada", "L40S"),
    # Hopper. NVML names the H100 SXM5 ``NVIDIA H100 80GB HBM3`` and the H200 SXM ``NVIDIA H200``.
    _gpu("H100-PCIE-80GB", "H100", 80, "PCIe", "Hopper", "H100-PCIE", mig=True),
    _gpu(
        "H100-SXM5-80GB",
        "H100",
        80,
        "SXM5",
        "Hopper",
        "H100",
        "H100-80GB-HBM3",
        "H100-SXM-80GB",
        "H100-80GB",
        mig=True,
    ),
    _gpu("H100-NVL-94GB", "H100", 94, "NVL", "Hopper", "H100-NVL", mig=True),
    _gpu("H800-PCIE-80GB", "H800", 80, "PCIe", "Hopper", "H800-PCIE", mig=True),
    _gpu("H800-SXM5-80GB", "H800", 80, "SXM5", "Hopper", "H800", "H800-80GB-HBM3", mig=True),
    _gpu("H20-SXM-96GB", "H20", 96, "SXM", "Hopper", "H20", mig=True),
    _gpu(
        "H200-SXM-141GB",
        "H200",
        141,
        "SXM",
        "Hopper",
        "H200",
        "H200-141GB-HBM3E",
        "H200-SXM5-141GB",
        "H200-141GB",
        mig=True,
    ),
    _gpu("H200-NVL-141GB", "H200", 141, "NVL", "Hopper", "H200-NVL", mig=True),
    _gpu("GH200-96GB", "GH200", 96, "", "Hopper", "GH200-480GB", mig=True),
    _gpu("GH200-144GB", "GH200", 144, "", "Hopper", "GH200-144G-HBM3E", mig=True),
    # Blackwell
    _gpu("B100-SXM-192GB", "B100", 192, "SXM", "Blackwell", "B100"),
    _gpu("B200-SXM-180GB", "B200", 180, "SXM", "Blackwell", "B200", mig=True),
    _gpu("GB200-186GB", "GB200", 186, "", "Blackwell", "GB200", mig=True),
    _gpu("B300-SXM-288GB", "B300", 288, "SXM", "Blackwell", "B300", "B300-SXM6-AC", mig=True),
    _gpu("GB300-288GB", "GB300", 288, "", "Blackwell", "GB300", mig=True),
    _gpu(
        "RTX-PRO-6000-BLACKWELL-SERVER-96GB",
        "RTX-PRO-6000",
        96,
        "PCIe",
        "Blackwell",
        "RTX-PRO-6000-BLACKWELL-SERVER-EDITION",
        mig=True,
        mig_slices=4,
    ),
    # The Alibaba 2023 trace's anonymised models: real fleets carry them, no public facts exist.
    _gpu("G1", "G1", None, "", "undisclosed", anonymised=True),
    _gpu("G2", "G2", None, "", "undisclosed", anonymised=True),
    _gpu("G3", "G3", None, "", "undisclosed", anonymised=True),
)

_SEPARATORS = re.compile(r"[\s_\-]+")
_VENDOR = {"NVIDIA", "TESLA"}
# A MIG device: ``[<c>c.]<g>g.<m>gb`` and the engine suffixes of the MIG user guide (``+me``,
# ``+gfx``, ``+me.all``; ``-me`` arrives as a separate ``ME`` token, ``-`` being a separator).
_PROFILE = re.compile(r"^(?:(\d+)C\.)?(\d+G\.\d+GB(?:\+[A-Z]+(?:\.[A-Z]+)?)?)$")
# Google Cloud's accelerator types (``--accelerator type=``, GKE's ``cloud.google.com/
# gke-accelerator`` label) whose GPU is certain, as this table names it. From Google's list
# ("Deploy GPU workloads in Autopilot", cloud.google.com/kubernetes-engine/docs/how-to/
# autopilot-gpus; cloud.google.com/compute/docs/gpus) and the Compute Engine machine families
# that carry each: A2 Standard / Ultra, A3 High / Mega / Ultra, A4, G2, N1. Left out: values
# whose form factor or memory the name does not fix (``nvidia-tesla-v100``,
# ``nvidia-tesla-p100``, ``nvidia-gb200``, ``nvidia-rtx-pro-6000``) or that the table does not
# know (``nvidia-tesla-p4``, ``nvidia-tesla-k80``). ``identify`` reads these values before the
# vendor-free reading, which differs for ``nvidia-tesla-a100`` (the A2 Standard's 40 GB part;
# a bare ``A100`` keeps the replayed fleets' 80 GB meaning) and ``nvidia-h100-mega-80gb`` (the
# A3 Mega's H100 SXM: its network differs, not its GPU). The k8s-bridge names GKE nodes by it.
GKE_ACCELERATORS: dict[str, str] = {
    "nvidia-tesla-t4": "T4-PCIE-16GB",
    "nvidia-l4": "L4-PCIE-24GB",
    "nvidia-tesla-a100": "A100-SXM4-40GB",
    "nvidia-a100-80gb": "A100-SXM4-80GB",
    "nvidia-h100-80gb": "H100-SXM5-80GB",
    "nvidia-h100-mega-80gb": "H100-SXM5-80GB",
    "nvidia-h200-141gb": "H200-SXM-141GB",
    "nvidia-b200": "B200-SXM-180GB",
}
_CLOUD_NAMES = {
    name.upper().removeprefix("NVIDIA-"): model for name, model in GKE_ACCELERATORS.items()
}
_MEMORY = re.compile(r"^(\d+)GB?$")
_FORMS = {"SXM", "SXM2", "SXM4", "SXM5", "SXM6", "PCIE", "NVL"}

Key = tuple[str, frozenset[str]]


@dataclass(frozen=True, slots=True)
class _Parsed:
    toks: list[str]
    profile: str | None = None
    shared: bool = False
    ci_slices: int | None = None  # as the name writes it (``0c.``, ``4c.3g``: checked later)
    cloud: str | None = None  # the model a cloud's accelerator type names

    @property
    def gi_slices(self) -> int | None:
        return int(self.profile.split("g.")[0]) if self.profile else None


def _parse(name: str) -> _Parsed:
    """Upper-case tokens of ``name`` without vendor prefix, MIG suffix or ``SHARED``."""
    toks = [t for t in _SEPARATORS.split(name.strip().upper()) if t]
    if toks[:1] == ["NVIDIA"]:
        toks.pop(0)
    shared = bool(toks) and toks[-1] == "SHARED"
    if shared:
        toks.pop()
    minus_me = len(toks) >= 3 and toks[-1] == "ME" and toks[-3] == "MIG"
    tail = toks[:-1] if minus_me else toks
    m = _PROFILE.match(tail[-1]) if len(tail) >= 2 and tail[-2] == "MIG" else None
    profile = ci = None
    if m is not None:
        toks = tail[:-2]
        profile = m.group(2).lower() + ("-me" if minus_me else "")
        ci = int(m.group(1)) if m.group(1) else None
    # A cloud's accelerator type, with or without its vendor word (``nvidia-tesla-a100``,
    # ``Tesla A100``: ``NVIDIA`` never matters, so both are Google's 40 GB part).
    cloud = _CLOUD_NAMES.get("-".join(toks))
    while toks and toks[0] in _VENDOR:
        toks.pop(0)
    return _Parsed(toks, profile, shared, ci, cloud)


def _tokens(name: str) -> tuple[list[str], str | None, bool]:
    p = _parse(name)
    return p.toks, p.profile, p.shared


def _key(toks: list[str]) -> Key | None:
    # The family leads; what follows (memory, form, memory type) is a set: vendors order it
    # differently (``A100 80GB PCIe`` vs ``A100-PCIE-80GB``).
    return (toks[0], frozenset(toks[1:])) if toks else None


def _index() -> dict[Key, GpuIdentity]:
    out: dict[Key, GpuIdentity] = {}
    for gpu in GPU_MODELS:
        for alias in (gpu.model, *gpu.aliases):
            key = _key(_tokens(alias)[0])
            if key is None or key in out:
                raise ValueError(f"GPU alias {alias!r} is empty or names two models")
            out[key] = gpu
    models = {g.model for g in GPU_MODELS}
    for cloud, model in GKE_ACCELERATORS.items():
        if model not in models:
            raise ValueError(f"GKE accelerator {cloud!r} names {model!r}, no model of the table")
    return out


_BY_KEY = _index()
_FAMILIES = {g.family.upper(): g.family for g in GPU_MODELS}


_BY_MODEL = {g.model: g for g in GPU_MODELS}


def identify(name: str) -> ReportedGpu:
    """The canonical model behind ``name`` (``identity`` None: no model of the table). A MIG
    device no GPU can hold is unknown, its profile dropped: a compute instance of ``0`` or of
    all (or more than all) of its GPU instance's slices (NVML names that device by its GI), a
    GPU instance larger than its GPU (``9g.80gb``; any GPU's 7 where the model is unknown) or
    a MIG device of a part without MIG (``RTX A6000 MIG 1g.6gb``)."""
    p = _parse(name)
    key = _key(p.toks)
    gpu = _BY_MODEL[p.cloud] if p.cloud else (_BY_KEY.get(key) if key else None)
    ci = p.ci_slices is not None
    mig = p.profile is not None
    if mig and not _mig_fits(p, gpu):
        return ReportedGpu(
            name=name, identity=None, shared=p.shared, compute_instance=ci, mig_named=True
        )
    return ReportedGpu(
        name=name, identity=gpu, mig_profile=p.profile, shared=p.shared,
        ci_slices=p.ci_slices, compute_instance=ci, mig_named=mig,
    )  # fmt: skip


_MAX_MIG_SLICES = max(g.mig_compute_slices for g in GPU_MODELS if g.mig_capable)


def _mig_fits(p: _Parsed, gpu: GpuIdentity | None) -> bool:
    """Whether the MIG device ``p`` names can exist on ``gpu`` (None: on some MIG GPU)."""
    g = p.gi_slices or 0
    if p.ci_slices is not None and not 1 <= p.ci_slices < g:
        return False
    if gpu is None:
        return 1 <= g <= _MAX_MIG_SLICES
    return gpu.mig_capable and 1 <= g <= gpu.mig_compute_slices


def canonical_model(name: str) -> str:
    """The canonical model id of ``name``, or ``name`` stripped where it is unknown. A MIG
    device's name keeps its profile (``A100-SXM4-80GB-MIG-3g.40gb``, a compute instance its
    slices: ``A100-SXM4-40GB-MIG-1c.3g.20gb``): it is not a whole GPU."""
    got = identify(name)
    if got.identity and got.mig_device:
        return f"{got.identity.model}-MIG-{got.mig_device}"
    return got.model


def name_key(name: str) -> str:
    """``name`` as one comparable spelling (upper case, ``-``-separated, without vendor
    prefix, MIG profile or ``SHARED``): how a price book matches its own aliases for names
    the table does not know (``gpu-series-1`` = ``GPU-series-1``)."""
    return "-".join(_tokens(name)[0])


def families() -> tuple[str, ...]:
    """The families a request may name (``A100``, ``H100``, ...)."""
    return tuple(sorted(set(_FAMILIES.values())))


# ----------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class _Request:
    """What one requested name asks for: a family with optional memory and form, one model,
    or (unknown) the name itself, matched against the fleet's names as written."""

    text: str
    family: str | None = None
    memory_gb: int | None = None
    form: str | None = None
    model: str | None = None

    def accepts(self, fleet_name: str) -> bool:
        got = identify(fleet_name)
        gpu = got.identity
        if self.model is not None:
            return gpu is not None and gpu.model == self.model
        if self.family is None:  # unknown request: the fleet's own (unknown) name, any case
            return _tokens(fleet_name)[0] == _tokens(self.text)[0]
        if gpu is None or gpu.family.upper() != self.family:
            return False
        if self.memory_gb is not None and gpu.memory_gb != self.memory_gb:
            return False
        return self.form is None or gpu.form_factor.upper().startswith(self.form)


def _request(text: str) -> _Request:
    toks, _profile, _shared = _tokens(text)
    if not toks:
        return _Request(text)
    # ``a100``: any A100, whatever a short name meant; ``a100-80gb`` any 80 GB one (SXM4 or
    # PCIe), ``h100-sxm`` any SXM H100: a family (the longest of several words: ``rtx-4090``,
    # ``rtx-pro-6000-96gb``) with memory and form qualifiers.
    for n in range(len(toks), 0, -1):
        family = "-".join(toks[:n])
        if family not in _FAMILIES:
            continue
        memory: int | None = None
        form: str | None = None
        for t in toks[n:]:
            m = _MEMORY.match(t)
            if m:
                memory = int(m.group(1))
            elif t in _FORMS:
                form = t  # ``SXM`` accepts SXM2/4/5/6; ``SXM4`` only SXM4
            else:
                break
        else:
            return _Request(text, family=family, memory_gb=memory, form=form)
        break
    key = _key(toks)
    gpu = _BY_KEY.get(key) if key else None
    if gpu is not None:  # a name with more than qualifiers (``H100 80GB HBM3``): that model
        return _Request(text, model=gpu.model)
    return _Request(text)  # no model we know, or a qualifier we do not: no guess


@dataclass(frozen=True, slots=True)
class ModelMatch:
    """Which of the fleet's model names a request's ``gpu_models`` accept, and why not."""

    requested: tuple[str, ...]
    #: The fleet's names (as they are written there) any request accepts, sorted.
    matched: tuple[str, ...]
    #: Requests that name no model of the table (matched only by the fleet's own names).
    unknown: tuple[str, ...] = ()
    by_request: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def reason(self, available: Iterable[str]) -> str:
        """A sentence for a user when nothing matched: what was asked and what there is."""
        known = sorted(set(available))
        shown = ", ".join(_describe(n) for n in known) or "none"
        asked = ", ".join(self.requested)
        extra = f" ({', '.join(self.unknown)}: no such GPU model known)" if self.unknown else ""
        return f"gpu_models [{asked}] match none of the fleet's models: {shown}{extra}"


def _describe(name: str) -> str:
    model = canonical_model(name)
    return name if model == name else f"{name} ({model})"


def match_models(requested: Iterable[str], available: Iterable[str]) -> ModelMatch:
    """The names of ``available`` (a fleet's model names, as reported) that any of
    ``requested`` (a job's ``gpu_models``) accepts. No request accepts everything."""
    reqs = tuple(dict.fromkeys(requested))
    names = sorted(set(available))
    parsed = [(r, _request(r)) for r in reqs]
    by_request = {r: tuple(n for n in names if p.accepts(n)) for r, p in parsed}
    matched = tuple(sorted({n for ns in by_request.values() for n in ns}))
    unknown = tuple(r for r, p in parsed if p.family is None and p.model is None)
    return ModelMatch(requested=reqs, matched=matched, unknown=unknown, by_request=by_request)
