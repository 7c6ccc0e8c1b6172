"""The fleet planner's state as store entries (`seedance.router.plan_state.PlanEntries`).

Review2 finding 4 and its follow-up: the state was one KV value, rewritten whole after every
plan and cut to one message (above ~130 req/s a handover kept less than the planner's 600 s).
Now it is entries of a `StateStore`: a commit holds what the plan changed, a restore gives the
whole state back.
"""

from __future__ import annotations

import random
from dataclasses import replace

import msgspec

from seedance.core.state_store import encode_records
from seedance.router.core.planning.load import LoadEstimator
from seedance.router.core.planning.planner import PlanState
from seedance.router.plan_observations import MergeState
from seedance.router.plan_state import CHUNK_ARRIVALS, ModelSnapshot, PlanEntries, PlanSnapshot

T0 = 1_767_225_600.0  # a bin edge
BIN_S = 15.0


def _arrivals(rate: float, start_s: float, span_s: float, seed: int) -> list[tuple[float, int]]:
    rnd = random.Random(seed)
    return sorted(
        (start_s + rnd.random() * span_s, rnd.randrange(50, 4000))
        for _ in range(int(rate * span_s))
    )


def _snapshot(
    arrivals: dict[str, list[tuple[float, int]]],
    pending: dict[str, list[tuple[float, int]]] | None = None,
    *,
    seq: int = 7,
    factor: float = 2.0,
) -> PlanSnapshot:
    models = {}
    for model, arr in arrivals.items():
        est = LoadEstimator()
        est.observe_arrivals(arr)
        models[model] = ModelSnapshot(
            plan=PlanState(replicas=4, capacity_factor=factor, needs=((T0, 3),)),
            estimator=replace(est.state(), errors=((60.0, (0.5, -0.25)),), open=((T0, 60.0, 3.0),)),
        )
    merge = MergeState(
        applied=(("gw-a", "m", T0), ("gw-b", "m", T0 - BIN_S)),
        left=(("gw-b", "m"),),
        pending=tuple((m, tuple(p)) for m, p in sorted((pending or {}).items())),
        outcomes=(("m", ((T0 - BIN_S, 3, 4),)),),
        released_s=T0,
    )
    return PlanSnapshot(seq=seq, planned_s=T0, models=models, merge=merge)


def _restored(entries: dict[str, bytes]) -> PlanSnapshot | None:
    return PlanEntries(BIN_S).restore(entries)


def _store(entries: dict[str, bytes], changes: dict[str, bytes | None]) -> dict[str, bytes]:
    """`entries` after a commit of `changes` (what `StateStore.commit` does to its map)."""
    out = dict(entries)
    for k, v in changes.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def test_the_whole_state_comes_back_from_its_entries_past_one_message() -> None:
    # 500 req/s of one model over the estimator's 600 s and 200 req/s of another: ~6 MB of
    # msgpack, where the one-value snapshot kept what fitted 1 MiB; a bin past one chunk too.
    snap = _snapshot(
        {
            "m": _arrivals(500, T0 - 600, 600, 1),
            "n/x": _arrivals(200, T0 - 600, 600, 2),  # a model name holding "/"
            "burst": [(T0 - 7.5, 100)] * (CHUNK_ARRIVALS * 2 + 5),  # one bin, three chunks
        },
        {"m": _arrivals(500, T0, 30, 3)},
    )
    assert len(msgspec.msgpack.encode(snap)) > 5 * (1 << 20)
    entries = PlanEntries(BIN_S).entries(snap)
    assert _restored(entries) == snap
    # Every entry fits a journal record of the store (900 KiB), whatever the rate.
    assert max(len(v) for v in entries.values()) < CHUNK_ARRIVALS * 16
    assert {k for k in entries if k.startswith("a/") and k.endswith("/burst")} == {
        f"a/{int((T0 - 7.5) // BIN_S)}/{c}/burst" for c in range(3)
    }


