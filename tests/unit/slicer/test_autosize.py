"""Right-sizing that applies itself, with a guard (`seedance.slicer.core.autosize`): shares
lowered to measured use for opted-in tenants, rolled back with an alarm when the billed cost or
the time held at the share (the SLO signal) deviates past its bound, kept otherwise; its state
survives a restore at any point."""

from __future__ import annotations

import dataclasses
import random

import msgspec
import pytest

from seedance.slicer.core.autosize import (
    AutosizeConfig,
    Autosizer,
    GuardSignal,
    GuardTripped,
    Phase,
    ShareReading,
    ShareResized,
)

CFG = AutosizeConfig(
    tenants=frozenset({"acme"}), min_history_s=60, min_samples=6, guard_s=120, window_s=30
)


def reading(sm: float, at_s: float, *, job: str = "j", node: str = "n1", gpu: int = 0,
            tenant: str = "acme", span_s: float = 10,
            mem: float | None = None) -> ShareReading:  # fmt: skip
    return ShareReading(tenant=tenant, job_id=job, node=node, gpu=gpu, sm_share=sm,
                        window_start_s=at_s - span_s, at_s=at_s, mem_used_mib=mem)  # fmt: skip


def feed(a: Autosizer, sm: float, start_s: float, n: int, **kw: object) -> list[object]:
    out: list[object] = []
    for i in range(n):
        out += a.observe(reading(sm, start_s + 10 * (i + 1), **kw))  # type: ignore[arg-type]
    return out


def measured(milli: int = 500) -> Autosizer:
    a = Autosizer(CFG)
    a.placed("acme", "j", "n1", [(0, milli)])
    return a


def test_a_job_is_lowered_to_its_measured_share_once_it_has_a_past() -> None:
    a = measured()
    assert feed(a, 0.10, 0, 5) == []  # 50 s and 5 readings: too short a past
    (effect,) = feed(a, 0.10, 50, 1)
    assert isinstance(effect, ShareResized)
    assert (effect.from_milli, effect.to_milli, effect.reason) == (500, 100, "rightsized")
    assert (effect.node, effect.gpu, effect.at_s) == ("n1", 0, 60)
    assert "p95 of 6 readings over 60 s is 10 % of the GPU" in effect.detail
    assert a.state.tracks["acme/j"].phase is Phase.GUARDING


def test_a_window_read_twice_counts_once() -> None:
    """The node agent's pod-share id is random (docs/security.md, "Nats-Msg-Id"), so a window
    built into two events is two messages; each window of the job's is measured once, by its
    start. Counted twice, the lowering came from 7 readings, the copy among them."""
    a = measured()
    feed(a, 0.10, 0, 5)
    assert a.observe(reading(0.10, 50)) == []  # the window [40, 50) again
    assert a.observe(reading(0.90, 45, span_s=15)) == []  # and an earlier one, late
    (effect,) = feed(a, 0.10, 50, 1)
    assert isinstance(effect, ShareResized)
    assert "p95 of 6 readings over 60 s" in effect.detail


def test_a_job_whose_use_stays_under_its_new_share_keeps_it() -> None:
    a = measured()
    feed(a, 0.10, 0, 6)
    assert feed(a, 0.10, 60, 12) == []  # 120 s of guard windows, none deviating
    assert a.state.tracks["acme/j"].phase is Phase.KEPT
    assert a.state.tracks["acme/j"].milli == 100
    assert feed(a, 0.90, 180, 12) == []  # kept: no longer watched


def test_a_deviation_past_the_bound_rolls_back_and_raises_the_alarm() -> None:
    a = measured()
    feed(a, 0.10, 0, 6)
    # The first guard window (30 s) at 30 %: billed max(0.1, 0.3) = 3x the predicted 0.1.
    out = feed(a, 0.30, 60, 3)
    back, alarm = out
    assert isinstance(back, ShareResized)
    assert (back.from_milli, back.to_milli, back.reason) == (100, 500, "rolled_back")
    assert isinstance(alarm, GuardTripped)
    assert (alarm.applied_milli, alarm.restored_milli) == (100, 500)
    assert alarm.deviation_ppm == pytest.approx(2_000_000, abs=1)
    assert alarm.bound_ppm == 50_000
    assert alarm.signal is GuardSignal.COST
    track = a.state.tracks["acme/j"]
    assert (track.milli, track.phase) == (500, Phase.ROLLED_BACK)
    assert feed(a, 0.01, 90, 20) == []  # not tried again while the placement lasts


