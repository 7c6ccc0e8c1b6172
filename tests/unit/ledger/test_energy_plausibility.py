"""A node cannot bill its tenants more energy than a GPU could draw (``core.energy``).

The energy billed is NVML's counter differenced between a GPU's readings, published by the
node's own credential. Before the rule any rise that fit was billed: one reading 1e15 J above
the last billed ~28 GWh to whoever held the GPU. Now each counter has a token bucket: credit
refilled at ``MAX_GPU_POWER_W`` up to ``ENERGY_SLACK_S`` of it, a rise above the credit
dead-lettered ``implausible_energy`` (changing nothing), a rise within it deducted, a reset
refilling nothing. The rule is a function of the stream's prefix, so stepwise application and
``recompute`` (``ledger_inputs``) agree. Also here: the largest value each wire bound lets
through still checkpoints (the replica's msgpack ints).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from seedance.cost_ledger import core
from seedance.cost_ledger.core.energy import CREDIT_CAP_MJ, ENERGY_SLACK_S, MAX_GPU_POWER_W
from seedance.cost_ledger.core.mapping import InputRejected, facts_of
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


def test_the_mapping_refuses_a_rise_over_the_credit_naming_the_field() -> None:
    last = {"n1/0": 1_000_000}  # 1,000 J at T0 + 1 s, the bucket emptied then
    at = {"n1": _ms(T0 + timedelta(seconds=1))}
    credit = {"n1/0": (at["n1"], 0)}
    ten_s = 10 * MAX_GPU_POWER_W  # the credit refilled in the next 10 s
    ok = _batch(11, 1000.0 + ten_s)
    facts, energy = facts_of(ok, _ms(ok.at), frozenset(), last, at, credit)
    assert energy == {"n1/0": round((1000.0 + ten_s) * 1000)}
    assert facts[0].energy_mj == ten_s * 1000  # type: ignore[union-attr]
    over = _batch(11, 1000.0 + ten_s + 0.002)
    with pytest.raises(InputRejected) as caught:
        facts_of(over, _ms(over.at), frozenset(), last, at, credit)
    assert caught.value.kind == "implausible_energy"
    assert "gpu 0: energy_j = " in str(caught.value)
    assert f"{MAX_GPU_POWER_W} W" in str(caught.value)
    # A reading leaves at most the cap, however long the counter idled before it.
    capped = {"n1/0": (at["n1"], CREDIT_CAP_MJ)}
    most = _batch(31, 1000.0 + SLACK_J + 30 * MAX_GPU_POWER_W)
    assert facts_of(most, _ms(most.at), frozenset(), last, at, capped)[1]
    more = _batch(31, 1000.0 + SLACK_J + 30 * MAX_GPU_POWER_W + 0.002)
    with pytest.raises(InputRejected):
        facts_of(more, _ms(more.at), frozenset(), last, at, capped)


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
    assert hostile._s.energy_credit == clean._s.energy_credit
    hostile.to_bytes()  # and it checkpoints


def test_a_node_at_the_bound_bills_at_most_the_bound_over_any_span() -> None:
    """Each reading as high as the credit allows: the total billed over the run is
    ``MAX_GPU_POWER_W`` times its span plus the cap once, not per reading."""
    events: list[Event] = [_inventory(), _batch(0, 0.0)]
    total_j = float(SLACK_J + MAX_GPU_POWER_W)  # the full bucket and a second, spent at once
    events.append(_batch(1, total_j))
    for s in range(2, 600):
        total_j += MAX_GPU_POWER_W  # what a second refills
        events.append(_batch(s, total_j))
    events.append(_batch(600, total_j + MAX_GPU_POWER_W + 1.0))  # a joule more
    replica, refused = _step_all(events)
    assert [r.kind for r in refused] == ["implausible_energy"]
    billed_mj = replica._s.energy_mj["n1/0"]
    assert billed_mj == (MAX_GPU_POWER_W * 599 + SLACK_J) * 1000  # 599 s since the first


def _billed_j(events: list[Event]) -> tuple[float, int]:
    """Energy billed (J, closed windows) stepping ``events`` and a closer, and the refusals."""
    last = events[-1]
    assert isinstance(last, GpuSampleBatch)
    closer = _batch((last.at - T0).total_seconds() + 3 * 3600, None)
    replica, refused = _step_all([*events, closer])
    return replica.totals().total.energy_mj / 1000, len(refused)


@pytest.mark.parametrize(("hz", "high_j"), [(1, 122_000.0), (10, 120_200.0)])
def test_the_reset_game_bills_at_most_the_bound(hz: int, high_j: float) -> None:
    """Review: a node alternating its counter between 0 and ~122 kJ got the slack back at each
    reset (61 kW billed at 1 Hz, 601 kW at 10 Hz). A reset refills no credit now."""
    n = 3600 if hz == 1 else 6000
    events: list[Event] = [_inventory()]
    events += [_batch(k / hz, 0.0 if k % 2 == 0 else high_j) for k in range(n)]
    billed, refused = _billed_j(events)
    span_s = (n - 1) / hz
    assert billed <= MAX_GPU_POWER_W * span_s + SLACK_J
    assert refused > 0


def test_a_reset_never_refills_the_credit() -> None:
    spent = 5e9 + SLACK_J + MAX_GPU_POWER_W  # the full bucket and a second: all spent
    events: list[Event] = [_inventory(), _batch(1, 5e9), _batch(2, spent)]
    events += [_batch(3, 0.0), _batch(4, float(SLACK_J))]  # reset, and the cap again: refused
    replica, refused = _step_all(events)
    assert [r.kind for r in refused] == ["implausible_energy"]
    # The reset left only the second's 2 kJ since the last reading.
    t3 = _ms(T0 + timedelta(seconds=3))
    assert replica._s.energy_credit["n1/0"] == (t3, MAX_GPU_POWER_W * 1000)
    assert replica._s.energy_mj["n1/0"] == 0


def test_credit_banked_while_idle_is_capped() -> None:
    """Review: 30 days at 100 W banked headroom that one reading spent at once (4.92 GJ in
    30 s accepted). The bucket holds at most the cap however long the GPU idled."""
    events: list[Event] = [_inventory()]
    j = 5e8
    for k in range(30 * 24 * 120):  # a reading every 30 s for 30 days
        events.append(_batch(k * 30, j))
        j += 100 * 30
    last_s = 30 * 24 * 120 * 30
    bank = _batch(last_s, j + 1900 * last_s + 100_000)
    replica, refused = _step_all([*events, bank])
    assert [r.kind for r in refused] == ["implausible_energy"]
    # What it may spend at once: the cap (a 100 W GPU's 30 s is within it).
    replica.step(len(events) + 2, _batch(last_s, j + SLACK_J - 100 * 30), subject=None)


def test_a_clock_step_within_telemetry_ahead_s_refuses_no_honest_reading() -> None:
    """A node's clock steps 10 s ahead for one batch, then back: its next batches are not
    newer (no energy), and the first after it rises by what 1 s refills plus what the step
    held back: the bucket's 60 s hold it, so a 1.4 kW GPU (the largest) is never refused."""
    watts = 1400.0
    times = [*range(1, 20), 30, *range(21, 60)]  # the 20th batch stamped at 30 s, read at 20 s
    reads = [*range(1, 20), 20, *range(21, 60)]
    events: list[Event] = [_inventory()]
    events += [_batch(t, watts * r) for t, r in zip(times, reads, strict=True)]
    _, refused = _step_all(events)
    assert refused == []


