"""``Ledger.merge`` of ledgers that read one GPU instant under several ids (``readings``).

A GPU's instant is held as one reading: the smaller id's activity and memory, the larger
energy of the instant's readings. ``merge`` rebuilds a sample from that reading, so the fact
it sends under an id is not always the one the receiving ledger saw under that id (a stale
repeat with no energy): it must still raise the instant's energy, or what a merge bills
depends on the order the ledgers are merged in.
"""

from __future__ import annotations

import random

import pytest

from seedance.cost_ledger import core
from seedance.cost_ledger.core.facts import GpuAllocation, GpuSample, JobEnded, NodeInfo
from seedance.cost_ledger.core.ledger import Ledger

BOOK = core.default_price_book()
MODEL = "NVIDIA A100-SXM4-80GB"
T = 1_772_366_400_000  # a window's start
W = core.LedgerConfig().window_ms
AS_OF = T + 6 * W
INV = NodeInfo(event_id="inv1", node="n1", gpu_model=MODEL, gpu_count=2, at_ms=T)


def _sample(eid: str, dt_ms: int, activity: float, mj: int, gpu: int = 0) -> GpuSample:
    return GpuSample(event_id=eid, node="n1", gpu_index=gpu, at_ms=T + dt_ms,
                     activity=activity, energy_mj=mj, mem_used_mib=int(activity * 100))  # fmt: skip


def _ledger(facts: list[core.LedgerInput]) -> Ledger:
    led = Ledger(BOOK)
    led.apply_many(facts)
    return led


def _copy(led: Ledger) -> Ledger:
    return Ledger.from_bytes(led.to_bytes(), BOOK)


# Two instants, each read twice: a stale repeat under the smaller id (no energy: its batch was
# not newer than the GPU's last) and the reading that carries the instant's energy.
A1, C1 = _sample("a1:0", 10_000, 0.1, 0), _sample("c1:0", 10_000, 0.5, 700)
A2, C2 = _sample("a2:0", 20_000, 0.2, 0), _sample("c2:0", 20_000, 0.6, 900)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ([A1, C1, A2], [C2, A2, A1]),  # each holds both readings of one instant, in its order
        ([A1, A2], [C2, C1, A2, A1]),  # one read only the stale repeats
    ],
    ids=["one-instant-each", "stale-only-left"],
)
def test_merging_ledgers_that_hold_an_instants_readings_differently_commutes(
    left: list[core.LedgerInput], right: list[core.LedgerInput]
) -> None:
    whole = _ledger([INV, A1, C1, A2, C2])
    lhs, rhs = _ledger([INV, *left]), _ledger([INV, *right])
    ab, ba = Ledger(BOOK), Ledger(BOOK)
    ab.merge(lhs)
    ab.merge(rhs)
    ba.merge(rhs)
    ba.merge(lhs)
    into_left, into_right = _copy(lhs), _copy(rhs)
    into_left.merge(rhs)
    into_right.merge(lhs)
    for led in (ab, ba, into_left, into_right):
        assert led.fingerprint() == whole.fingerprint()
        assert led.merge(lhs) == 0  # idempotent
        assert led.merge(rhs) == 0
        assert led.fingerprint() == whole.fingerprint()
    ab.advance(AS_OF)
    assert ab.totals() == core.recompute([INV, A1, C1, A2, C2], BOOK, AS_OF)
    assert ab.totals().total.energy_mj == 700 + 900


def _pool(rng: random.Random) -> list[core.LedgerInput]:
    """A node with two GPUs and a job, read at a few instants of two windows, each instant by
    one to three batches (ids drawn at random: the repeat's may sort first or last) whose
    energies are none, the same or different."""
    job = GpuAllocation(event_id="al1", job_id="t/j", tenant="t", node="n1", gpu_model=MODEL,
                        gpu_indices=(0,), start_ms=T + 5_000)  # fmt: skip
    facts: list[core.LedgerInput] = [
        INV, job, JobEnded(event_id="end1", job_id="t/j", end_ms=T + W + 100_000),
    ]  # fmt: skip
    ids = iter(rng.sample(range(1000), 40))
    for dt in (10_000, 20_000, 30_000, W + 10_000):
        for _ in range(rng.randint(1, 3)):
            batch, activity = next(ids), rng.randint(0, 10) / 10
            mj = rng.choice([0, 0, 500, rng.randint(1, 2000)])
            gpus = range(rng.randint(1, 2))  # a GPU may be missing from a batch
            facts.extend(_sample(f"{batch:03d}:{g}", dt, activity, mj, gpu=g) for g in gpus)
    return facts


def test_merge_is_commutative_and_idempotent_over_random_splits() -> None:
    """The reviewer's fuzz in brief (300 seeded trials): overlapping random splits of a set of
    facts, each applied in a random order, one side sometimes advanced (its emission history
    is kept), merged both ways and into a copy of each side, hold what the whole set holds."""
    rng = random.Random(20261207)
    for trial in range(300):
        pool = _pool(rng)
        left = [f for f in pool if rng.random() < 0.6]
        right = [f for f in pool if f not in left or rng.random() < 0.3]
        rng.shuffle(left)
        rng.shuffle(right)
        whole, lhs, rhs = _ledger(pool), _ledger(left), _ledger(right)
        if trial % 2:
            lhs.advance(T + 2 * W)
        ab, ba = Ledger(BOOK), Ledger(BOOK)
        ab.merge(lhs)
        ab.merge(rhs)
        ba.merge(rhs)
        ba.merge(lhs)
        assert ab.fingerprint() == ba.fingerprint() == whole.fingerprint(), trial
        assert ab.merge(lhs) == ab.merge(rhs) == 0, trial
        into_left = _copy(lhs)
        into_left.merge(rhs)
        assert into_left.facts.samples == whole.facts.samples, trial
        into_left.advance(AS_OF)
        assert into_left.totals() == core.recompute(pool, BOOK, AS_OF), trial