@pytest.mark.parametrize(("sm", "trips"), [(0.104, False), (0.106, True)])
def test_the_bound_is_five_percent_of_the_predicted_cost(sm: float, trips: bool) -> None:
    a = measured()
    feed(a, 0.10, 0, 6)
    out = feed(a, sm, 60, 3)
    assert bool(out) is trips


def test_a_short_spike_inside_a_window_is_judged_on_the_window() -> None:
    a = measured()
    feed(a, 0.10, 0, 6)
    # One 10 s reading at 20 % among three: the window billed (0.2 + 0.1 + 0.1) / 3 = 0.133.
    out = feed(a, 0.20, 60, 1) + feed(a, 0.10, 70, 2)
    assert [type(e) for e in out] == [ShareResized, GuardTripped]
    assert out[1].deviation_ppm == pytest.approx(333_333, abs=1)  # type: ignore[attr-defined]


def test_a_small_cut_is_not_worth_a_change() -> None:
    a = measured(milli=140)  # measured 10 % -> 100 milli: 40 below, under the 50 step
    assert feed(a, 0.10, 0, 20) == []
    assert a.state.tracks["acme/j"].phase is Phase.MEASURING


def test_only_opted_in_tenants_and_shared_placements_are_tracked() -> None:
    a = Autosizer(CFG)
    a.placed("globex", "j", "n1", [(0, 500)])
    a.placed("acme", "whole", "n1", [(0, 1000)])
    a.placed("acme", "two", "n1", [(0, 500), (1, 500)])
    assert a.state.tracks == {}
    assert feed(a, 0.1, 0, 10, tenant="globex") == []
    every = Autosizer(AutosizeConfig(tenants=frozenset({"*"})))
    every.placed("globex", "j", "n1", [(0, 500)])
    assert list(every.state.tracks) == ["globex/j"]


def test_readings_of_another_gpu_node_or_an_ended_job_change_nothing() -> None:
    a = measured()
    assert feed(a, 0.1, 0, 10, gpu=1) == []
    assert feed(a, 0.1, 0, 10, node="n2") == []
    assert a.state.tracks["acme/j"].use.samples == 0
    a.ended("acme", "j")
    assert feed(a, 0.1, 0, 10) == []
    a.placed("acme", "j", "n2", [(3, 400)])  # placed again: a new track
    assert a.state.tracks["acme/j"].node == "n2"


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"sm": 1.5}, "sm_share"),
        ({"sm": -0.1}, "sm_share"),
        ({"span_s": -5}, "window_start"),
        ({"mem": -1.0}, "mem_used_mib"),
        ({"mem": float("nan")}, "mem_used_mib"),
    ],
)
def test_a_bad_reading_is_refused_naming_the_field(kw: dict[str, float], field: str) -> None:
    a = measured()
    before = a.to_bytes()
    sm = kw.pop("sm", 0.1)
    with pytest.raises(ValueError, match=field):
        a.observe(reading(sm, 100, **kw))  # type: ignore[arg-type]
    assert a.to_bytes() == before


def test_a_restored_loop_decides_as_the_original() -> None:
    """A random stream of placements, ends and readings, against a copy restored from bytes
    before every input: the same effects and the same bytes throughout."""
    rng = random.Random(5)
    a = Autosizer(CFG)
    effects_a: list[object] = []
    effects_b: list[object] = []
    t = 0.0
    for _ in range(600):
        b = Autosizer.from_bytes(CFG, a.to_bytes())
        job = f"j{rng.randrange(3)}"
        roll, milli, sm = rng.random(), rng.choice((300, 500, 800)), rng.choice((0.05, 0.1, 0.4))
        for x, out in ((a, effects_a), (b, effects_b)):
            if roll < 0.02:
                x.placed("acme", job, "n1", [(0, milli)])
            elif roll < 0.03:
                x.ended("acme", job)
            else:
                out += x.observe(reading(sm, t + 10, job=job))
        t += 10
        assert a.to_bytes() == b.to_bytes()
        a = b
    assert effects_a == effects_b
    assert any(isinstance(e, GuardTripped) for e in effects_a)


