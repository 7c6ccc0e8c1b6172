"""ONNX Runtime sessions in this process: the ``SessionFactory`` the compiler's core is handed.

Owns the session options of the core's in-process runs (CPU provider, optimisation level,
thread count, quiet logging), the wrapping of ORT's load errors into ``InvalidModel``, whose
text the core reads to tell a missing kernel from a broken graph, and the bound on each run:
a run still going after ``run_timeout_s`` is stopped through ``RunOptions.terminate`` (ORT
checks the flag between kernels and between a ``Loop``'s iterations) and raises
``ModelRunTimeout``; and the bound on all of one compile's runs together (``RunBudget``: each
run's bound is the lesser of ``run_timeout_s`` and what is left of the budget, and a run the
budget stops raises ``RunBudgetExhausted``). Must not time anything
(``measuring`` does, in a child process) or choose anything: the core decides what to run.
``make_session``/``run`` and ``sample_inputs`` are here too for the benches, which run models
the way the core does.
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from seedance.graph_compiler.core.errors import (
    CompileOutOfMemory,
    InvalidModel,
    ModelRunTimeout,
    RunBudgetExhausted,
)
from seedance.graph_compiler.core.runtime import Feeds, sample_inputs

__all__ = [
    "Feeds",
    "OrtSession",
    "OrtSessions",
    "RunBudget",
    "make_session",
    "run",
    "sample_inputs",
]

_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


class _Armed:
    """One run under watch: ``done`` when it returned, ``fired`` once it was told to stop."""

    def __init__(self, options: ort.RunOptions, timeout_s: float) -> None:
        self.options, self.timeout_s = options, timeout_s
        self.done = threading.Event()
        self.fired = False


class _Watchdog:
    """One thread that sets ``terminate`` on the ``RunOptions`` of a run past its bound.

    One thread for the process rather than a timer per run: the FP16 emulator runs every node
    of a model as its own session, so a run can take microseconds and a thread start per run
    would cost more than the run. Runs are watched one after another, as the compile child
    makes them (one at a time); runs made at once from several threads would each still be
    stopped, the later ones after their bound plus the earlier ones' time."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Armed] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def arm(self, options: ort.RunOptions, timeout_s: float) -> _Armed:
        armed = _Armed(options, timeout_s)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="ort-run-watchdog", daemon=True
                )
                self._thread.start()
        self._queue.put(armed)
        return armed

    def _loop(self) -> None:
        while True:
            armed = self._queue.get()
            if not armed.done.wait(armed.timeout_s):
                armed.fired = True  # before the flag: a run it stops always sees ``fired``
                armed.options.terminate = True


_WATCHDOG = _Watchdog()

# ORT's words for an allocation that failed (its arena, or a std::bad_alloc it caught): under
# the compile child's RLIMIT_AS these are the model asking for more than the child may have.
_OOM_MARKERS = ("bad_alloc", "Failed to allocate memory")


def _raise_if_out_of_memory(exc: BaseException) -> None:
    if isinstance(exc, MemoryError) or any(m in str(exc) for m in _OOM_MARKERS):
        raise CompileOutOfMemory(
            f"the model needed more memory than the compiler may use: {str(exc)[:300]}"
        ) from exc


# The measurement children's bound once the compile's in-process runs are known: a child's
# start (interpreter, onnxruntime's import) and, per variant, its session's creation (on a GPU:
# cuDNN plans, CUDA-graph capture) and its runs at up to ``CHILD_RUN_FACTOR`` times the slowest
# in-process run of the model (a candidate may run slower than the reference; a GPU run is far
# faster than the CPU reference). The fixed parts are seconds for the bench's models.
CHILD_START_S = 60.0
VARIANT_LOAD_S = 30.0
CHILD_RUN_FACTOR = 5.0


