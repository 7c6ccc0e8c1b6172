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
``V100M32``, the Alibaba trace's anonymised ``G1``-``G3``), so the slicer, the ledger, the
collector and the bridge agree on one reading (what a request's ``--gpu-model`` means is
``gpu_requests``). And it owns the one reading of a MIG profile's name (``parse_mig_profile``)
and which MIG devices each GPU can hold (``MigName.misfit``): the price book prices what it reads.

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
from dataclasses import dataclass

from seedance.events.mig_tables import MIG_TABLES

__all__ = [
    "GKE_ACCELERATORS",
    "GPU_MODELS",
    "MIG_GPU_INSTANCE_PATTERN",
    "GpuIdentity",
    "MigName",
    "ReportedGpu",
    "canonical_model",
    "families",
    "identify",
    "mig_compute_slices",
    "mig_gpu_instance",
    "mig_profile_of_resource",
    "mig_resource_suffix",
    "name_key",
    "parse_mig_profile",
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
    #: the RTX PRO 5000/6000 Blackwell (MIG user guide, "Supported MIG Profiles": 1g is 1/4 there).
    mig_compute_slices: int = 7
    #: The GPU-instance profiles NVIDIA publishes for this part (``mig_tables.MIG_TABLES``);
    #: empty where none is held here: then the shape all tables share is checked.
    mig_profiles: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReportedGpu:
    """What one reported name means: its model (None: unknown) and what the name adds."""

    name: str
    identity: GpuIdentity | None
    #: The MIG device the name carries (NVML ``MIG 3g.40gb``, GFD ``-MIG-3g.40gb``), where it
    #: is one its GPU can hold (None: no MIG device, or one no GPU can hold: see ``mig_misfit``).
    mig: MigName | None = None
    #: GFD's time-slicing suffix ``-SHARED`` (the GPU is shared; the model is the same).
    shared: bool = False
    #: The name's MIG suffix names a compute instance (``<c>c.<g>g.<m>gb``), valid or not: the
    #: ledger refuses such devices (one cannot tell from names which share a GPU instance).
    compute_instance: bool = False
    #: The name ends in a MIG device suffix (``MIG <n>...``), valid or not.
    mig_named: bool = False
    #: Why the MIG device the name carries cannot exist (then ``identity`` is None).
    mig_misfit: str | None = None

    @property
    def mig_profile(self) -> str | None:
        """The GPU instance's profile (``3g.20gb``; a compute instance's GI: ``1c.3g.20gb``'s)."""
        return self.mig.gpu_instance if self.mig else None

    @property
    def ci_slices(self) -> int | None:
        """A compute instance's slices (``1c.3g.20gb``: 1); None for a whole GPU instance."""
        return self.mig.ci_slices if self.mig else None

    @property
    def mig_device(self) -> str | None:
        """The MIG device as NVML names it, without ``MIG``: ``3g.20gb``, ``1c.3g.20gb``."""
        return str(self.mig) if self.mig else None

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
    table = MIG_TABLES.get((family, memory_gb)) if mig else None
    return GpuIdentity(
        model=model, family=family, memory_gb=memory_gb, form_factor=form, architecture=arch,
        mig_capable=mig, aliases=aliases, anonymised=anonymised, mig_compute_slices=mig_slices,
        mig_profiles=table or (),
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
    # The 94 GB H100s: the MIG user guide's "Supported GPUs" lists H100-SXM5 94GB and H100-PCIE
    # 94GB (the H100 NVL), both MIG; NVIDIA's vGPU tables name them "NVIDIA H100 SXM5 94GB" and
    # "NVIDIA H100 PCIe 94GB (H100 NVL)". NVML names the NVL ``NVIDIA H100 NVL`` (0x2321) and the
    # SXM5 94GB only ``NVIDIA H100`` (0x2339, NVIDIA/open-gpu-kernel-modules README's supported
    # GPUs), which the short ``H100`` already means (the 80 GB SXM5, as the book priced it): such
    # a board is identified only by a name that carries its memory.
    _gpu("H100-NVL-94GB", "H100", 94, "NVL", "Hopper", "H100-NVL", "H100-PCIE-94GB", mig=True),
    _gpu("H100-SXM5-94GB", "H100", 94, "SXM5", "Hopper", mig=True),
    _gpu("H800-PCIE-80GB", "H800", 80, "PCIe", "Hopper", "H800-PCIE", mig=True),
    # NVML: ``NVIDIA H800 NVL`` (0x233A, the same README); 94 GB and MIG as the H100 NVL, as
    # mig-parted's config groups them ("H100 NVL, H800 NVL": 3g.47gb, 7g.94gb).
    _gpu("H800-NVL-94GB", "H800", 94, "NVL", "Hopper", "H800-NVL", mig=True),
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
    # The MIG user guide's "Supported GPUs": the RTX PRO 6000 Blackwell Server, Workstation and
    # Max-Q Workstation Editions (96 GB) and the RTX PRO 5000 Blackwell (48 GB), named as NVML
    # does ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition"). Both carve in quarters: the
    # guide's "Supported MIG Profiles" (v580, tables 10 and 11) gives 1g.12gb and 1g.24gb a 1/4
    # of the SMs and memory, and 4g.48gb / 4g.96gb the whole GPU ("Supported GPUs" says at most
    # 2 instances on the 5000; its profile table counts one 1g.12gb beside three 1g.12gb-me,
    # and a 1g bills a quarter either way). NVML names a 72 GB RTX PRO 5000 the same (``RTX PRO
    # 5000 Blackwell``, 73415 MiB in public logs): only a name with its memory fixes the 48 GB.
    *(
        _gpu(
            f"RTX-PRO-6000-BLACKWELL-{edition}-96GB",
            "RTX-PRO-6000",
            96,
            "PCIe",
            "Blackwell",
            f"RTX-PRO-6000-BLACKWELL-{edition}-EDITION",
            mig=True,
            mig_slices=4,
        )
        for edition in ("SERVER", "WORKSTATION", "MAX-Q-WORKSTATION")
    ),
    _gpu(
        "RTX-PRO-5000-BLACKWELL-48GB",
        "RTX-PRO-5000",
        48,
        "PCIe",
        "Blackwell",
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

Key = tuple[str, frozenset[str]]


@dataclass(frozen=True, slots=True)
class _Parsed:
    toks: list[str]
    mig: MigName | None = None
    shared: bool = False
    cloud: str | None = None  # the model a cloud's accelerator type names
    mig_text: str | None = None  # the MIG suffix as written (upper case), valid or not


def _parse(name: str) -> _Parsed:
    """Upper-case tokens of ``name`` without vendor prefix, MIG suffix or ``SHARED``."""
    toks = [t for t in _SEPARATORS.split(name.strip().upper()) if t]
    if toks[:1] == ["NVIDIA"]:
        toks.pop(0)
    shared = bool(toks) and toks[-1] == "SHARED"
    if shared:
        toks.pop()
    # ``MIG <profile>``; an engine suffix after ``-`` (``1g.24gb-me``) is a token of its own.
    text: str | None = None
    if len(toks) >= 3 and toks[-3] == "MIG" and toks[-2][:1].isdigit():
        text, toks = f"{toks[-2]}-{toks[-1]}", toks[:-3]
    elif len(toks) >= 2 and toks[-2] == "MIG" and toks[-1][:1].isdigit():
        text, toks = toks[-1], toks[:-2]
    # A cloud's accelerator type, with or without its vendor word (``nvidia-tesla-a100``,
    # ``Tesla A100``: ``NVIDIA`` never matters, so both are Google's 40 GB part).
    cloud = _CLOUD_NAMES.get("-".join(toks))
    while toks and toks[0] in _VENDOR:
        toks.pop(0)
    mig = parse_mig_profile(text) if text is not None else None
    return _Parsed(toks, mig, shared, cloud, text)


def _tokens(name: str) -> list[str]:
    return _parse(name).toks


def _key(toks: list[str]) -> Key | None:
    # The family leads; what follows (memory, form, memory type) is a set: vendors order it
    # differently (``A100 80GB PCIe`` vs ``A100-PCIE-80GB``).
    return (toks[0], frozenset(toks[1:])) if toks else None


def _index() -> dict[Key, GpuIdentity]:
    out: dict[Key, GpuIdentity] = {}
    for gpu in GPU_MODELS:
        for alias in (gpu.model, *gpu.aliases):
            key = _key(_tokens(alias))
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
    device no GPU can hold is unknown, its profile dropped and ``mig_misfit`` saying why (see
    ``MigName.misfit``): a profile not written as NVIDIA writes them (``07g.80gb``), a compute
    instance of ``0`` or of all its GPU instance's slices, a GPU instance larger than its GPU,
    one its GPU's published table lacks (``7g.10gb`` on an 80 GB A100) or a MIG device of a
    part without MIG (``RTX A6000 MIG 1g.6gb``)."""
    p = _parse(name)
    key = _key(p.toks)
    gpu = _BY_MODEL[p.cloud] if p.cloud else (_BY_KEY.get(key) if key else None)
    if p.mig_text is None:
        return ReportedGpu(name=name, identity=gpu, shared=p.shared)
    ci = re.match(r"[0-9]+C\.", p.mig_text, re.ASCII) is not None
    misfit = p.mig.misfit(gpu) if p.mig else f"{p.mig_text.lower()} {_NOT_A_DEVICE}"
    if misfit is not None:
        return ReportedGpu(
            name=name, identity=None, shared=p.shared, compute_instance=ci, mig_named=True,
            mig_misfit=misfit,
        )  # fmt: skip
    return ReportedGpu(
        name=name, identity=gpu, mig=p.mig, shared=p.shared, compute_instance=ci, mig_named=True
    )


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
    return "-".join(_tokens(name))


def families() -> tuple[str, ...]:
    """The families a request may name (``A100``, ``H100``, ...)."""
    return tuple(sorted(set(_FAMILIES.values())))


# ------------------------------------------------------------------------------ MIG names

# NVIDIA's MIG device names (MIG user guide, "MIG Device Names" and "Supported MIG Profiles") are
# ``[<c>c.]<g>g.<m>gb`` and an optional engine suffix: ``+me`` (media extensions: the GI holds
# the decoders, JPEG and OFA; A30/A100/H100/H200/B200), and on the RTX PRO 6000 Blackwell also
# ``+me.all`` (all media engines), ``+gfx`` (graphics) and ``-me`` (no media engines), as the
# guide's table and NVIDIA mig-parted's config (``1g.24gb-me``, ``1g.24gb+me.all``) write them.
# NVIDIA's device plugin and GPU feature discovery write ``+`` as ``.``, since a resource or
# label name has no ``+`` (k8s-device-plugin internal/resource/nvml-mig-device.go, ``GetName``):
# ``1g.10gb.me`` is ``1g.10gb+me``. Numbers have no leading zeros and at most four digits (no MIG
# part has more than 7 slices or 9,999 GB; a longer one would only cost ``int`` its 4,300-digit
# limit). Anything else (``07g.80gb``, ``1g.10gb+foo``) is no name NVIDIA gives.
# Digits are ``[0-9]`` and every match is whole (``fullmatch``, ASCII case): Python's ``\d``
# takes ``٠`` and its ``$`` a trailing newline, which the CRD's RE2 refuses, and the parser
# and the API server must read one key alike.
_NUMBER = r"(0|[1-9][0-9]{0,3})"
_GPU_INSTANCE = rf"{_NUMBER}g\.{_NUMBER}gb([+.]me\.all|[+.]me|[+.]gfx|-me)?"
_MIG_NAME = re.compile(rf"(?:{_NUMBER}c\.)?{_GPU_INSTANCE}", re.ASCII)
#: A GPU instance's profile in any spelling ``parse_mig_profile`` reads (any case; no compute
#: instance, no ``MIG`` word, no blanks): for a schema that cannot call it (the TenantQuota
#: CRD's CEL rule, RE2 syntax); ``mig_gpu_instance`` is what then tells a real profile.
MIG_GPU_INSTANCE_PATTERN = rf"(?i)^{_GPU_INSTANCE}$"
_ENGINES = "[+me|+me.all|+gfx|-me]"
_NOT_A_DEVICE = f"is not a MIG device as NVIDIA names them ('[<c>c.]<g>g.<m>gb{_ENGINES}')"
_NOT_A_PROFILE = f"is not a MIG profile as NVIDIA names them ('<g>g.<m>gb{_ENGINES}')"
# What a key copied from elsewhere carries before the profile: ``nvidia-smi mig -lgip``'s
# column (``MIG 1g.10gb``) and the device plugin's resource name (``nvidia.com/mig-1g.10gb.me``).
_COPIED_PREFIX = re.compile(r"(?i)(?:mig\s+|nvidia\.com/mig-)(.*)", re.ASCII | re.DOTALL)


@dataclass(frozen=True, slots=True)
class MigName:
    """One MIG device's name read: ``1c.3g.20gb`` is a compute instance of 1 slice in the GPU
    instance ``3g.20gb`` (3 compute slices, 20 GB). Not ``MigProfile``: the slicer's
    ``MigProfile`` is a profile's geometry on one GPU model (start slots, counts)."""

    gi_slices: int
    memory_gb: int
    ci_slices: int | None = None
    #: The engine suffix as NVIDIA writes it: ``""``, ``+me``, ``+me.all``, ``+gfx`` or ``-me``.
    engines: str = ""

    @property
    def gpu_instance(self) -> str:
        """The GPU instance's profile: ``3g.20gb`` (of ``1c.3g.20gb`` too), ``1g.10gb+me``."""
        return f"{self.gi_slices}g.{self.memory_gb}gb{self.engines}"

    @property
    def compute_slices(self) -> int:
        """The compute slices the device holds (a compute instance's own, else its GI's)."""
        return self.ci_slices if self.ci_slices is not None else self.gi_slices

    def __str__(self) -> str:
        ci = f"{self.ci_slices}c." if self.ci_slices is not None else ""
        return ci + self.gpu_instance

    def misfit(self, gpu: GpuIdentity | None) -> str | None:
        """Why no ``gpu`` (None: a GPU the table does not know) holds this device; None where
        one can. A compute instance has 1 to ``g - 1`` slices: one of all its GI's slices is
        named by its GI (``3g.20gb``, never ``3c.3g.20gb``: "the CI sizing is implied in the
        device name", MIG user guide, "MIG Device Names"). A GI has 1 to the GPU's compute
        slices (an unknown GPU's: the most any MIG GPU has) and, on a part with a published
        table (``GpuIdentity.mig_profiles``), is one of it; on another, it has the shape every
        published table has (``_gi_shape``)."""
        g, c = self.gi_slices, self.ci_slices
        if c is not None and not 1 <= c < g:
            return (
                f"a {g}g instance has no {c}c (one of all its slices is named {self.gpu_instance})"
            )
        slices = mig_compute_slices(gpu)
        if gpu is not None and not gpu.mig_capable:
            return f"{gpu.model} has no MIG"
        if not 1 <= g <= slices:
            return f"{g} of {slices} compute slices"
        if self.memory_gb < 1:
            return "no memory"
        if gpu is None:
            return None
        if gpu.mig_profiles:
            if self.gpu_instance in gpu.mig_profiles:
                return None
            known = ", ".join(gpu.mig_profiles)
            return f"no GPU instance {self.gpu_instance} on {gpu.model} (NVIDIA's: {known})"
        return _gi_shape(self, gpu)


def _gi_shape(mig: MigName, gpu: GpuIdentity) -> str | None:
    """Why ``gpu``, a MIG part without a published table here, holds no GI ``mig``; None where
    it can. Every table NVIDIA publishes (``MIG_TABLES``, and mig-parted's profiles of the
    GH200, H20, GB200 and B300) has this shape: a ``<g>g`` GI holds ``g`` to ``2g`` eighths of
    the GPU's memory and at most all of it (the H200's 1g.18gb is 141/8 GB, its 1g.35gb two
    eighths, its 3g.71gb four; names round: GB200's 7g.189gb is its 186 GB), and only ``+me``
    on a 1g: ``+gfx``, ``+me.all`` and ``-me`` are the GB20X parts' (tabled above)."""
    g, memory_gb = mig.gi_slices, mig.memory_gb
    if mig.engines and (mig.engines != "+me" or g != 1):
        return f"no {mig.engines} GPU instance on {gpu.model} (NVIDIA gives its 1g +me only)"
    if not gpu.memory_gb:
        return None
    eighths = round(memory_gb * 8 / gpu.memory_gb)
    if eighths > 8:
        return f"{memory_gb} GB is more than {gpu.model}'s {gpu.memory_gb} GB"
    if not g <= eighths <= 2 * g:
        return (
            f"a {g}g instance holds {g} to {min(2 * g, 8)} eighths of {gpu.model}'s "
            f"{gpu.memory_gb} GB, not {memory_gb} GB"
        )
    return None


def parse_mig_profile(text: str) -> MigName | None:
    """The MIG device ``text`` names as NVIDIA writes MIG names (``3g.40gb``, ``1c.3g.20gb``,
    ``1g.10gb+me``, ``1g.24gb-me``; the device plugin's ``1g.10gb.me`` as ``1g.10gb+me``; any
    case, no ``MIG`` word), or None where it is written
    otherwise. Whether a GPU can hold it is ``MigName.misfit``: ``0c.3g.40gb`` and
    ``9g.80gb`` are read here and fit no GPU there."""
    m = _MIG_NAME.fullmatch(text.strip().lower())
    if m is None:
        return None
    ci, g, memory, engines = m.groups()
    engines = "+" + engines[1:] if engines and engines[0] == "." else (engines or "")
    return MigName(int(g), int(memory), int(ci) if ci is not None else None, engines)


def mig_profile_of_resource(suffix: str) -> str:
    """The MIG profile a device plugin resource or GFD label names after ``nvidia.com/mig-``:
    ``1g.10gb.me`` is ``1g.10gb+me`` (a resource name has no ``+``, so the plugin writes ``.``).
    A suffix that is no MIG name comes back as written, for its reader to refuse by name."""
    mig = parse_mig_profile(suffix)
    profile = str(mig) if mig is not None else suffix
    # only the plugin's own spelling is read (``1G.10GB`` is kept: two spellings of one profile
    # in a pod stay two, refused as such, never merged)
    return profile if mig_resource_suffix(profile) == suffix else suffix


def mig_resource_suffix(profile: str) -> str:
    """What follows ``nvidia.com/mig-`` in the resource serving ``profile`` (``+`` as ``.``)."""
    return profile.replace("+", ".")


def mig_gpu_instance(text: str) -> str:
    """The GPU-instance profile ``text`` names, as NVIDIA writes it, for a key that counts GPU
    instances of any GPU (a tenant's quota): ``1g.10gb.me`` and ``1G.10GB+ME`` are
    ``1g.10gb+me``. ValueError naming ``text`` and why where it names none: no MIG name
    (``3g-40gb``, `` 3g.40gb``; ``MIG 1g.10gb`` and ``nvidia.com/mig-1g.10gb.me`` are told
    what to write), a compute instance (``1c.3g.20gb``: its GI is counted; ``3c.3g.40gb`` is
    none), or a GPU instance no MIG GPU of the table can hold (``9g.80gb``, ``1g.0gb``,
    ``7g.12gb``; ``MigName.misfit``)."""
    if _GPU_INSTANCE_RE.fullmatch(text) is None:
        raise ValueError(f"{text!r} {_why_no_gpu_instance(text)}")
    mig = parse_mig_profile(text)
    assert mig is not None  # the pattern is the parser's
    if not any(mig.misfit(gpu) is None for gpu in _MIG_GPUS):
        engines = f" with {mig.engines}" if mig.engines else ""
        why = mig.misfit(None) or (
            f"no MIG part's table or shape has a {mig.gi_slices}g of {mig.memory_gb} GB{engines}"
        )
        raise ValueError(f"{text!r} is a GPU instance no MIG GPU can hold ({why})")
    return mig.gpu_instance


def _why_no_gpu_instance(text: str) -> str:
    device = parse_mig_profile(text) if _MIG_NAME.fullmatch(text.lower()) else None
    if device is not None:  # a compute instance's name, real or not
        why = device.misfit(None)
        if why is not None:
            return f"is no MIG device ({why})"
        return f"is a compute instance: count its GPU instance {device.gpu_instance}"
    copied = _COPIED_PREFIX.fullmatch(text)
    if copied and _GPU_INSTANCE_RE.fullmatch(copied[1]):
        return f"{_NOT_A_PROFILE}: write {copied[1]!r}"
    return _NOT_A_PROFILE


def mig_compute_slices(gpu: GpuIdentity | None) -> int:
    """The compute slices of ``gpu``'s whole GPU in MIG mode; where the model is unknown, the
    most any MIG GPU has (7), which is what its MIG devices are read against."""
    return gpu.mig_compute_slices if gpu is not None else _MAX_MIG_SLICES


_MIG_GPUS = tuple(g for g in GPU_MODELS if g.mig_capable)
_MAX_MIG_SLICES = max(g.mig_compute_slices for g in _MIG_GPUS)
_GPU_INSTANCE_RE = re.compile(MIG_GPU_INSTANCE_PATTERN, re.ASCII)