def rolled_back() -> Autosizer:
    """Placed at 500, lowered to 100, rolled back to 500: the loop asked 500 again."""
    a = measured()
    feed(a, 0.10, 0, 6)
    assert [type(e) for e in feed(a, 0.30, 60, 3)] == [ShareResized, GuardTripped]
    return a


def test_the_track_follows_the_share_the_scheduler_kept_and_gave_back() -> None:
    a = rolled_back()
    # The loop's own changes come back on the stream: they start from a share it left.
    a.share_set("acme", "j", "n1", 0, 500, 100)  # its rightsizing
    a.share_set("acme", "j", "n1", 0, 100, 500)  # its rollback
    assert a.state.tracks["acme/j"].milli == 500
    a.share_set("acme", "j", "n1", 0, 500, 400)  # the scheduler kept 400 of the 500 asked
    a = Autosizer.from_bytes(CFG, a.to_bytes())
    assert a.state.tracks["acme/j"].milli == 400
    a.share_set("acme", "j", "n2", 0, 400, 450)  # another placement's: nothing
    a.share_set("acme", "j", "n1", 1, 400, 450)
    a.share_set("acme", "j", "n1", 0, 350, 450)  # from a share it does not hold: nothing
    assert a.state.tracks["acme/j"].milli == 400
    a.share_set("acme", "j", "n1", 0, 400, 500)  # given back as room freed
    assert (a.state.tracks["acme/j"].milli, a.state.tracks["acme/j"].phase) == (
        500,
        Phase.ROLLED_BACK,
    )


def test_a_later_change_after_a_kept_share_starts_from_the_share_the_scheduler_holds() -> None:
    # Whatever the phase: a track the scheduler set a share of (here, still measuring)
    # decides its next change from that share, not from the one it last asked.
    a = measured(600)
    a.share_set("acme", "j", "n1", 0, 600, 400)
    (effect,) = feed(a, 0.10, 0, 6)
    assert isinstance(effect, ShareResized)
    assert (effect.from_milli, effect.to_milli, effect.reason) == (400, 100, "rightsized")


def test_a_share_set_outside_one_gpu_is_refused_naming_it() -> None:
    a = rolled_back()
    before = a.to_bytes()
    with pytest.raises(ValueError, match="to_milli=1000"):
        a.share_set("acme", "j", "n1", 0, 500, 1000)
    assert a.to_bytes() == before


# -- the SLO signal: the time held at the share ---------------------------------------------
SLO_CFG = dataclasses.replace(CFG, min_history_s=200, min_samples=20)


def throttle_prone(cfg: AutosizeConfig = SLO_CFG) -> Autosizer:
    """Placed at 500; 20 readings, 18 at 4 % and 2 at 10 %: lowered to its p95, 100 milli,
    which its history reached 10 % of the time (the time at the limit the change predicts)."""
    a = Autosizer(cfg)
    a.placed("acme", "j", "n1", [(0, 500)])
    feed(a, 0.10, 0, 2)
    (lowered,) = feed(a, 0.04, 20, 18)
    assert isinstance(lowered, ShareResized)
    assert (lowered.from_milli, lowered.to_milli) == (500, 100)
    assert a.state.tracks["acme/j"].expected_held == pytest.approx(0.10)
    return a


def test_a_job_held_at_its_new_share_rolls_back_on_the_slo_signal_alone() -> None:
    a = throttle_prone()
    # A guard window (30 s) pinned at the new limit: billed exactly the share (cost +0 %), but
    # held there 100 % of the time where its history reached it 10 % of the time.
    back, alarm = feed(a, 0.10, 200, 3)
    assert isinstance(back, ShareResized)
    assert (back.from_milli, back.to_milli, back.reason) == (100, 500, "rolled_back")
    assert isinstance(alarm, GuardTripped)
    assert alarm.signal is GuardSignal.SLO
    assert (alarm.deviation_ppm, alarm.bound_ppm) == (900_000, 50_000)
    assert "held at its share 100.0% of the time against 10.0%" in alarm.detail
    assert "billed +0.0%" in alarm.detail
    assert (a.state.tracks["acme/j"].milli, a.state.tracks["acme/j"].phase) == (
        500,
        Phase.ROLLED_BACK,
    )


