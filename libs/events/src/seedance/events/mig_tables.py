"""NVIDIA's published MIG GPU-instance profiles of each MIG part, by (family, memory GB).

Owns the tables only: which part they belong to and what a name of a part may carry is the GPU
identity's (``seedance.events.gpus``: ``GpuIdentity.mig_profiles``, ``MigName.misfit``), and the
slicer's geometry (start slots, counts) is ``seedance.slicer.core.mig``'s. Plain data: no I/O.
"""

from __future__ import annotations

__all__ = ["MIG_TABLES"]


def _mig_table(*sizes_gb: int) -> tuple[str, ...]:
    """A 7-slice GPU's profiles from its 1g, 1g (two memory eighths) and 3g sizes and its
    whole memory: NVIDIA's A100/H100/H200 tables all have this one shape."""
    one, two, half, whole = sizes_gb
    return (
        f"1g.{one}gb", f"1g.{one}gb+me", f"1g.{two}gb", f"2g.{two}gb", f"3g.{half}gb",
        f"4g.{half}gb", f"7g.{whole}gb",
    )  # fmt: skip


# NVIDIA's published GPU-instance profiles, by (family, memory GB): the MIG user guide's
# "Supported MIG Profiles" tables (docs.nvidia.com/datacenter/tesla/mig-user-guide/
# supported-mig-profiles.html: A30-24GB, A100-SXM4-40GB and, "names change according to the
# memory proportion", the 80 GB A100; H100 80/94 GB; H200 141 GB; B200 180 GB; RTX PRO 5000
# and 6000 Blackwell), checked against NVIDIA's mig-parted default config (github.com/NVIDIA/
# mig-parted deployments/systemd/config-default.yaml), which groups the China-market A800/H800
# with their siblings. A name of such a part with any other profile (``7g.10gb`` on an 80 GB
# A100: its whole GPU is ``7g.80gb``) is no MIG device it can hold. Parts not here (GH200, H20,
# GB200, B300, GB300) are checked by the shape all those tables share (``MigName.misfit``).
MIG_TABLES: dict[tuple[str, int | None], tuple[str, ...]] = {
    ("A30", 24): ("1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"),
    ("A100", 40): _mig_table(5, 10, 20, 40),
    ("A800", 40): _mig_table(5, 10, 20, 40),
    ("A100", 80): _mig_table(10, 20, 40, 80),
    ("A800", 80): _mig_table(10, 20, 40, 80),
    ("H100", 80): _mig_table(10, 20, 40, 80),
    ("H800", 80): _mig_table(10, 20, 40, 80),
    # mig-parted's config groups the H800 NVL (0x233A) with the H100 NVL (0x2321): all-3g.47gb,
    # all-7g.94gb, all-balanced (1g.12gb, 2g.24gb, 3g.47gb).
    ("H100", 94): _mig_table(12, 24, 47, 94),
    ("H800", 94): _mig_table(12, 24, 47, 94),
    ("H200", 141): _mig_table(18, 35, 71, 141),
    ("B200", 180): _mig_table(23, 45, 90, 180),
    # The GB20X parts (the guide's tables 10 and 11, v580): 1g is a quarter, and the engine
    # suffixes +gfx, +me.all and -me are theirs alone.
    ("RTX-PRO-5000", 48): (
        "1g.12gb",
        "1g.12gb+me",
        "1g.12gb+gfx",
        "1g.12gb-me",
        "2g.24gb-me",
        "4g.48gb",
        "4g.48gb+gfx",
    ),
    ("RTX-PRO-6000", 96): (
        "1g.24gb",
        "1g.24gb+me",
        "1g.24gb+gfx",
        "1g.24gb+me.all",
        "1g.24gb-me",
        "2g.48gb",
        "2g.48gb+gfx",
        "2g.48gb+me.all",
        "2g.48gb-me",
        "4g.96gb",
        "4g.96gb+gfx",
    ),
}
