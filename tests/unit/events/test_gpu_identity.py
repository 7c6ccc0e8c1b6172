"""One GPU identity (``seedance.events.gpus``): real names resolve; requests as users mean them."""

from __future__ import annotations

import re

import pytest

from seedance.events import gpu_requests, gpus
from seedance.events.gpu_requests import match_models
from seedance.events.gpus import canonical_model, identify
from tests.fixtures.gpu_names.corpus import CORPUS

KNOWN = [e for e in CORPUS if e.model != "unknown"]
UNKNOWN = [e for e in CORPUS if e.model == "unknown"]


def test_the_corpus_covers_every_kind_of_source() -> None:
    kinds = {"nvml", "gfd", "trace", "legacy", "device", "cloud", "doc"}
    assert {e.kind for e in CORPUS} == kinds
    assert all(e.seen for e in CORPUS)
    assert UNKNOWN, "the corpus must hold names that do not resolve"


@pytest.mark.parametrize("entry", KNOWN, ids=lambda e: f"{e.kind}:{e.name}")
def test_every_real_name_resolves_to_its_model(entry) -> None:  # type: ignore[no-untyped-def]
    got = identify(entry.name)
    assert got.identity is not None, f"{entry.name!r} ({entry.seen}) did not resolve"
    assert got.identity.model == entry.model
    assert got.mig_profile == entry.mig_profile
    assert got.ci_slices == entry.ci_slices
    assert got.shared == entry.shared


@pytest.mark.parametrize("entry", UNKNOWN, ids=lambda e: e.name)
def test_an_unknown_name_stays_unknown_and_keeps_its_name(entry) -> None:  # type: ignore[no-untyped-def]
    got = identify(entry.name)
    assert got.identity is None
    assert not got.known
    assert got.model == entry.name.strip()


def test_normalisation_ignores_case_separators_vendor_and_token_order() -> None:
    spellings = (
        "nvidia a100 80gb pcie",
        "NVIDIA_A100_PCIE_80GB",
        "A100-PCIE-80GB",
        "A100 PCIe 80GB",
    )
    for name in spellings:
        assert canonical_model(name) == "A100-PCIE-80GB", name


def test_a_neighbour_is_never_guessed() -> None:
    # An A100 of a memory size NVIDIA never made, a new suffix: unknown, not "the nearest A100".
    for name in ("NVIDIA A100-SXM4-64GB", "NVIDIA H100 96GB HBM3", "NVIDIA A100X"):
        assert not identify(name).known, name


def test_a_mig_device_keeps_its_profile_in_the_canonical_name() -> None:
    assert canonical_model("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb") == "A100-SXM4-80GB-MIG-3g.40gb"
    me = canonical_model("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me")
    assert me == "H100-SXM5-80GB-MIG-1g.10gb+me"
    # the canonical name reads back to the same model and profile
    again = identify(canonical_model("A100-SXM4-40GB-MIG-1g.5gb"))
    assert again.identity is not None
    assert again.identity.model == "A100-SXM4-40GB"
    assert again.mig_profile == "1g.5gb"


def test_a_compute_instance_names_its_gpu_instance_and_keeps_its_slices() -> None:
    ci = identify("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb")
    assert (ci.mig_profile, ci.ci_slices, ci.mig_device) == ("3g.20gb", 1, "1c.3g.20gb")
    assert canonical_model(ci.name) == "A100-SXM4-40GB-MIG-1c.3g.20gb"
    again = identify(canonical_model(ci.name))  # the canonical name reads back the same
    assert (again.model, again.mig_profile, again.ci_slices) == ("A100-SXM4-40GB", "3g.20gb", 1)
    assert ci.compute_instance
    assert not identify("NVIDIA A100-SXM4-40GB MIG 3g.20gb").compute_instance
    # the engine suffixes stay part of the profile, "-me" included ("-" is a separator)
    minus = identify("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition-MIG-1g.24gb-me")
    assert (minus.model, minus.mig_profile) == ("RTX-PRO-6000-BLACKWELL-SERVER-96GB", "1g.24gb-me")
    assert gpus.name_key("NVIDIA H200 MIG 2c.3g.71gb+me") == "H200"