@pytest.mark.parametrize(("held_s", "trips"), [(4.4, False), (4.6, True)])
def test_the_slo_bound_is_five_points_over_the_time_its_history_predicts(
    held_s: float, trips: bool
) -> None:
    """One 30 s window, `held_s` of it at the limit: 14.7 % and 15.3 % against 10 % + 5."""
    a = throttle_prone()
    out = a.observe(reading(0.10, 200 + held_s, span_s=held_s))
    out += a.observe(reading(0.04, 230, span_s=30 - held_s))
    assert [type(e) for e in out] == ([ShareResized, GuardTripped] if trips else [])
    if not trips:  # the window closed within the bound: the next starts afresh
        assert a.state.tracks["acme/j"].window_held_s == 0.0


def test_a_window_within_the_bound_does_not_carry_into_the_next_and_nothing_flaps() -> None:
    a = throttle_prone(dataclasses.replace(SLO_CFG, window_s=100, guard_s=200))
    # 100 s windows held at the limit 1 reading in 10, as its history was: within the bound,
    # each window judged on its own, over the whole guard: kept and no longer watched.
    assert feed(a, 0.04, 200, 9) + feed(a, 0.10, 290, 1) == []
    assert feed(a, 0.04, 300, 9) + feed(a, 0.10, 390, 1) == []
    assert a.state.tracks["acme/j"].phase is Phase.KEPT
    assert feed(a, 0.10, 400, 20) == []  # kept: pinned later is not a rollback any more


def test_after_an_slo_rollback_the_job_is_not_lowered_again_while_placed() -> None:
    a = throttle_prone()
    assert [type(e) for e in feed(a, 0.10, 200, 3)] == [ShareResized, GuardTripped]
    # A long quiet past at the restored share: no second try, no second alarm.
    assert feed(a, 0.01, 230, 60) == []
    assert a.state.tracks["acme/j"].milli == 500
    a.placed("acme", "j", "n1", [(0, 500)])  # placed again: a new track, measured afresh
    assert a.state.tracks["acme/j"].phase is Phase.MEASURING


def test_a_track_guarded_before_the_slo_check_existed_is_guarded_on_cost_alone() -> None:
    a = throttle_prone()
    old = a.state.tracks["acme/j"]
    # The state a build without the field wrote: the field is absent, decoded as its default.
    raw = msgspec.msgpack.decode(a.to_bytes())
    del raw["tracks"]["acme/j"]["expected_held"]
    b = Autosizer.from_bytes(SLO_CFG, msgspec.msgpack.encode(raw))
    assert b.state.tracks["acme/j"].expected_held == 1.0
    assert b.state.tracks["acme/j"].milli == old.milli
    assert feed(b, 0.10, 200, 12) == []  # pinned, but no SLO prediction to deviate from


@pytest.mark.parametrize("bound", [0.0, 1.0])
def test_the_slo_bound_is_checked_at_construction(bound: float) -> None:
    with pytest.raises(ValueError, match="slo_bound"):
        AutosizeConfig(slo_bound=bound)


# -- memory: the MPS memory limit from the measured peak, raised back as the pod grows --------
def with_memory(last_mib: float | None = 1000.0) -> tuple[Autosizer, ShareResized]:
    """Placed at 500; six readings at 10 %, five holding 800 MiB and the last `last_mib`:
    lowered to 100 milli."""
    a = measured()
    for i in range(5):
        assert a.observe(reading(0.10, 10 * (i + 1), mem=800.0)) == []
    (lowered,) = a.observe(reading(0.10, 60, mem=last_mib))
    assert isinstance(lowered, ShareResized)
    return a, lowered


def test_the_memory_limit_is_lowered_with_the_share_to_the_measured_peak_plus_headroom() -> None:
    a, lowered = with_memory()
    assert (lowered.to_milli, lowered.mem_limit_mib) == (100, 1050)  # 1000 MiB + 5 %
    assert "memory limit 1050 MiB: peak 1000 MiB plus 5%" in lowered.detail
    assert (a.state.tracks["acme/j"].mem_limit_mib, a.state.tracks["acme/j"].previous_mem_mib) == (
        1050,
        0,
    )


