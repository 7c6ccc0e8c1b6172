"""A node cannot bill its tenants more energy than a GPU could draw (``mapping.energy_anchors``).

The energy billed is NVML's counter differenced between a GPU's readings, published by the
node's own credential. Before the rule any rise that fit was billed: one reading 1e15 J above
the last billed ~28 GWh to whoever held the GPU. Now a counter rises at most by
``MAX_GPU_POWER_W`` over the time since its anchor (its first reading since its last reset),
plus ``ENERGY_SLACK_S`` of it once; a reading past that is dead-lettered
``implausible_energy`` and changes nothing. The rule is a function of the stream's prefix, so
stepwise application and ``recompute`` (``ledger_inputs``) agree. Also here: the largest value
each wire bound lets through still checkpoints (the replica's msgpack ints).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from seedance.cost_ledger import core
from seedance.cost_ledger.core.mapping import (
    ENERGY_SLACK_S,
    MAX_GPU_POWER_W,
    InputRejected,
    facts_of,
)
from seedance.cost_ledger.core.replica import LedgerReplica, ledger_inputs
from seedance.events import Event, new_event_id
from seedance.events.subjects import telemetry
from seedance.events.telemetry import (
    MAX_ENERGY_J,
    MAX_GPU_MEM_MIB,
    MAX_NODE_GPUS,
    GpuInfo,
    GpuSample,
    GpuSampleBatch,
    NodeInventory,
)

BOOK = core.default_price_book()
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MODEL = "NVIDIA A100-SXM4-80GB"
SLACK_J = MAX_GPU_POWER_W * ENERGY_SLACK_S


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _inventory(gpus: int = 1) -> NodeInventory:
    return NodeInventory(
        id=new_event_id(at=T0), at=T0, node="n1", cpu_milli=8000, memory_mib=1024,
        gpus=[GpuInfo(index=i, model=MODEL, mem_total_mib=81920) for i in range(gpus)],
    )  # fmt: skip


def _batch(s: float, *energies: float | None, mem: float | None = None) -> GpuSampleBatch:
    at = T0 + timedelta(seconds=s)
    return GpuSampleBatch(
        id=new_event_id(at=at), at=at, node="n1",
        gpus=[GpuSample(index=i, sm_active=0.5, energy_j=j, mem_used_mib=mem)
              for i, j in enumerate(energies)],
    )  # fmt: skip


def _step_all(events: list[Event]) -> tuple[LedgerReplica, list[InputRejected]]:
    replica = LedgerReplica(BOOK, core.LedgerConfig())
    refused: list[InputRejected] = []
    for seq, e in enumerate(events, 1):
        subject = telemetry.sample("n1") if isinstance(e, GpuSampleBatch) else None
        try:
            replica.step(seq, e, subject=subject)
        except InputRejected as exc:
            refused.append(exc)
    return replica, refused


def test_the_mapping_refuses_a_rise_no_gpu_could_draw_naming_the_field() -> None:
    last = {"n1/0": 1_000_000}  # 1,000 J at T0 + 1 s, its anchor
    at = {"n1": _ms(T0 + timedelta(seconds=1))}
    since = {"n1/0": (at["n1"], 1_000_000)}
    ten_s = 10 * MAX_GPU_POWER_W + SLACK_J  # the most it may rise in the next 10 s
    ok = _batch(11, 1000.0 + ten_s)
    facts, energy = facts_of(ok, _ms(ok.at), frozenset(), last, at, since)
    assert energy == {"n1/0": round((1000.0 + ten_s) * 1000)}
    assert facts[0].energy_mj == ten_s * 1000  # type: ignore[union-attr]
    over = _batch(11, 1000.0 + ten_s + 0.002)
    with pytest.raises(InputRejected) as caught:
        facts_of(over, _ms(over.at), frozenset(), last, at, since)
    assert caught.value.kind == "implausible_energy"
    assert "gpu 0: energy_j = " in str(caught.value)
    assert f"{MAX_GPU_POWER_W} W" in str(caught.value)


def test_the_probes_inflation_is_dead_lettered_and_the_honest_readings_after_it_billed() -> None:
    honest = [_batch(s, 1000.0 + 700.0 * s) for s in range(1, 40)]  # 700 W, one a second
    inflated = _batch(20.5, 1e11)  # in range on the wire (<= MAX_ENERGY_J), not on a GPU
    closer = _batch(3 * 3600, None)  # closes the windows: the totals are billed ones
    clean, none = _step_all([_inventory(), *honest, closer])
    hostile, refused = _step_all([_inventory(), *honest[:20], inflated, *honest[20:], closer])
    assert none == []
    assert [r.kind for r in refused] == ["implausible_energy"]
    # Nothing of it stayed: every later reading billed as without it, the same state.
    assert clean.totals().total.energy_mj == 700_000 * 38
    assert hostile.totals() == clean.totals()
    assert hostile._s.energy_mj == clean._s.energy_mj
    assert hostile._s.energy_since == clean._s.energy_since
    hostile.to_bytes()  # and it checkpoints


def test_a_node_at_the_bound_bills_at_most_the_bound_over_any_span() -> None:
    """Each reading as high as the rule allows: the total billed over the run is bounded by
    ``MAX_GPU_POWER_W`` times its span plus the slack once, not per reading."""
    events: list[Event] = [_inventory(), _batch(0, 0.0)]
    total_j = 0.0
    for s in range(1, 600):
        allowed = MAX_GPU_POWER_W * s + SLACK_J  # since the anchor at 0 s
        total_j = float(allowed) if s == 1 else total_j + MAX_GPU_POWER_W
        events.append(_batch(s, total_j))
    events.append(_batch(600, total_j + MAX_GPU_POWER_W + 1.0))  # a joule more
    replica, refused = _step_all(events)
    assert [r.kind for r in refused] == ["implausible_energy"]
    billed_mj = replica._s.energy_mj["n1/0"]
    assert billed_mj == (MAX_GPU_POWER_W * 599 + SLACK_J) * 1000


def test_a_clock_step_within_telemetry_ahead_s_refuses_no_honest_reading() -> None:
    """A node's clock steps 10 s ahead for one batch, then back: its next batches are not
    newer (no energy), and the first after it measures the counter against the anchor, not
    against the step's time, so a 1.4 kW GPU (the largest) is never refused."""
    watts = 1400.0
    times = [*range(1, 20), 30, *range(21, 60)]  # the 20th batch stamped at 30 s, read at 20 s
    reads = [*range(1, 20), 20, *range(21, 60)]
    events: list[Event] = [_inventory()]
    events += [_batch(t, watts * r) for t, r in zip(times, reads, strict=True)]
    _, refused = _step_all(events)
    assert refused == []


