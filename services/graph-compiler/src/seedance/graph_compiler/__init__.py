"""Seedance graph compiler: ONNX models made leaner and faster, with checked precision fallback.

The public surface the service's bus adapter wires up: ``compile_model`` (alias ``compile``)
takes model bytes or a path and a ``PrecisionPolicy`` and returns a ``CompileResult`` (the
artifact's bytes and a ``CompileReport``) or raises a ``CompileError`` subclass;
``check_compatibility`` reports a model's problems against a ``CompatTarget``. Candidates are
timed on the target through an injected ``Measurer`` (``measuring.OrtMeasurer`` on ONNX
Runtime), and the core runs models and quantises through injected sessions and a quantiser
(``sessions``, ``quantizing``; ``compiling`` wires them); ``deployment.load_session`` runs an
artifact under the profile it was chosen with.
"""

from seedance.graph_compiler.compiling import compile_model
from seedance.graph_compiler.core.accuracy import Accuracy
from seedance.graph_compiler.core.compat import (
    ORT_CPU,
    TRANSFORMER_GPU,
    CompatProblem,
    CompatReport,
    CompatTarget,
    check_compatibility,
)
from seedance.graph_compiler.core.errors import (
    AccuracyCheckFailed,
    CompileError,
    CompileOutOfMemory,
    IncompatibleModel,
    InvalidModel,
    ModelRunTimeout,
    NoFasterCandidate,
    RunBudgetExhausted,
    TargetUnavailable,
    UnsupportedOperator,
)
from seedance.graph_compiler.core.passes import PassResult
from seedance.graph_compiler.core.policy import Precision, PrecisionPolicy, Target
from seedance.graph_compiler.core.profile import SessionProfile, TargetInfo
from seedance.graph_compiler.core.report import (
    CandidateOutcome,
    CompileReport,
    CompileResult,
    FallbackNode,
    VariantMetrics,
)
from seedance.graph_compiler.core.selection import Measurer, TimingResult

compile = compile_model  # the name the issue uses; shadows the builtin only inside this package

__all__ = [
    "ORT_CPU",
    "TRANSFORMER_GPU",
    "Accuracy",
    "AccuracyCheckFailed",
    "CandidateOutcome",
    "CompatProblem",
    "CompatReport",
    "CompatTarget",
    "CompileError",
    "CompileOutOfMemory",
    "CompileReport",
    "CompileResult",
    "FallbackNode",
    "IncompatibleModel",
    "InvalidModel",
    "Measurer",
    "ModelRunTimeout",
    "NoFasterCandidate",
    "PassResult",
    "Precision",
    "PrecisionPolicy",
    "RunBudgetExhausted",
    "SessionProfile",
    "Target",
    "TargetInfo",
    "TargetUnavailable",
    "TimingResult",
    "UnsupportedOperator",
    "VariantMetrics",
    "check_compatibility",
    "compile",
    "compile_model",
]
