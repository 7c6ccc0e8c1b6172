"""The FP32 reference every candidate is held to, and loading a model with a named error.

Owns ``load`` (a model the injected runtime cannot load becomes ``UnsupportedOperator`` naming
the nodes when the runtime's message says a kernel is missing, ``InvalidModel`` otherwise),
``outputs`` (a model run on the calibration inputs) and ``Checker``: the reference outputs,
the classifier outputs whose top-1 must agree, and the comparison under the policy's bounds.
Must not build candidates or decide between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from seedance.graph_compiler.core.accuracy import Accuracy, compare_outputs
from seedance.graph_compiler.core.errors import InvalidModel, UnsupportedOperator
from seedance.graph_compiler.core.policy import PrecisionPolicy
from seedance.graph_compiler.core.runtime import Feeds, Session, SessionFactory

__all__ = ["Checker", "Outputs", "load", "outputs"]

#: A model's outputs on each of a list of feeds.
Outputs = list[list[np.ndarray]]

# ORT's load errors that mean "an operator has no kernel here", as opposed to a broken graph.
_UNSUPPORTED_MARKERS = (
    "NOT_IMPLEMENTED",
    "Could not find an implementation",
    "is not a registered function/op",
    "No Op registered",
)


def load(sessions: SessionFactory, model: onnx.ModelProto, level: str = "disable") -> Session:
    try:
        return sessions.session(model, level, threads=2)
    except InvalidModel as exc:
        text = str(exc)
        if any(marker in text for marker in _UNSUPPORTED_MARKERS):
            nodes = tuple(
                n.name or f"<unnamed {n.op_type}>"
                for n in model.graph.node
                if (n.name and n.name in text) or f"{n.op_type}(" in text
            )
            raise UnsupportedOperator(text, nodes) from exc
        raise


def outputs(
    sessions: SessionFactory, model: onnx.ModelProto, feeds: Sequence[Feeds], level: str
) -> Outputs:
    sess = load(sessions, model, level)
    return [sess.run(f) for f in feeds]


@dataclass(frozen=True, kw_only=True)
class Checker:
    """The unchanged model's outputs on the calibration inputs, and how a candidate's outputs
    are compared with them."""

    sessions: SessionFactory
    policy: PrecisionPolicy
    calib: Sequence[Feeds]
    reference: Outputs
    scores: frozenset[int]  # outputs whose top-1 must agree (a classifier's scores)

    def check(self, outs: Sequence[Sequence[np.ndarray]]) -> Accuracy:
        return compare_outputs(self.reference, outs, self.scores)

    def run(self, model: onnx.ModelProto, level: str) -> Outputs:
        """``model``'s outputs on the calibration inputs, in this process."""
        return outputs(self.sessions, model, self.calib, level)

    def passes(self, acc: Accuracy) -> bool:
        """Within the policy's FP16/FP32 bounds (min cosine and max abs error)."""
        return acc.passes(self.policy.min_cosine, self.policy.max_abs_err)
