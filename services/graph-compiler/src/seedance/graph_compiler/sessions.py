"""ONNX Runtime sessions in this process: the ``SessionFactory`` the compiler's core is handed.

Owns the session options of the core's in-process runs (CPU provider, optimisation level,
thread count, quiet logging), the wrapping of ORT's load errors into ``InvalidModel``, whose
text the core reads to tell a missing kernel from a broken graph, and the bound on each run:
a run still going after ``run_timeout_s`` is stopped through ``RunOptions.terminate`` (ORT
checks the flag between kernels and between a ``Loop``'s iterations) and raises
``ModelRunTimeout``. Must not time anything
(``measuring`` does, in a child process) or choose anything: the core decides what to run.
``make_session``/``run`` and ``sample_inputs`` are here too for the benches, which run models
the way the core does.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from seedance.graph_compiler.core.errors import CompileOutOfMemory, InvalidModel, ModelRunTimeout
from seedance.graph_compiler.core.runtime import Feeds, sample_inputs

__all__ = ["Feeds", "OrtSession", "OrtSessions", "make_session", "run", "sample_inputs"]

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


class OrtSession:
    """An ``InferenceSession`` on the CPU provider as the core's ``Session``; each run is
    stopped after ``run_timeout_s`` (None: unbounded) with ``ModelRunTimeout``."""

    def __init__(self, session: ort.InferenceSession, run_timeout_s: float | None = None) -> None:
        self.session = session
        self._inputs = tuple(i.name for i in session.get_inputs())
        self._timeout_s = run_timeout_s

    @property
    def input_names(self) -> Sequence[str]:
        return self._inputs

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        if self._timeout_s is None:
            return [np.asarray(o) for o in self.session.run(None, dict(feeds))]
        options = ort.RunOptions()
        options.log_severity_level = 4  # the termination is answered below, not logged by ORT
        armed = _WATCHDOG.arm(options, self._timeout_s)
        try:
            outs = self.session.run(None, dict(feeds), options)
        except Exception as exc:  # ORT's Fail: "Exiting due to terminate flag being set"
            if armed.fired:
                raise ModelRunTimeout(
                    f"a run of the model took over {self._timeout_s:g} s and was stopped "
                    "(run_timeout_s)"
                ) from exc
            _raise_if_out_of_memory(exc)
            raise
        finally:
            armed.done.set()
        return [np.asarray(o) for o in outs]


def make_session(
    model: onnx.ModelProto | bytes | str,
    level: str = "disable",
    threads: int = 1,
    run_timeout_s: float | None = None,
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
    return OrtSession(sess, run_timeout_s)


def run(session: OrtSession, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    return session.run(feeds)


class OrtSessions:
    """The core's ``SessionFactory`` on ONNX Runtime's CPU provider; every run of its sessions
    is bounded by ``run_timeout_s`` (None: unbounded, for the benches)."""

    def __init__(self, run_timeout_s: float | None = None) -> None:
        self.run_timeout_s = run_timeout_s

    def session(
        self, model: onnx.ModelProto | bytes, level: str = "disable", threads: int = 1
    ) -> OrtSession:
        return make_session(model, level, threads, self.run_timeout_s)