@pytest.mark.parametrize("watts", [1400.0, float(MAX_GPU_POWER_W)])
def test_the_collectors_carried_energy_reads_are_never_refused(watts: float) -> None:
    """The NVML collector reads the energy counter every ``COSTLY_INTERVAL_S`` (30 s) and carries
    the last value in the batches between (docs/telemetry.md): the counter stands still for 29
    batches, then rises by 30 s of energy in one second (42 kJ at 1.4 kW, the largest GPU's
    board power; 60 kJ at the rule's 2 kW). The 30 s standing still refilled that much credit.
    The first read may be a carried one too (the ledger's first reading of the GPU)."""
    events: list[Event] = [_inventory()]
    for t in range(29, 400):  # the first batch the ledger reads carries a read 29 s old
        read_at = (t // 30) * 30  # the last costly read
        events.append(_batch(t, 1000.0 + watts * read_at))
    replica, refused = _step_all(events)
    assert refused == []
    assert replica._s.energy_mj["n1/0"] == round((1000.0 + watts * 390) * 1000)


def test_an_honest_counter_reset_is_billed_from_its_new_value() -> None:
    events: list[Event] = [_inventory(), _batch(1, 5e9), _batch(2, 5e9 + 500)]
    events += [_batch(3, 10.0), _batch(4, 10.0 + 500)]  # the driver reloaded: counter from 0
    replica, refused = _step_all(events)
    assert refused == []
    assert replica._s.energy_mj["n1/0"] == 510_000
    # 500 J a second, 2 kJ a second allowed: the credit stays at the cap.
    t4 = _ms(T0 + timedelta(seconds=4))
    assert replica._s.energy_credit["n1/0"] == (t4, CREDIT_CAP_MJ)


def test_an_honest_counter_after_a_telemetry_gap_is_billed() -> None:
    """No reading for an hour (an outage; the collector skips a GPU whose activity it cannot
    read): the counter may rise by 2 kW x the gap, so a 700 W GPU's hour is billed, not
    refused. (A bucket capped across the gap refused it and every reading after it.)"""
    events: list[Event] = [_inventory(), *(_batch(s, 700.0 * s) for s in range(10))]
    events += [_batch(s, 700.0 * s) for s in range(3609, 3620)]
    replica, refused = _step_all(events)
    assert refused == []
    assert replica._s.energy_mj["n1/0"] == 700_000 * 3619


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


def test_a_checkpoint_without_credits_gives_each_counter_the_full_cap() -> None:
    """A checkpoint written before ``energy_credit`` was kept restores with no buckets: each
    counter's is then full at its node's last energy time. An honest reading after the upgrade
    is billed, an inflated one refused."""
    replica, _ = _step_all([_inventory(), *(_batch(s, 1000.0 + 700.0 * s) for s in range(1, 10))])
    state = msgspec.msgpack.decode(replica.to_bytes())
    del state["energy_credit"]  # as the code before this change wrote it
    before = msgspec.msgpack.encode(state)

    def restored() -> LedgerReplica:
        r = LedgerReplica(BOOK, core.LedgerConfig())
        r.restore(before)
        return r

    honest, inflated = restored(), restored()
    honest.step(20, _batch(19, 1000.0 + 700.0 * 19), subject=telemetry.sample("n1"))
    t19 = _ms(T0 + timedelta(seconds=19))
    assert honest._s.energy_credit == {"n1/0": (t19, CREDIT_CAP_MJ)}
    allowed_j = 1000.0 + 700.0 * 9 + SLACK_J + 10 * MAX_GPU_POWER_W
    inflated.step(20, _batch(19, allowed_j), subject=telemetry.sample("n1"))  # the most
    with pytest.raises(InputRejected) as caught:
        restored().step(20, _batch(19, allowed_j + 0.002), subject=telemetry.sample("n1"))
    assert caught.value.kind == "implausible_energy"


def test_replicas_restored_from_different_old_checkpoints_decide_alike() -> None:
    """Review (MEDIUM): replicas restored from a 10-min and a 60-min checkpoint written before
    the rule's state was kept derived different anchors, so one refused a burst the other took.
    Now the one that replays 50 min of an honest node has a full bucket at its last reading,
    as the other takes it: they decide the next readings alike, refusal or not."""
    events: list[Event] = [
        _inventory(),
        *(_batch(30 * k, 1e6 + 300.0 * 30 * k) for k in range(121)),
    ]

    def old(upto: int) -> bytes:
        r, _ = _step_all(events[:upto])
        state = msgspec.msgpack.decode(r.to_bytes())
        del state["energy_credit"]
        return msgspec.msgpack.encode(state)

    a, b = LedgerReplica(BOOK, core.LedgerConfig()), LedgerReplica(BOOK, core.LedgerConfig())
    a.restore(old(21))
    for seq, e in enumerate(events[21:], 22):
        a.step(seq, e, subject=telemetry.sample("n1"))
    b.restore(old(len(events)))
    t = 30 * 121
    for jump in (1e6, SLACK_J + 30 * MAX_GPU_POWER_W, SLACK_J + 30 * MAX_GPU_POWER_W + 0.002):
        burst = _batch(t, 1e6 + 300.0 * 30 * 120 + jump)
        outcomes = []
        for r in (a, b):
            try:
                copy = LedgerReplica(BOOK, core.LedgerConfig())
                copy.restore(r.to_bytes())
                copy.step(200, burst, subject=telemetry.sample("n1"))
                outcomes.append("ok")
            except InputRejected as exc:
                outcomes.append(exc.kind)
        assert outcomes[0] == outcomes[1], (jump, outcomes)