def test_a_history_missing_a_memory_reading_leaves_the_memory_limit_alone() -> None:
    a, lowered = with_memory(last_mib=None)
    assert (lowered.to_milli, lowered.mem_limit_mib) == (100, 0)
    assert feed(a, 0.05, 60, 1, mem=5000.0) == []  # no limit of the loop's to outgrow


@pytest.mark.parametrize(("used_mib", "trips"), [(1024.0, False), (1025.0, True)])
def test_memory_grown_half_into_the_headroom_rolls_the_change_back(
    used_mib: float, trips: bool
) -> None:
    a, _ = with_memory()  # limit 1050 from a 1000 MiB peak: the alarm at 1025
    out = a.observe(reading(0.05, 70, mem=used_mib))
    if not trips:
        assert out == []
        return
    back, alarm = out
    assert isinstance(back, ShareResized)
    assert isinstance(alarm, GuardTripped)
    assert (back.from_milli, back.to_milli, back.mem_limit_mib) == (100, 500, 0)
    assert alarm.signal is GuardSignal.MEMORY
    assert (alarm.deviation_ppm, alarm.bound_ppm) == (25_000, 25_000)
    assert "1025 MiB in use against the 1000 MiB peak its limit of 1050 MiB" in alarm.detail
    t = a.state.tracks["acme/j"]
    assert (t.milli, t.mem_limit_mib, t.phase) == (500, 0, Phase.ROLLED_BACK)
    assert feed(a, 0.05, 70, 10, mem=2000.0) == []  # rolled back: nothing more to do


def test_a_kept_change_is_still_rolled_back_when_its_memory_grows() -> None:
    a, _ = with_memory()
    assert feed(a, 0.08, 60, 12, mem=1000.0) == []  # the guard passes: kept
    assert a.state.tracks["acme/j"].phase is Phase.KEPT
    back, alarm = feed(a, 0.08, 180, 1, mem=1040.0)
    assert isinstance(back, ShareResized)
    assert isinstance(alarm, GuardTripped)
    assert alarm.signal is GuardSignal.MEMORY
    assert (back.to_milli, back.mem_limit_mib) == (500, 0)


def _autosize_effects() -> list[tuple[object, str]]:
    """Each effect type `events_of` publishes, and its id's derivation name."""
    from seedance.slicer.core.autosize import ShareResized

    at_s = 1_700_000_000.0
    change = ShareResized(
        tenant="acme", job_id="j", node="n1", gpu=0, from_milli=500, to_milli=300,
        reason="rightsized", detail="", at_s=at_s,
    )  # fmt: skip
    alert = GuardTripped(
        tenant="acme", job_id="j", node="n1", applied_milli=300, restored_milli=500,
        deviation_ppm=2, bound_ppm=1, detail="", at_s=at_s,
    )  # fmt: skip
    return [(change, "share/acme/j/rightsized"), (alert, "share-alert/acme/j")]


@pytest.mark.parametrize(
    ("effect", "name"), _autosize_effects(), ids=[type(e).__name__ for e, _ in _autosize_effects()]
)
def test_a_share_changes_and_alerts_id_is_keyed_with_the_slicers_key(
    effect: object, name: str
) -> None:
    """The change's (and the alert's) cause is the node's own reading, whose id the node chose:
    unkeyed, the node could compute the id and spend it first in the ledger's input
    (docs/security.md, "Nats-Msg-Id"). Keyed, the same key gives the same id (a re-publish
    after a crash)."""
    from seedance.events import derived_event_id, new_event_id
    from seedance.slicer.autosize import events_of

    reading = new_event_id()
    key = bytes(range(32))
    unkeyed = derived_event_id(reading, name)
    assert events_of(effect, reading, key=None)[1].id == unkeyed  # type: ignore[arg-type]  # the node's
    keyed = events_of(effect, reading, key=key)[1].id  # type: ignore[arg-type]
    assert keyed != unkeyed
    assert keyed == derived_event_id(reading, name, key=key)