def test_the_collectors_carried_energy_reads_are_never_refused() -> None:
    """The NVML collector reads the energy counter every ``COSTLY_INTERVAL_S`` (30 s) and carries
    the last value in the batches between (docs/telemetry.md): the counter stands still for 29
    batches, then rises by 30 s of energy in one second. Measured against the GPU's previous
    reading that is 30 times what it draws; against the anchor it is what it is. The anchor's
    own read may be a carried one too (the ledger's first reading of the GPU)."""
    watts = 1400.0  # the largest GPU's board power
    events: list[Event] = [_inventory()]
    for t in range(29, 400):  # the first batch the ledger reads carries a read 29 s old
        read_at = (t // 30) * 30  # the last costly read
        events.append(_batch(t, 1000.0 + watts * read_at))
    replica, refused = _step_all(events)
    assert refused == []
    assert replica._s.energy_mj["n1/0"] == round((1000.0 + watts * 390) * 1000)


def test_a_counter_reset_starts_a_new_anchor() -> None:
    events: list[Event] = [_inventory(), _batch(1, 5e9), _batch(2, 5e9 + 500)]
    events += [_batch(3, 10.0), _batch(4, 10.0 + 500)]  # the driver reloaded: counter from 0
    replica, refused = _step_all(events)
    assert refused == []
    assert replica._s.energy_since["n1/0"] == (_ms(T0 + timedelta(seconds=3)), 10_000)
    assert replica._s.energy_mj["n1/0"] == 510_000


def test_stepwise_and_recompute_agree_and_recompute_sees_the_same_refusal() -> None:
    honest = [_batch(s, 100.0 * s, 300.0 * s) for s in range(1, 30)]
    closer = _batch(3 * 3600, None, None)
    replica, refused = _step_all([_inventory(2), *honest, closer])
    assert refused == []
    clock = replica.clock_ms
    assert clock is not None
    assert replica.totals() == core.recompute(
        ledger_inputs([_inventory(2), *honest, closer], BOOK), BOOK, clock, core.LedgerConfig()
    )
    with pytest.raises(InputRejected, match=r"GpuSampleBatch gpu 1: energy_j = 1000000000\.0") as c:
        ledger_inputs([_inventory(2), *honest[:5], _batch(5.5, 600.0, 1e9)], BOOK)
    assert c.value.kind == "implausible_energy"


def test_the_largest_values_the_wire_lets_through_still_checkpoint() -> None:
    """The probe's values are refused at decode now; what the bounds let through must not
    overflow the replica's msgpack checkpoint either (every int within int64)."""
    replica = LedgerReplica(BOOK, core.LedgerConfig())
    inv = NodeInventory(
        id=new_event_id(at=T0), at=T0, node="n1", cpu_milli=8000, memory_mib=1024,
        gpus=[GpuInfo(index=i, model=MODEL, mem_total_mib=MAX_GPU_MEM_MIB)
              for i in range(MAX_NODE_GPUS)],
    )  # fmt: skip
    replica.step(1, inv, subject=telemetry.inventory("n1"))
    top = [MAX_ENERGY_J] * MAX_NODE_GPUS
    replica.step(2, _batch(1, *top, mem=float(MAX_GPU_MEM_MIB)), subject=telemetry.sample("n1"))
    replica.step(3, _batch(2, *top, mem=float(MAX_GPU_MEM_MIB)), subject=telemetry.sample("n1"))
    restored = LedgerReplica(BOOK, core.LedgerConfig())
    restored.restore(replica.to_bytes())
    assert restored.to_bytes() == replica.to_bytes()
    assert restored._s.energy_mj[f"n1/{MAX_NODE_GPUS - 1}"] == MAX_ENERGY_J * 1000


def test_a_checkpoint_from_before_the_anchors_takes_the_nodes_last_energy_time() -> None:
    """A checkpoint written before ``energy_since`` was kept restores without anchors: a
    counter's anchor is then its last reading at its node's last energy time, so the first
    reading after the upgrade is bounded too (and an honest one passes)."""
    replica, _ = _step_all([_inventory(), *(_batch(s, 1000.0 + 700.0 * s) for s in range(1, 10))])
    state = msgspec.msgpack.decode(replica.to_bytes())
    del state["energy_since"]  # as the code before this change wrote it
    before = msgspec.msgpack.encode(state)

    def restored() -> LedgerReplica:
        r = LedgerReplica(BOOK, core.LedgerConfig())
        r.restore(before)
        return r

    honest, inflated = restored(), restored()
    honest.step(20, _batch(19, 1000.0 + 700.0 * 19), subject=telemetry.sample("n1"))
    assert honest._s.energy_since == {"n1/0": (_ms(T0 + timedelta(seconds=9)), 7_300_000)}
    with pytest.raises(InputRejected) as caught:
        inflated.step(20, _batch(19, 1e9), subject=telemetry.sample("n1"))
    assert caught.value.kind == "implausible_energy"
