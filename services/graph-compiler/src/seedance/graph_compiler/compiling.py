"""``compile_model`` with ONNX Runtime plugged in: the compiler as the service and benches call it.

Owns the wiring of the core's injected runtime: ``OrtSessions`` for the reference runs, the
checks and the FP16 emulator, ``OrtQuantizer`` for the INT8 candidates. Must not decide
anything: ``core/compiler.py`` does, with whatever sessions and quantiser it is handed (tests
may call it with others).
"""

from __future__ import annotations

from pathlib import Path

import onnx

from seedance.graph_compiler.core import compiler
from seedance.graph_compiler.core.policy import PrecisionPolicy
from seedance.graph_compiler.core.report import CompileResult
from seedance.graph_compiler.core.selection import Measurer
from seedance.graph_compiler.quantizing import OrtQuantizer
from seedance.graph_compiler.sessions import OrtSessions, RunBudget

__all__ = ["compile_model"]


def compile_model(
    model: bytes | str | Path | onnx.ModelProto,
    policy: PrecisionPolicy | None = None,
    measurer: Measurer | None = None,
    *,
    run_timeout_s: float | None = None,
    budget: RunBudget | None = None,
) -> CompileResult:
    """Compile ``model`` under ``policy`` (defaults: INT8, then FP16, then FP32, CPU target),
    choosing among the accepted candidates by their time on ``measurer``'s provider; see
    ``seedance.graph_compiler.core.compiler.compile_model``. Each in-process run of a model
    is stopped after ``run_timeout_s`` with ``ModelRunTimeout``, and all of them together draw
    on ``budget`` (``RunBudgetExhausted`` once spent; shared with the measurer, which derives
    its children's bound from it). None: unbounded."""
    sessions = OrtSessions(run_timeout_s, budget if budget is not None else RunBudget())
    return compiler.compile_model(
        model, policy, measurer, sessions=sessions, quantizer=OrtQuantizer()
    )
