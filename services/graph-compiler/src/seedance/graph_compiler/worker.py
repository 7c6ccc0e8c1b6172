"""What runs in the compile child process: compatibility check, compile, artifact to a file.

Owns the core's errors as the outcome's named error and the artifact written to its path (the
event mapping is ``mapping``'s). It runs in a separate process so a
CPU-heavy compile never blocks the service's event loop, and a crash or a timeout kills only
the child. It builds the measurer for the request's target (``OrtMeasurer`` on the target's
execution provider: candidates are timed where they will run) and reports which providers this
process has (``capability``), which the service announces on the bus. Must not touch the bus or
the object store: paths in, a picklable outcome out.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

from seedance.events.graph import CompileReport as ReportEvent
from seedance.graph_compiler.compiling import compile_model
from seedance.graph_compiler.core.compat import check_compatibility
from seedance.graph_compiler.core.errors import (
    CompileError,
    CompileOutOfMemory,
    IncompatibleModel,
    TargetUnavailable,
)
from seedance.graph_compiler.core.policy import PrecisionPolicy, Target
from seedance.graph_compiler.core.profile import CPU_EP, CUDA_EP
from seedance.graph_compiler.mapping import TARGETS, report_event
from seedance.graph_compiler.measuring import (
    OrtMeasurer,
    available_providers,
    describe_machine,
    provider_loads,
)
from seedance.graph_compiler.sessions import RunBudget

__all__ = [
    "PROVIDERS",
    "Capability",
    "Outcome",
    "capability",
    "compile_file",
    "needs_provider",
]

#: The execution provider each precision target is timed and served on.
PROVIDERS: dict[Target, str] = {Target.CPU: CPU_EP, Target.CUDA: CUDA_EP}


def needs_provider(target: str) -> str:
    """The execution provider a request's ``target`` must be compiled on (KeyError: unknown)."""
    return PROVIDERS[TARGETS[target][0]]


@dataclass(frozen=True)
class Capability:
    providers: tuple[str, ...]
    machine: str
    targets: tuple[str, ...]


def capability() -> Capability:
    """This process's execution providers (onnxruntime-gpu lists CUDA only where it loads) and
    the request targets it can therefore answer."""
    have = available_providers()
    if CUDA_EP in have and not provider_loads(CUDA_EP):
        # The GPU wheel lists CUDA even where no driver or CUDA libraries are (it then falls
        # back to the CPU silently): only a provider that loads a session is announced.
        have = [p for p in have if p != CUDA_EP]
    machine = describe_machine(CUDA_EP if CUDA_EP in have else CPU_EP).machine
    targets = tuple(t for t in TARGETS if needs_provider(t) in have)
    return Capability(providers=tuple(have), machine=machine, targets=targets)


@dataclass(frozen=True)
class Outcome:
    """A compile's result as the child reports it: a report and the artifact's digest, or a
    named error (the core error's class name) and its message."""

    report: ReportEvent | None = None
    artifact_sha256: str | None = None
    artifact_bytes: int = 0
    error_kind: str | None = None
    error: str | None = None


def compile_file(
    model_path: str,
    out_path: str,
    policy: PrecisionPolicy,
    target: str,
    select_runs: int = 20,
    run_timeout_s: float | None = None,
    max_nodes: int = 0,
    run_budget_s: float | None = None,
) -> Outcome:
    """Check, compile and write the artifact to ``out_path`` (only when the compile passed).
    Candidates are timed on the target's provider with ``select_runs`` runs each; each
    in-process run of a model is stopped after ``run_timeout_s`` (``ModelRunTimeout``), all of
    them together after ``run_budget_s`` (``RunBudgetExhausted``; the timing children are
    bounded by a time derived from the slowest of those runs); a model of more than
    ``max_nodes`` nodes (0: any) is refused by the compatibility check."""
    try:
        provider = needs_provider(target)
        budget = RunBudget(run_budget_s)
        try:
            measurer = OrtMeasurer(
                provider,
                runs=select_runs,
                threads=policy.measure_threads,
                budget=budget,
                run_timeout_s=run_timeout_s,
            )
        except ValueError as exc:
            raise TargetUnavailable(f"target {target}: {exc}") from exc
        compat = check_compatibility(model_path, replace(TARGETS[target][1], max_nodes=max_nodes))
        if not compat.ok:
            problems = tuple(p.message for p in compat.problems)
            raise IncompatibleModel(
                f"{len(problems)} problem(s) for target {target}: " + "; ".join(problems[:10]),
                problems,
            )
        result = compile_model(
            Path(model_path), policy, measurer, run_timeout_s=run_timeout_s, budget=budget
        )
    except MemoryError as exc:
        # The child's address-space bound (the service's compile_memory_mib), met by numpy or
        # the passes; the stack that held the memory is gone, so answering is safe.
        oom = CompileOutOfMemory(f"the compile needed more memory than it may use: {exc!r}")
        return Outcome(error_kind=type(oom).__name__, error=str(oom))
    except CompileError as exc:
        return Outcome(error_kind=type(exc).__name__, error=str(exc) or exc.reason)
    Path(out_path).write_bytes(result.model_bytes)
    return Outcome(
        report=report_event(result.report),
        artifact_sha256=hashlib.sha256(result.model_bytes).hexdigest(),
        artifact_bytes=len(result.model_bytes),
    )