def test_a_commit_holds_what_the_plan_changed_not_the_history() -> None:
    """One interval later: a bin released into the estimator, the oldest bin gone from its
    window, the plan and the sequence moved on. The commit is those, ~1/40 of the state."""
    history = _arrivals(300, T0 - 600, 615, 4)
    before = _snapshot({"m": [a for a in history if a[0] < T0]})
    entries = PlanEntries(BIN_S)
    stored = entries.entries(before)
    entries.committed()
    assert entries.changes(before) == {}  # nothing changed: nothing to commit

    after = _snapshot(
        {"m": [a for a in history if T0 - 600 + BIN_S <= a[0] < T0 + BIN_S]}, seq=9, factor=2.1
    )
    changes = entries.changes(after)
    new_bin, old_bin = int(T0 // BIN_S), int((T0 - 600) // BIN_S)
    # The estimator's scoring record (its open forecasts, their errors) moves every plan too.
    assert set(changes) == {"~seq", "p/m", "e/m", f"a/{new_bin}/0/m", f"a/{old_bin}/0/m"}
    assert changes[f"a/{old_bin}/0/m"] is None  # deleted
    committed = sum(len(v) for v in changes.values() if v is not None)
    assert committed < sum(len(v) for v in stored.values()) / 30
    entries.committed()
    assert _restored(_store(stored, changes)) == after


def test_a_commit_that_failed_is_held_by_the_next() -> None:
    """Until `committed`, the diff is against what the store holds: a commit the bus refused
    leaves its changes to the next one."""
    entries = PlanEntries(BIN_S)
    first = _snapshot({"m": _arrivals(50, T0 - 60, 60, 5)})
    stored = entries.entries(first)
    entries.committed()
    second = _snapshot({"m": _arrivals(50, T0 - 60, 75, 5)}, seq=8)
    lost = entries.changes(second)  # the commit of these fails
    third = _snapshot({"m": _arrivals(50, T0 - 60, 90, 5)}, seq=9)
    changes = entries.changes(third)
    assert set(lost) <= set(changes)
    assert _restored(_store(stored, changes)) == third


def test_a_late_arrival_rewrites_its_own_bin_only() -> None:
    arrivals = _arrivals(100, T0 - 600, 600, 6)
    entries = PlanEntries(BIN_S)
    stored = entries.entries(_snapshot({"m": arrivals}))
    entries.committed()
    late = sorted([*arrivals, (T0 - 301.0, 77)])  # a gateway not waited for reports at last
    changes = entries.changes(_snapshot({"m": late}))
    assert set(changes) == {f"a/{int((T0 - 301.0) // BIN_S)}/0/m"}
    assert _restored(_store(stored, changes)) == _snapshot({"m": late})


def test_pending_arrivals_come_back_in_time_order_and_leave_once_released() -> None:
    pending = _arrivals(200, T0, 30, 7)
    shuffled = pending[:]
    random.Random(8).shuffle(shuffled)  # as gateways' reports extend it
    entries = PlanEntries(BIN_S)
    stored = entries.entries(_snapshot({"m": []}, {"m": shuffled}))
    entries.committed()
    restored = _restored(stored)
    assert restored is not None
    assert restored.merge.pending == (("m", tuple(pending)),)
    changes = entries.changes(_snapshot({"m": pending}))  # released into the estimator
    assert {k for k, v in changes.items() if v is None} == {k for k in stored if k[0] == "q"}
    assert _restored(_store(stored, changes)) == _snapshot({"m": pending})


def test_entries_this_version_cannot_read_are_replaced_whole() -> None:
    entries = PlanEntries(BIN_S)
    stored = entries.entries(_snapshot({"m": _arrivals(20, T0 - 60, 60, 9)}))
    newer = {**stored, "z/m": b"\x01", "p/m": b"\xc1"}  # an unknown entry, a broken one
    again = PlanEntries(BIN_S)
    assert again.restore(newer) is None
    fresh = _snapshot({"m": _arrivals(20, T0 - 30, 30, 10)})
    changes = again.changes(fresh)
    assert changes["z/m"] is None  # not this version's: deleted
    assert changes["p/m"] == _store(newer, changes)["p/m"] != newer["p/m"]  # rewritten
    assert _restored(_store(newer, changes)) == fresh
    assert PlanEntries(BIN_S).restore({}) is None


def test_a_commit_splits_into_store_records_without_an_oversized_entry() -> None:
    snap = _snapshot({"m": _arrivals(500, T0 - 600, 600, 11)})
    records = encode_records(0, PlanEntries(BIN_S).entries(snap))
    assert len(records) > 1
    assert all(len(r) <= 900 * 1024 for r in records)


def test_a_bin_that_lost_its_oldest_and_gained_a_late_arrival_is_rewritten() -> None:
    """Bins are compared by count and their first and last arrival (objects), not element by
    element: the window's edge dropping a bin's oldest arrival while a late one lands in it
    keeps its count and its last, and must still be written."""
    arrivals = _arrivals(100, T0 - 600, 600, 12)
    entries = PlanEntries(BIN_S)
    stored = entries.entries(_snapshot({"m": arrivals}))
    entries.committed()
    edge = int(arrivals[0][0] // BIN_S)
    in_bin = [a for a in arrivals if int(a[0] // BIN_S) == edge]
    late = (in_bin[len(in_bin) // 2][0] + 1e-6, 5)
    moved = sorted([*arrivals[1:], late])
    changes = entries.changes(_snapshot({"m": moved}))
    # "e/m": this test's estimator is built afresh, so its first arrival's time moved too.
    assert set(changes) == {f"a/{edge}/0/m", "e/m"}
    assert _restored(_store(stored, changes)) == _snapshot({"m": moved})
