"""ONNX Runtime sessions in this process: the ``SessionFactory`` the compiler's core is handed.

Owns the session options of the core's in-process runs (CPU provider, optimisation level,
thread count, quiet logging) and the wrapping of ORT's load errors into ``InvalidModel``, whose
text the core reads to tell a missing kernel from a broken graph. Must not time anything
(``measuring`` does, in a child process) or choose anything: the core decides what to run.
``make_session``/``run`` and ``sample_inputs`` are here too for the benches, which run models
the way the core does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from seedance.graph_compiler.core.errors import InvalidModel
from seedance.graph_compiler.core.runtime import Feeds, sample_inputs

__all__ = ["Feeds", "OrtSession", "OrtSessions", "make_session", "run", "sample_inputs"]

_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


class OrtSession:
    """An ``InferenceSession`` on the CPU provider as the core's ``Session``."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self._inputs = tuple(i.name for i in session.get_inputs())

    @property
    def input_names(self) -> Sequence[str]:
        return self._inputs

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(o) for o in self.session.run(None, dict(feeds))]


def make_session(
    model: onnx.ModelProto | bytes | str, level: str = "disable", threads: int = 1
) -> OrtSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = _LEVELS[level]
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    try:
        return OrtSession(ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]))
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/NotImplemented types
        raise InvalidModel(f"onnxruntime cannot load the model: {exc}") from exc


def run(session: OrtSession, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    return session.run(feeds)


class OrtSessions:
    """The core's ``SessionFactory`` on ONNX Runtime's CPU provider."""

    def session(
        self, model: onnx.ModelProto | bytes, level: str = "disable", threads: int = 1
    ) -> OrtSession:
        return make_session(model, level, threads)