class RunBudget:
    """What one compile's runs of a model may take together (``budget_s``; None: unbounded):
    its in-process runs (``charge``: wall time, ``time.perf_counter``) and its measurement
    children (``run_child``: a child's bound is the lesser of its cap, a time derived from the
    slowest in-process run, and what is left). One per compile: every session of the compile's
    ``OrtSessions`` and its ``OrtMeasurer`` draw on it, so a model tuned to run just under
    ``run_timeout_s`` cannot make dozens of such runs."""

    def __init__(self, budget_s: float | None = None) -> None:
        if budget_s is not None and not budget_s > 0:
            raise ValueError(f"a run budget must be > 0 s, got {budget_s!r}")
        self.budget_s = budget_s
        self.spent_s = 0.0  # in-process runs and measurement children together
        self.child_s = 0.0  # measurement children alone
        self.runs = 0
        self.slowest_s = 0.0

    def left_s(self) -> float | None:
        return None if self.budget_s is None else self.budget_s - self.spent_s

    def charge(self, took_s: float) -> None:
        self.spent_s += took_s
        self.runs += 1
        self.slowest_s = max(self.slowest_s, took_s)

    def derived_s(self, variants: int, runs_each: int) -> float | None:
        """What a measurement child of ``variants`` variants, ``runs_each`` runs each, may
        take by the slowest in-process run so far (None: no run yet)."""
        if self.slowest_s <= 0:
            return None
        return CHILD_START_S + variants * (
            VARIANT_LOAD_S + CHILD_RUN_FACTOR * self.slowest_s * runs_each
        )

    def run_child(
        self, what: str, variants: int, runs_each: int, cap_s: float, call: Callable[..., Any]
    ) -> Any:
        """``call(timeout_s=bound)`` (a measurement child, ``subprocess.TimeoutExpired`` past
        it), its wall time drawn from the budget; ``RunBudgetExhausted`` when stopped or when
        nothing is left before it starts."""
        left, derived = self.left_s(), self.derived_s(variants, runs_each)
        if left is not None and left <= 0:
            raise self.exhausted()
        bound = min(b for b in (cap_s, derived, left) if b is not None)
        started = time.perf_counter()
        try:
            return call(timeout_s=bound)
        except subprocess.TimeoutExpired as exc:
            raise RunBudgetExhausted(
                f"{what} in a measurement child took over {bound:.1f} s and was stopped: the "
                f"least of its cap ({cap_s:g} s), the bound derived from the model's slowest "
                f"in-process run ({self.slowest_s:.3f} s: {CHILD_START_S:g} s, and per variant "
                f"{VARIANT_LOAD_S:g} s and {CHILD_RUN_FACTOR:g} times that run for each of its "
                f"runs, {derived or 0:.1f} s) and what was left of the compile's run budget"
                + ("" if left is None else f" of {self.budget_s:g} s ({left:.1f} s)")
            ) from exc
        finally:
            took = time.perf_counter() - started
            self.spent_s += took
            self.child_s += took

    def exhausted(self) -> RunBudgetExhausted:
        return RunBudgetExhausted(
            f"the compile's run budget of {self.budget_s:g} s is spent: {self.runs} run(s) of "
            f"the model took {self.spent_s - self.child_s:.1f} s in the compile's process "
            f"(the slowest {self.slowest_s:.2f} s, each under run_timeout_s) and its "
            f"measurement children {self.child_s:.1f} s (compile_run_budget_s)"
        )


class OrtSession:
    """An ``InferenceSession`` on the CPU provider as the core's ``Session``; each run is
    stopped after ``run_timeout_s`` (None: unbounded) with ``ModelRunTimeout``, or earlier when
    what is left of ``budget`` is less, with ``RunBudgetExhausted``."""

    def __init__(
        self,
        session: ort.InferenceSession,
        run_timeout_s: float | None = None,
        budget: RunBudget | None = None,
    ) -> None:
        self.session = session
        self._inputs = tuple(i.name for i in session.get_inputs())
        self._timeout_s = run_timeout_s
        self._budget = budget if budget is not None else RunBudget()

    @property
    def input_names(self) -> Sequence[str]:
        return self._inputs

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        left = self._budget.left_s()
        if left is not None and left <= 0:
            raise self._budget.exhausted()  # spent by earlier runs: this one is not started
        by_budget = left is not None and (self._timeout_s is None or left < self._timeout_s)
        bound = left if by_budget else self._timeout_s
        options = armed = None
        if bound is not None:
            options = ort.RunOptions()
            options.log_severity_level = 4  # the termination is answered below, not logged
            armed = _WATCHDOG.arm(options, bound)
        started = time.perf_counter()
        try:
            outs = self.session.run(None, dict(feeds), options)
        except Exception as exc:  # ORT's Fail: "Exiting due to terminate flag being set"
            self._finished(armed, started)
            if armed is not None and armed.fired:
                if by_budget:
                    raise self._budget.exhausted() from exc
                raise ModelRunTimeout(
                    f"a run of the model took over {self._timeout_s:g} s and was stopped "
                    "(run_timeout_s)"
                ) from exc
            _raise_if_out_of_memory(exc)
            raise
        self._finished(armed, started)
        return [np.asarray(o) for o in outs]

    def _finished(self, armed: _Armed | None, started: float) -> None:
        if armed is not None:
            armed.done.set()
        self._budget.charge(time.perf_counter() - started)


def make_session(
    model: onnx.ModelProto | bytes | str,
    level: str = "disable",
    threads: int = 1,
    run_timeout_s: float | None = None,
    budget: RunBudget | None = None,
) -> OrtSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = _LEVELS[level]
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    try:
        sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/NotImplemented types
        _raise_if_out_of_memory(exc)
        raise InvalidModel(f"onnxruntime cannot load the model: {exc}") from exc
    return OrtSession(sess, run_timeout_s, budget)


def run(session: OrtSession, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    return session.run(feeds)


class OrtSessions:
    """The core's ``SessionFactory`` on ONNX Runtime's CPU provider; every run of its sessions
    is bounded by ``run_timeout_s`` and all of them together by ``budget`` (one compile's; None
    for either: unbounded, for the benches)."""

    def __init__(self, run_timeout_s: float | None = None, budget: RunBudget | None = None) -> None:
        self.run_timeout_s = run_timeout_s
        self.budget = budget if budget is not None else RunBudget()

    def session(
        self, model: onnx.ModelProto | bytes, level: str = "disable", threads: int = 1
    ) -> OrtSession:
        return make_session(model, level, threads, self.run_timeout_s, self.budget)