@pytest.mark.parametrize(
    "name",
    [
        # a compute instance of no slices, of all its GI's (NVML names that device by its GI:
        # "3g.20gb") or of more: no device NVML reports, never read as its GI
        "NVIDIA A100-SXM4-80GB MIG 0c.3g.40gb",
        "NVIDIA A100-SXM4-40GB MIG 3c.3g.20gb",
        "NVIDIA A100-SXM4-80GB MIG 4c.3g.40gb",
        "NVIDIA A100-SXM4-80GB MIG 2c.1g.10gb",
        "NVIDIA A100-SXM4-80GB MIG 7c.7g.80gb",
        # a GPU instance larger than its GPU (7 slices; the A30's 4) or than any GPU's
        "NVIDIA A100-SXM4-80GB MIG 9g.80gb",
        "NVIDIA A30 MIG 7g.24gb",
        "GPU-series-1 MIG 8g.80gb",
        # a MIG device of a part without MIG
        "NVIDIA RTX A6000 MIG 1g.6gb",
        "NVIDIA GeForce RTX 4090 MIG 1g.5gb",
        "NVIDIA-T4-MIG-1g.4gb",
        # a profile its GPU's published table lacks (the 80 GB A100's whole GPU is 7g.80gb,
        # the 40 GB's 7g.40gb; "-me" and "+gfx" are the RTX PRO 6000 Blackwell's)
        "NVIDIA A100-SXM4-80GB MIG 7g.10gb",
        "NVIDIA A100-SXM4-40GB MIG 7g.80gb",
        "NVIDIA H100 80GB HBM3 MIG 1g.18gb",
        "NVIDIA H200 MIG 1g.10gb",
        "NVIDIA A30 MIG 3g.12gb",
        "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-me",
        "NVIDIA H100 NVL MIG 1g.12gb+gfx",
        # no name NVIDIA writes: a leading zero, an engine suffix it has not
        "NVIDIA A100-SXM4-80GB MIG 07g.80gb",
        "NVIDIA A100-SXM4-80GB MIG 1g.10gb+foo",
        "NVIDIA A100-SXM4-80GB MIG 1g.10gb-gfx",
    ],
)
def test_a_mig_device_no_gpu_can_hold_is_unknown(name: str) -> None:
    got = identify(name)
    assert got.identity is None
    assert (got.mig_profile, got.ci_slices, got.mig_device, got.model) == (None, None, None, name)
    assert canonical_model(name) == name
    assert got.compute_instance == ("c." in name)
    assert got.mig_named
    assert got.mig_misfit


