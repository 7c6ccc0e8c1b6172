"""The graph compiler's named errors: every compile either returns a checked artifact or raises one.

Owns the error hierarchy and whether each error is retryable (decided here, once). Must not
log, format reports or know about the bus; the service's adapter maps these to ack/term.
"""

from __future__ import annotations

__all__ = [
    "AccuracyCheckFailed",
    "CompileError",
    "CompileOutOfMemory",
    "IncompatibleModel",
    "InvalidModel",
    "ModelRunTimeout",
    "NoFasterCandidate",
    "RunBudgetExhausted",
    "TargetUnavailable",
    "UnsupportedOperator",
]


class CompileError(Exception):
    """Base of every compile failure. ``retryable`` is False for all of them: the same model and
    policy fail the same way again, so a request carrying them belongs in the dead-letter stream."""

    retryable: bool = False
    reason: str = "compile_error"


class InvalidModel(CompileError):
    """The bytes are not a loadable, valid ONNX model (parse, checker or ORT load failure)."""

    reason = "invalid_model"


class CompileOutOfMemory(CompileError):
    """The compile needed more memory than its process may have (the service's
    ``compile_memory_mib``): a graph of a few hundred bytes can ask for gigabytes
    (``ConstantOfShape`` of 2^28 floats)."""

    reason = "compile_out_of_memory"


class ModelRunTimeout(InvalidModel):
    """One run of the model (the FP32 reference, a candidate's check) took longer than the
    compiler's per-run bound and was stopped: a small graph can loop for ever (a ``Loop`` with a
    trip count of 2^62), and one compile holds its replica. An ``InvalidModel`` for callers
    that only tell valid from invalid."""

    reason = "model_run_timeout"


class RunBudgetExhausted(CompileError):
    """The compile's runs of the model together took longer than its budget: the in-process
    runs (the reference, every check, the FP16 emulator's) and the measurement children draw on
    one ``run_budget_s``, and a child is also bounded by a time derived from the model's slowest
    in-process run. Each run may stay under the per-run bound (``ModelRunTimeout``) while a
    compile makes dozens of them. Not an ``InvalidModel``: a candidate's failure drops that
    candidate, an exhausted budget ends the compile."""

    reason = "run_budget_exhausted"


class UnsupportedOperator(CompileError):
    """The model uses operators the target cannot run; ``nodes`` names each offending node."""

    reason = "unsupported_operator"

    def __init__(self, message: str, nodes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.nodes = nodes


class IncompatibleModel(CompileError):
    """The model fails the target's compatibility check (opset, input names/shapes, size)."""

    reason = "incompatible_model"

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems


class AccuracyCheckFailed(CompileError):
    """No candidate (not even the optimised FP32 graph) matched the reference within the policy."""

    reason = "accuracy_check_failed"


class TargetUnavailable(CompileError):
    """The compile needs an execution provider this process has not got (a ``cuda`` compile in a
    worker without the GPU provider, or no measurer to time candidates on it): no artifact is
    chosen for a target it was not timed on."""

    reason = "target_unavailable"


class NoFasterCandidate(CompileError):
    """Every candidate the policy allows ran slower than the FP32 baseline on the target, and
    the policy leaves FP32 out, so the baseline cannot be returned either."""

    reason = "no_faster_candidate"
