"""The compile's run budget: every in-process run of one compile draws on one budget, so a model
tuned to run just under the per-run bound (``run_timeout_s``) cannot make dozens of such runs;
the measurement children are bounded by a time derived from the slowest in-process run. A
review's 263-byte ``Loop`` at 0.94 s a run under a 2 s bound took 67.7 s and compiled "ok"."""

from __future__ import annotations

import time

import numpy as np
import pytest
from gc_onnx_kit import StandInMeasurer, loop_forever_model, loop_model, loop_trips_for

from seedance.graph_compiler import (
    ModelRunTimeout,
    Precision,
    PrecisionPolicy,
    RunBudgetExhausted,
    SessionProfile,
    compile_model,
    sessions,
)
from seedance.graph_compiler.measuring import OrtMeasurer
from seedance.graph_compiler.sessions import RunBudget, make_session
from seedance.graph_compiler.settings import GraphCompilerSettings

FP32 = PrecisionPolicy(priority_order=[Precision.FP32])
FEEDS = {"x": np.zeros((1, 4), np.float32)}


def test_a_compile_of_runs_each_under_the_run_bound_is_stopped_by_its_budget():
    """Each run ~0.5 s under a 30 s bound: the 8 reference runs alone are over a 1 s budget."""
    model = loop_model(loop_trips_for(0.5))
    assert model.ByteSize() < 400
    started = time.monotonic()
    with pytest.raises(RunBudgetExhausted) as caught:
        compile_model(model, FP32, run_timeout_s=30, budget=RunBudget(1.0))
    took_s = time.monotonic() - started
    text = str(caught.value)
    assert "the compile's run budget of 1 s is spent" in text, text
    assert "run(s) of the model took" in text
    assert not isinstance(caught.value, ModelRunTimeout)  # no run reached the per-run bound
    assert took_s < 30  # stopped by the budget, not by a run's bound nor the compile's timeout


def test_each_run_is_bounded_by_what_is_left_of_the_budget_then_none_starts():
    budget = RunBudget(0.5)
    sess = make_session(loop_forever_model(), threads=1, run_timeout_s=30, budget=budget)
    started = time.monotonic()
    with pytest.raises(RunBudgetExhausted, match=r"run budget of 0\.5 s is spent: 1 run"):
        sess.run(FEEDS)
    assert time.monotonic() - started < 15  # the budget's 0.5 s, not the run bound's 30 s
    assert budget.spent_s >= 0.5
    with pytest.raises(RunBudgetExhausted):
        sess.run(FEEDS)  # nothing left: refused without running
    assert budget.runs == 1


def test_the_per_run_bound_still_answers_when_it_is_the_lesser():
    budget = RunBudget(60)
    sess = make_session(loop_forever_model(), threads=1, run_timeout_s=0.2, budget=budget)
    with pytest.raises(ModelRunTimeout, match=r"over 0\.2 s") as caught:
        sess.run(FEEDS)
    assert not isinstance(caught.value, RunBudgetExhausted)
    assert 0.2 <= budget.spent_s < 60


class _RunsBudget(RunBudget):
    """A budget that lets ``runs`` runs start, then has nothing left: where in the compile it
    runs out is then chosen by the test rather than by the machine's speed."""

    def __init__(self, runs: int) -> None:
        super().__init__(3600)
        self.allowed = runs

    def left_s(self) -> float | None:
        return 3600.0 if self.runs < self.allowed else 0.0


def test_a_budget_spent_inside_a_candidate_s_check_ends_the_compile_not_the_candidate(small_cnn):
    """The INT8 candidate's check used to catch every exception and drop the candidate: the
    budget running out there gave AccuracyCheckFailed ("int8: quantisation failed")."""
    int8 = PrecisionPolicy(priority_order=[Precision.INT8], calibration_samples=2)
    counted = RunBudget()
    compile_model(small_cnn, int8, run_timeout_s=60, budget=counted)
    assert counted.runs > 4  # reference, the passes' check, then the INT8 check's runs last
    with pytest.raises(RunBudgetExhausted, match="run budget"):
        compile_model(small_cnn, int8, run_timeout_s=60, budget=_RunsBudget(counted.runs - 1))