def test_a_misfit_says_why() -> None:
    assert identify("NVIDIA A100-SXM4-80GB MIG 7g.10gb").mig_misfit == (
        "no GPU instance 7g.10gb on A100-SXM4-80GB (NVIDIA's: 1g.10gb, 1g.10gb+me, 1g.20gb, "
        "2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)"
    )
    assert identify("NVIDIA A100-SXM4-40GB MIG 3c.3g.20gb").mig_misfit == (
        "a 3g instance has no 3c (one of all its slices is named 3g.20gb)"
    )
    assert identify("NVIDIA A30 MIG 7g.24gb").mig_misfit == "7 of 4 compute slices"
    assert identify("NVIDIA RTX A6000 MIG 1g.6gb").mig_misfit == "RTX-A6000-48GB has no MIG"
    assert identify("GPU-series-1 MIG 8g.80gb").mig_misfit == "8 of 7 compute slices"
    assert identify("GPU-series-1 MIG 1g.0gb").mig_misfit == "no memory"
    assert identify("NVIDIA B300 MIG 1g.500gb").mig_misfit == (
        "500 GB is more than B300-SXM-288GB's 288 GB"
    )
    assert str(identify("A100 MIG 07g.80gb").mig_misfit).startswith(
        "07g.80gb is not a MIG device as NVIDIA names them"
    )
    assert identify("NVIDIA A100-SXM4-80GB MIG 3g.40gb").mig_misfit is None
    assert identify("NVIDIA A100-SXM4-80GB").mig_misfit is None


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ("3g.40gb", (3, 40, None, "", "3g.40gb", 3)),
        ("1c.3g.20gb", (3, 20, 1, "", "3g.20gb", 1)),
        ("1G.10GB+ME", (1, 10, None, "+me", "1g.10gb+me", 1)),
        ("1g.24gb+me.all", (1, 24, None, "+me.all", "1g.24gb+me.all", 1)),
        ("2g.48gb+gfx", (2, 48, None, "+gfx", "2g.48gb+gfx", 2)),
        ("1g.24gb-me", (1, 24, None, "-me", "1g.24gb-me", 1)),
        # read, and then fit no GPU (MigName.misfit): a CI of 0 or of all its GI's slices
        ("0c.3g.40gb", (3, 40, 0, "", "3g.40gb", 0)),
        ("3c.3g.20gb", (3, 20, 3, "", "3g.20gb", 3)),
    ],
)
def test_one_parser_reads_nvidias_mig_names(text: str, read: tuple[object, ...]) -> None:
    got = gpus.parse_mig_profile(text)
    assert got is not None
    assert (got.gi_slices, got.memory_gb, got.ci_slices, got.engines) == read[:4]
    assert (got.gpu_instance, got.compute_slices) == read[4:]
    assert str(got) == text.lower()


@pytest.mark.parametrize(
    "text", ["3g40", "07g.80gb", "3g.040gb", "1g.10gb+foo", "1g.10gb-gfx", "1g.10gb+me.foo",
             "3g.40gb+", "c.3g.40gb", "MIG 3g.40gb", ""],
)  # fmt: skip
def test_a_name_nvidia_does_not_write_is_no_mig_profile(text: str) -> None:
    assert gpus.parse_mig_profile(text) is None


@pytest.mark.parametrize(
    ("label", "model", "device"),
    [
        ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb.me", "A100-SXM4-80GB", "1g.10gb+me"),
        ("NVIDIA-H200-MIG-1g.18gb.me", "H200-SXM-141GB", "1g.18gb+me"),
        ("NVIDIA-A30-MIG-2g.12gb.me", "A30-PCIE-24GB", "2g.12gb+me"),
        ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb.me-SHARED", "A100-SXM4-80GB", "1g.10gb+me"),
    ],
)
def test_the_device_plugin_s_dotted_engine_suffix_is_nvidias_plus(
    label: str, model: str, device: str
) -> None:
    """GPU feature discovery's product label writes the profile as the device plugin names the
    resource, ``+`` as ``.`` (k8s-device-plugin ``nvmlMigDevice.GetName``): these were unknown
    and billed as a whole GPU at the fallback (review of 2026-12-07)."""
    got = identify(label)
    assert got.identity is not None
    assert (got.identity.model, got.mig_device, got.mig_misfit) == (model, device, None)
    assert str(gpus.parse_mig_profile(device.replace("+", "."))) == device


def test_a_number_past_any_mig_part_is_no_profile_and_raises_nothing() -> None:
    """Digits beyond four are no profile; a 5,000-digit one cost ``int`` its digit limit (a
    ValueError out of ``identify``, which the bridge and the slicer call)."""
    assert gpus.parse_mig_profile("1g.10000gb") is None
    got = identify("NVIDIA A100-SXM4-80GB MIG 1g." + "9" * 5000 + "gb")
    assert got.identity is None
    assert got.mig_misfit is not None


