"""NVML backend over recordings: units, absent fields, MIG, NVLink, XID and lost GPUs."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pynvml
import pytest
from constructed import Builder, a100_mig, h100_nvlink_xid

from seedance.telemetry_collector.nvml import NvmlBackend
from seedance.telemetry_collector.recording import ReplayNvmlApi, load_recording
from seedance.telemetry_collector.sample import merge_slow

H200 = Path(__file__).parent / "recordings" / "h200_recording.json"


def backend_for(recording: dict, costly_s: float = 0.0) -> tuple[NvmlBackend, ReplayNvmlApi]:
    """A backend over the recording; energy, ECC and GPM are read on every slow read unless
    ``costly_s`` says otherwise (the tests below step the slow path a second at a time)."""
    api = ReplayNvmlApi(recording)
    return NvmlBackend("node-1", api, costly_interval_s=costly_s), api


def test_units_are_converted_at_the_edge() -> None:
    backend, _ = backend_for(h100_nvlink_xid())
    backend.inventory()
    g = backend.sample_fast()[0]
    assert g.power_w == pytest.approx(352.12)  # 352,120 mW
    # v1's used (reserved folded in) less the inventory's v2 reserved: 21,474,836,480 B
    assert g.mem_used_mib == pytest.approx(20480.0)
    assert g.mem_reserved_mib == pytest.approx(649068544 / 2**20)
    assert g.mem_total_mib == pytest.approx(100485038080 / 2**20)
    assert g.gpu_util_ratio == pytest.approx(0.97)
    slow1 = backend.sample_slow(10.0)[0]
    assert slow1.clock_event_reasons == 0x4  # slowly changing: on the slow path
    slow2 = backend.sample_slow(11.0)[0]
    assert slow1.energy_j == pytest.approx(5_000_000.0)  # 5e9 mJ
    assert slow1.power_from_energy_w is None  # needs two reads
    assert slow2.power_from_energy_w == pytest.approx(352.12)
    assert slow2.sm_active_ratio == pytest.approx(0.912)
    assert slow2.tensor_active_ratio == pytest.approx(0.889)


def test_unsupported_fields_are_absent_not_zero() -> None:
    backend, _ = backend_for(a100_mig())
    inv = backend.inventory()
    g = backend.sample_fast()[0]
    assert g.gpu_util_ratio is None  # NotSupported on MIG-enabled GPUs
    assert g.mem_util_ratio is None
    assert inv.gpus[0].nvlink_links_active is None
    assert inv.gpus[0].gpm_supported is False
    slow = backend.sample_slow(1.0)[0]
    assert slow.sm_active_ratio is None
    assert slow.tensor_active_ratio is None


def test_every_field_missing_still_samples() -> None:
    """A GPU that answers NotSupported to everything but its handle yields Nones, no error."""
    b = Builder("CONSTRUCTED: a GPU that supports nothing")
    b.ok("nvmlInit").ok("nvmlDeviceGetCount", value=1)
    b.ok("nvmlDeviceGetHandleByIndex", 0, value="gpu0")
    b.ok("nvmlDeviceGetUUID", "gpu0", value="GPU-x")
    backend, _ = backend_for(b.build())
    inv = backend.inventory()
    assert inv.gpus[0].mig_capable is False
    assert inv.driver_version is None
    g = backend.sample_fast()[0]
    assert g.healthy
    assert (g.mem_used_mib, g.power_w, g.gpu_util_ratio) == (None,) * 3
    s = backend.sample_slow(1.0)[0]
    assert (s.energy_j, s.ecc_uncorrected_volatile, s.xid_last) == (None, None, None)
    assert (s.temp_c, s.sm_clock_mhz, s.clock_event_reasons, s.processes) == (None,) * 4


class CallLog:
    """Names every NVML call the backend makes, then answers as the replay does."""

    def __init__(self, api: ReplayNvmlApi) -> None:
        self.api = api
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.api, name)

        def call(*args: Any) -> Any:
            self.calls.append(name)
            return fn(*args)

        return call


def test_the_fast_path_reads_only_what_changes_at_its_rate() -> None:
    """Memory, utilisation and power (this once a second given a time: below) each tick;
    temperature, clocks, clock-event reasons and the process list on the slow path, merged
    into the samples after it (``merge_slow``)."""
    log = CallLog(ReplayNvmlApi(h100_nvlink_xid()))
    backend = NvmlBackend("node-1", log, costly_interval_s=0.0)
    backend.inventory()
    log.calls.clear()
    fast = backend.sample_fast()
    assert (
        log.calls
        == [
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetPowerUsage",
        ]
        * 2
    )  # two GPUs
    slow = {r.index: r for r in backend.sample_slow(1.0)}
    merged = merge_slow(fast[0], slow[0], 1.5)
    assert (merged.temp_c, merged.clock_event_reasons) == (63.0, 0x4)
    assert merged.sm_clock_mhz is not None
    assert merged.power_w == pytest.approx(352.12)
    assert merged.slow_age_s == pytest.approx(0.5)


def test_mig_instances_and_their_memory() -> None:
    backend, _ = backend_for(a100_mig())
    inv = backend.inventory()
    gi = inv.gpus[0]
    assert gi.mig_enabled is True
    assert gi.mig_max_devices == 7
    assert [m.gpu_instance_id for m in gi.mig_instances] == [1, 5]
    g = backend.sample_fast()[0]
    assert [m.mig_index for m in g.mig_instances] == [0, 2]  # slot 1 is empty (NotFound)
    assert [m.mem_used_mib for m in g.mig_instances] == [4096.0, 1024.0]
    slow = backend.sample_slow(1.0)[0]
    assert [p.gpu_instance_id for p in slow.processes or ()] == [1, 5]


def test_nvlink_and_topology() -> None:
    backend, _ = backend_for(h100_nvlink_xid())
    inv = backend.inventory()
    (link,) = inv.links
    assert (link.gpu_a, link.gpu_b) == (0, 1)
    assert link.common_ancestor == "node"
    assert link.nvlink_links == 12
    assert [g.nvlink_links_active for g in inv.gpus] == [12, 12]


def test_xid_makes_the_gpu_unhealthy_and_stays() -> None:
    backend, _ = backend_for(h100_nvlink_xid())
    backend.inventory()
    first = backend.sample_slow(1.0)
    assert [s.health_reasons for s in first] == [(), ()]
    second = backend.sample_slow(2.0)
    assert second[1].xid_last == 79
    assert second[1].health_reasons == ("xid_79",)
    assert second[0].health_reasons == ()
    third = backend.sample_slow(3.0)
    assert third[1].health_reasons == ("xid_79",)


def test_lost_gpu_is_unhealthy_and_the_others_go_on() -> None:
    backend, api = backend_for(h100_nvlink_xid())
    backend.inventory()
    # The fast path's first call (memory, v1) finds the GPU gone.
    api.push("nvmlDeviceGetMemoryInfo", ["gpu1"], err=pynvml.NVML_ERROR_GPU_IS_LOST)
    g0, g1 = backend.sample_fast()
    assert g0.healthy
    assert g0.power_w is not None
    assert not g1.healthy
    assert g1.health_reasons == ("gpu_lost",)
    assert g1.power_w is None
    # Lost stays lost until the inventory is re-read; the slow path skips it quietly.
    assert not backend.sample_fast()[1].healthy
    assert backend.sample_slow(1.0)[1].energy_j is None


def test_handle_failure_lists_an_unhealthy_stub() -> None:
    rec = h100_nvlink_xid()
    api = ReplayNvmlApi(rec)
    api.push("nvmlDeviceGetHandleByIndex", [1], err=pynvml.NVML_ERROR_GPU_IS_LOST)
    backend = NvmlBackend("node-1", api, costly_interval_s=0.0)
    inv = backend.inventory()
    assert [g.healthy for g in inv.gpus] == [True, False]
    assert inv.links == ()  # no link can be read to a GPU without a handle
    samples = backend.sample_fast()
    assert [s.healthy for s in samples] == [True, False]
    # The next inventory finds it again (the replay's handle answers once more).
    inv2 = backend.inventory()
    assert [g.healthy for g in inv2.gpus] == [True, True]
    assert backend.sample_fast()[1].healthy


def test_undocumented_nvml_error_is_unhealthy_not_raised() -> None:
    backend, api = backend_for(h100_nvlink_xid())
    backend.inventory()
    api.push("nvmlDeviceGetPowerUsage", ["gpu0"], err=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    g0, g1 = backend.sample_fast()
    assert not g0.healthy
    assert g0.health_reasons == (f"nvml_error_{pynvml.NVML_ERROR_DRIVER_NOT_LOADED}",)
    assert g1.healthy
    assert backend.sample_fast()[0].healthy  # not sticky: the next tick reads it again


def test_power_is_read_once_a_second_on_a_fixed_grid() -> None:
    """With a time, the power (NVML's 1 s average) is read on the first tick at or after each
    second and carried between. Ticks jitter; a tick landing just short of its second must not
    stretch the cadence (reading at "last read + 1 s" reads 95 times in these 100 s, not 100).
    Memory and utilisation are read every tick; without a time, power is read every call."""
    log = CallLog(ReplayNvmlApi(h100_nvlink_xid()))
    backend = NvmlBackend("node-1", log, costly_interval_s=0.0, power_interval_s=1.0)
    backend.inventory()
    log.calls.clear()
    jitter = random.Random(7)
    ticks = 1000  # 100 s at 10 Hz
    for i in range(ticks):
        g = backend.sample_fast(100.0 + i * 0.1 + jitter.uniform(-0.01, 0.01))[0]
        assert g.power_w == pytest.approx(352.12)  # read, or carried from the last read
    assert log.calls.count("nvmlDeviceGetPowerUsage") == 100 * 2  # two GPUs
    assert log.calls.count("nvmlDeviceGetMemoryInfo") == ticks * 2
    assert log.calls.count("nvmlDeviceGetUtilizationRates") == ticks * 2
    log.calls.clear()
    backend.sample_fast()
    backend.sample_fast()
    assert log.calls.count("nvmlDeviceGetPowerUsage") == 2 * 2
    with pytest.raises(ValueError, match="power_interval_s must be >= 0"):
        NvmlBackend("node-1", power_interval_s=-1.0)


def test_the_latest_power_reading_is_carried_and_a_pause_restarts_the_grid() -> None:
    """Between reads a sample carries the latest reading (an unsupported one as absent, not
    the one before); after a pause of a whole interval or more the next tick reads at once and
    the grid starts again from it."""
    api = ReplayNvmlApi(h100_nvlink_xid())
    backend = NvmlBackend("node-1", api, costly_interval_s=0.0, power_interval_s=1.0)
    backend.inventory()
    api.push("nvmlDeviceGetPowerUsage", ["gpu0"], ok=400_000)
    assert backend.sample_fast(10.0)[0].power_w == pytest.approx(400.0)
    api.push("nvmlDeviceGetPowerUsage", ["gpu0"], ok=500_000)
    assert backend.sample_fast(10.5)[0].power_w == pytest.approx(400.0)  # carried, not re-read
    assert backend.sample_fast(11.0)[0].power_w == pytest.approx(500.0)
    api.push("nvmlDeviceGetPowerUsage", ["gpu0"], err=pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert backend.sample_fast(12.0)[0].power_w is None
    assert backend.sample_fast(12.9)[0].power_w is None  # the absent reading is carried
    api.push("nvmlDeviceGetPowerUsage", ["gpu0"], ok=600_000)
    assert backend.sample_fast(20.3)[0].power_w == pytest.approx(600.0)  # after a pause
    reads = api.calls.count("nvmlDeviceGetPowerUsage")
    backend.sample_fast(21.2)  # the old grid (21.0) is gone: next read at 21.3
    assert api.calls.count("nvmlDeviceGetPowerUsage") == reads
    backend.sample_fast(21.3)
    assert api.calls.count("nvmlDeviceGetPowerUsage") == reads + 2  # both GPUs


def test_costly_reads_keep_their_own_cadence_and_memory_falls_back_to_v2() -> None:
    """Energy, ECC and GPM are read on the first slow read and again only once the costly
    interval has passed; between, a slow reading carries their last values. A driver that
    has no v1 memory answer (the recorded H200 run made v2 calls only) is read through v2."""
    backend, api = backend_for(h100_nvlink_xid(), costly_s=30.0)
    backend.inventory()
    first = backend.sample_slow(10.0)[0]
    carried = backend.sample_slow(20.0)[0]
    assert first.energy_j == carried.energy_j == pytest.approx(5_000_000.0)
    assert carried.power_from_energy_w is None  # no second energy read yet
    assert api.calls.count("nvmlDeviceGetTotalEnergyConsumption") == 2  # one per GPU of the pair
    again = backend.sample_slow(40.0)[0]
    assert again.energy_j == pytest.approx(5_000_352.12)
    assert again.power_from_energy_w == pytest.approx(352.12 / 30.0)
    assert again.sm_active_ratio == pytest.approx(0.912)

    recorded = ReplayNvmlApi(load_recording(H200))
    h200 = NvmlBackend("vm", recorded)
    h200.inventory()
    g = h200.sample_fast()[0]
    assert g.mem_total_mib == pytest.approx(150754820096 / 2**20)
    assert g.mem_used_mib is not None
    assert g.mem_reserved_mib == pytest.approx(644939776 / 2**20)