def test_a_measurement_child_is_bounded_by_the_slowest_in_process_run(monkeypatch):
    """Timing children had a constant 1,200 s: a model fast in process and endless in the
    child (the timed model here) held the compile for all of it."""
    monkeypatch.setattr(sessions, "CHILD_START_S", 3.0)  # a child's start, shortened for test
    monkeypatch.setattr(sessions, "VARIANT_LOAD_S", 0.0)
    budget = RunBudget()
    make_session(loop_model(loop_trips_for(0.01)), budget=budget).run(FEEDS)
    assert 0 < budget.slowest_s < 1
    measurer = OrtMeasurer(runs=2, budget=budget)
    started = time.monotonic()
    with pytest.raises(RunBudgetExhausted, match="measurement child took over") as caught:
        measurer.time([("loop", loop_forever_model().SerializeToString(), SessionProfile())], FEEDS)
    assert time.monotonic() - started < 30  # not the 1,200 s cap
    assert "slowest in-process run" in str(caught.value)
    assert budget.child_s >= 3.0


def test_a_measurement_child_draws_on_what_is_left_of_the_budget():
    """The children's time counts too: a child is stopped when the budget is spent, and the
    compile's next run then does not start."""
    budget = RunBudget(2.0)
    measurer = OrtMeasurer(runs=2, budget=budget)
    with pytest.raises(RunBudgetExhausted, match=r"left of the compile's run budget of 2 s"):
        measurer.time([("loop", loop_forever_model().SerializeToString(), SessionProfile())], FEEDS)
    assert budget.child_s >= 2.0
    sess = make_session(loop_model(10), budget=budget)
    with pytest.raises(RunBudgetExhausted, match=r"measurement children [0-9.]+ s"):
        sess.run(FEEDS)
    assert budget.runs == 0


def test_a_target_s_in_process_check_draws_on_the_budget():
    """``OrtMeasurer.outputs`` (a GPU target's on-target check) ran without any bound."""
    budget = RunBudget(0.5)
    measurer = OrtMeasurer(budget=budget, run_timeout_s=30)
    started = time.monotonic()
    with pytest.raises(RunBudgetExhausted, match=r"run budget of 0\.5 s is spent: 1 run"):
        measurer.outputs(loop_forever_model().SerializeToString(), SessionProfile(), [FEEDS])
    assert time.monotonic() - started < 15
    honest = OrtMeasurer(budget=RunBudget(60), run_timeout_s=30)
    (out,) = honest.outputs(loop_model(3).SerializeToString(), SessionProfile(), [FEEDS])
    np.testing.assert_array_equal(out[0], np.full((1, 4), 3.0, np.float32))


class _SpentOnSecondCheck(StandInMeasurer):
    """A GPU stand-in whose second on-target check finds the budget spent (the first is the
    FP16 candidate's, the second an FP16 variant's, in ``_checked_on_target``)."""

    def __init__(self) -> None:
        super().__init__(
            {"baseline": 2.0, "fp16": 1.0}, provider="CUDAExecutionProvider", int8_accelerated=False
        )
        self.checks = 0

    def outputs(self, model, profile, feeds):
        self.checks += 1
        if self.checks >= 2:
            raise RunBudget(1.0).exhausted()
        return super().outputs(model, profile, feeds)


def test_a_budget_spent_in_an_fp16_variant_s_on_target_check_ends_the_compile(tiny_bert):
    """The variants' on-target check caught every exception and dropped the variant."""
    policy = PrecisionPolicy(
        priority_order=[Precision.FP16, Precision.FP32], target="cuda", calibration_samples=2
    )
    measurer = _SpentOnSecondCheck()
    with pytest.raises(RunBudgetExhausted):
        compile_model(tiny_bert, policy, measurer, run_timeout_s=60)
    assert measurer.checks == 2


def test_the_run_budget_setting_is_validated_and_outlasts_one_run():
    with pytest.raises(ValueError, match="compile_run_budget_s must be > 0"):
        GraphCompilerSettings(compile_run_budget_s=0)
    settings = GraphCompilerSettings()
    # BERT-base's default compile drew 193 s on a loaded 2-core host (docs, "Bounds")
    assert settings.compile_run_budget_s > settings.run_timeout_s