def test_the_published_mig_tables_are_the_gpus_own() -> None:
    tabled = {g.model: g for g in gpus.GPU_MODELS if g.mig_profiles}
    assert {"A30-PCIE-24GB", "A100-SXM4-40GB", "A100-PCIE-80GB", "H100-SXM5-80GB",
            "H100-NVL-94GB", "H200-SXM-141GB", "H200-NVL-141GB"} <= set(tabled)  # fmt: skip
    for g in tabled.values():
        assert g.mig_capable, g.model
        read = [gpus.parse_mig_profile(p) for p in g.mig_profiles]
        assert all(r is not None and r.misfit(g) is None for r in read), g.model
        # the whole GPU (all its slices and all its memory) is one, and none is larger
        whole = f"{g.mig_compute_slices}g.{g.memory_gb}gb"
        assert whole in g.mig_profiles, g.model
        assert max(r.memory_gb for r in read if r is not None) == g.memory_gb, g.model
    assert tabled["A100-SXM4-40GB"].mig_profiles[:3] == ("1g.5gb", "1g.5gb+me", "1g.10gb")
    assert tabled["H200-SXM-141GB"].mig_profiles[4] == "3g.71gb"
    assert gpus.mig_compute_slices(None) == 7
    assert gpus.mig_compute_slices(identify("A30").identity) == 4


def test_the_vendor_word_never_changes_a_cloud_type() -> None:
    # Google's nvidia-tesla-a100 however it is spelt, "NVIDIA" or not; a bare A100 as before
    forty = {"nvidia-tesla-a100", "NVIDIA Tesla A100", "NVIDIA-Tesla-A100", "Tesla A100"}
    assert {canonical_model(n) for n in forty} == {"A100-SXM4-40GB"}
    assert canonical_model("nvidia-tesla-a100-MIG-1g.5gb") == "A100-SXM4-40GB-MIG-1g.5gb"
    assert {canonical_model(n) for n in ("A100", "NVIDIA A100")} == {"A100-SXM4-80GB"}


def test_a_cloud_accelerator_type_means_what_the_cloud_rents() -> None:
    # Google's nvidia-tesla-a100 is the A2 standard's 40 GB part; a bare "A100" keeps the
    # replayed fleets' meaning (the 80 GB SXM4), and a "Tesla A100-SXM4-80GB" is still 80 GB.
    assert canonical_model("nvidia-tesla-a100") == "A100-SXM4-40GB"
    assert canonical_model("A100") == "A100-SXM4-80GB"
    assert canonical_model("Tesla A100-SXM4-80GB") == "A100-SXM4-80GB"
    assert canonical_model("nvidia-h100-mega-80gb") == canonical_model("NVIDIA H100 80GB HBM3")


def test_mig_geometry_is_the_gpus_own() -> None:
    slices = {g.model: g.mig_compute_slices for g in gpus.GPU_MODELS if g.mig_capable}
    assert slices["A30-PCIE-24GB"] == slices["RTX-PRO-6000-BLACKWELL-SERVER-96GB"] == 4
    # 1g is a quarter: the MIG user guide's "Supported MIG Profiles" (v580, table 10)
    assert slices["RTX-PRO-5000-BLACKWELL-48GB"] == 4
    assert {n for n, s in slices.items() if s != 7} == {
        "A30-PCIE-24GB", "RTX-PRO-6000-BLACKWELL-SERVER-96GB",
        "RTX-PRO-6000-BLACKWELL-WORKSTATION-96GB", "RTX-PRO-6000-BLACKWELL-MAX-Q-WORKSTATION-96GB",
        "RTX-PRO-5000-BLACKWELL-48GB",
    }  # fmt: skip


def test_every_alias_names_one_model_and_families_are_stated() -> None:
    models = [g.model for g in gpus.GPU_MODELS]
    assert len(models) == len(set(models))
    for g in gpus.GPU_MODELS:
        assert canonical_model(g.model) == g.model
        for alias in g.aliases:
            assert canonical_model(alias) == g.model, alias
    assert {"V100", "T4", "A10G", "L4", "L40S", "A100", "H100", "H200", "B200", "GB200"} <= set(
        gpus.families()
    )


def test_the_table_spans_volta_to_blackwell_with_memory_and_form() -> None:
    archs = {g.architecture for g in gpus.GPU_MODELS}
    assert {"Volta", "Turing", "Ampere", "Ada", "Hopper", "Blackwell"} <= archs
    for g in gpus.GPU_MODELS:
        if not g.anonymised:
            assert g.memory_gb, g.model
    forms = {g.model: g.form_factor for g in gpus.GPU_MODELS if g.family == "H100"}
    assert forms == {
        "H100-PCIE-80GB": "PCIe", "H100-SXM5-80GB": "SXM5", "H100-NVL-94GB": "NVL",
        "H100-SXM5-94GB": "SXM5",
    }  # fmt: skip


# ------------------------------------------------------------------------------ requests

FLEET = ["T4", "A100", "G2", "V100M32", "NVIDIA A100-PCIE-40GB", "NVIDIA H100 NVL", "GPU-series-1"]


@pytest.mark.parametrize(
    ("request_", "matched"),
    [
        (["t4"], ("T4",)),
        (["T4"], ("T4",)),
        (["a100"], ("A100", "NVIDIA A100-PCIE-40GB")),
        (["A100-80GB"], ("A100",)),
        (["a100-pcie"], ("NVIDIA A100-PCIE-40GB",)),
        (["NVIDIA-A100-SXM4-80GB"], ("A100",)),
        (["h100"], ("NVIDIA H100 NVL",)),
        (["h100-sxm"], ()),
        (["v100"], ("V100M32",)),
        (["g2"], ("G2",)),
        (["gpu-series-1"], ("GPU-series-1",)),
        (["b200"], ()),
        (["t4", "g2"], ("G2", "T4")),
    ],
)
def test_a_request_means_what_a_user_means(request_: list[str], matched: tuple[str, ...]) -> None:
    assert match_models(request_, FLEET).matched == matched


def test_the_answer_says_what_matched_what_did_not_and_what_there_is() -> None:
    m = match_models(["t4", "b200", "tpu-v5"], FLEET)
    assert m.by_request == {"t4": ("T4",), "b200": (), "tpu-v5": ()}
    assert m.unknown == ("tpu-v5",)
    none = match_models(["b200"], ["T4", "A100"])
    assert none.matched == ()
    assert none.reason(["T4", "A100"]) == (
        "gpu_models [b200] match none of the fleet's models: "
        "A100 (A100-SXM4-80GB), T4 (T4-PCIE-16GB)"
    )


def test_a_family_of_several_words_is_requested_by_its_name() -> None:
    fleet = [
        "NVIDIA GeForce RTX 4090", "NVIDIA RTX A6000", "NVIDIA RTX 6000 Ada Generation",
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    ]  # fmt: skip
    assert match_models(["rtx-4090"], fleet).matched == ("NVIDIA GeForce RTX 4090",)
    assert match_models(["RTX A6000"], fleet).matched == ("NVIDIA RTX A6000",)
    assert match_models(["rtx-6000-ada"], fleet).matched == ("NVIDIA RTX 6000 Ada Generation",)
    assert match_models(["rtx-pro-6000"], fleet).matched == (
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    )
    assert match_models(["rtx-6000"], fleet).matched == ()  # three boards: no guess


def test_a_family_of_several_words_takes_qualifiers_as_a_one_word_family_does() -> None:
    fleet = ["NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA RTX 6000 Ada Generation"]
    pro = ("NVIDIA RTX PRO 6000 Blackwell Server Edition",)
    assert match_models(["rtx-pro-6000-96gb"], fleet).matched == pro
    assert match_models(["RTX PRO 6000 96GB PCIe"], fleet).matched == pro
    assert match_models(["rtx-6000-ada-48gb"], fleet).matched == tuple(fleet[1:])
    assert match_models(["rtx-pro-6000-48gb"], fleet).matched == ()  # no such board
    assert match_models(["rtx-pro-6000-fast"], fleet).matched == ()  # unknown: not dropped


def test_an_unknown_qualifier_is_not_dropped() -> None:
    # "a100-64gb" is no A100 there is: it must not widen to every A100.
    assert match_models(["a100-64gb"], FLEET).matched == ()
    assert match_models(["a100-fast"], FLEET).matched == ()


def test_the_public_surface_is_pinned() -> None:
    assert sorted(gpus.__all__) == [
        "GKE_ACCELERATORS", "GPU_MODELS", "GpuIdentity", "MIG_GPU_INSTANCE_PATTERN", "MigName",
        "ReportedGpu", "canonical_model", "families", "identify", "mig_compute_slices",
        "mig_gpu_instance", "mig_profile_of_resource", "mig_resource_suffix", "name_key",
        "parse_mig_profile",
    ]  # fmt: skip
    assert sorted(gpu_requests.__all__) == ["ModelMatch", "match_models"]


def test_name_key_compares_any_name_without_resolving_it() -> None:
    assert gpus.name_key("gpu_series 1") == gpus.name_key("GPU-series-1") == "GPU-SERIES-1"
    assert gpus.name_key("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb") == "A100-SXM4-80GB"


@pytest.mark.parametrize(
    ("suffix", "profile"),
    [("1g.10gb.me", "1g.10gb+me"), ("3g.40gb", "3g.40gb"), ("1g.24gb.me.all", "1g.24gb+me.all"),
     ("1G.10GB", "1G.10GB"), ("1g.10gb+me", "1g.10gb+me"), ("junk", "junk")],
)  # fmt: skip
def test_a_resource_suffix_is_read_only_as_the_device_plugin_spells_it(
    suffix: str, profile: str
) -> None:
    """The plugin's ``1g.10gb.me`` is NVIDIA's ``1g.10gb+me``; any other spelling is kept as
    written for its reader to refuse (``1G.10GB`` and ``1g.10gb`` are never merged)."""
    assert gpus.mig_profile_of_resource(suffix) == profile


@pytest.mark.parametrize(
    ("key", "profile"),
    [("1g.10gb", "1g.10gb"), ("1g.10gb.me", "1g.10gb+me"), ("1G.10GB+ME", "1g.10gb+me"),
     ("1g.24gb+me.all", "1g.24gb+me.all"), ("1g.24gb.me.all", "1g.24gb+me.all"),
     ("1g.12gb+gfx", "1g.12gb+gfx"), ("1g.24gb-me", "1g.24gb-me"), ("3g.47gb", "3g.47gb")],
)  # fmt: skip
def test_a_counted_gpu_instance_is_read_in_every_spelling_nvidia_writes(
    key: str, profile: str
) -> None:
    """A quota's key: NVML's ``+``, the device plugin's ``.`` (``1g.10gb.me``), mig-parted's
    ``-me`` and ``+me.all`` all name one profile, as NVIDIA writes it."""
    assert gpus.mig_gpu_instance(key) == profile
    assert re.match(gpus.MIG_GPU_INSTANCE_PATTERN, key)


@pytest.mark.parametrize(
    ("key", "why"),
    [("3g-40gb", "not a MIG profile"), (" 3g.40gb", "not a MIG profile"),
     ("1g.10gb+foo", "not a MIG profile"), ("07g.80gb", "not a MIG profile"),
     ("1c.3g.20gb", "compute instance: count its GPU instance 3g.20gb"),
     ("9g.80gb", "9 of 7 compute slices"), ("1g.0gb", "no memory"),
     ("7g.2000gb", "no MIG GPU")],
)  # fmt: skip
def test_a_counted_gpu_instance_no_gpu_has_is_refused_by_name(key: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(key)) + ".*" + re.escape(why)):
        gpus.mig_gpu_instance(key)
    # the schema's pattern refuses it too
    if "not a MIG profile" in why or "compute instance" in why:
        assert not re.match(gpus.MIG_GPU_INSTANCE_PATTERN, key)
